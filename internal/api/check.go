package api

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/metergate/metergate/internal/gate"
	"github.com/metergate/metergate/internal/policy"
)

// CheckHeaders names the request headers of the forward-auth check (GET /v1/check and any
// other method, docs/gateways.md): the gateway copies the client's request headers onto
// its subrequest and adds the service token.
type CheckHeaders struct {
	// Token carries the service token (ADMIT_CHECK_TOKEN_HEADER). Not Authorization by
	// default: nginx and Caddy forward the client's own Authorization header. Set to
	// Authorization, it takes "Bearer <token>" like every other service route.
	Token string
	// APIKey carries the end customer's API key (ADMIT_CHECK_API_KEY_HEADER).
	APIKey string
	// Account names the account of a gateway that authenticates clients itself
	// (ADMIT_CHECK_ACCOUNT_HEADER); empty by default, so a client cannot name an account:
	// set it only when the gateway overwrites the header on every subrequest.
	Account string
	// Tokens carries the request's estimated tokens (ADMIT_CHECK_TOKENS_HEADER).
	Tokens string
	// Tool names the tool called, priced in credits (ADMIT_CHECK_TOOL_HEADER).
	Tool string
	// IdempotencyKey makes a retried request count once (ADMIT_CHECK_IDEMPOTENCY_HEADER).
	IdempotencyKey string
}

// DefaultCheckHeaders are the header names the check reads unless configured otherwise.
var DefaultCheckHeaders = CheckHeaders{ //nolint:gosec // G101: header names, not credentials
	Token: "X-Metergate-Token", APIKey: "X-Api-Key", Tokens: "X-Estimated-Tokens",
	Tool: "X-Tool", IdempotencyKey: "Idempotency-Key",
}

// The headers of the check's answer beside admit's RateLimit fields and Retry-After.
const (
	// EventIDHeader is the admitted event's id on a 200: the upstream reports the outcome
	// with it (POST /v1/outcomes).
	EventIDHeader = "X-Metergate-Event-Id"
	// AccountHeader is the account charged, on a 200.
	AccountHeader = "X-Metergate-Account"
	// ReplyHeader repeats the JSON body of a refusal (compact, one line) for gateways that
	// cannot pass an auth reply's body to the client (nginx's auth_request).
	ReplyHeader = "X-Metergate-Reply"
)

// checkRequest reads the check's input from the original request's headers into the input
// of POST /v1/admit: the same validation, the same codes.
func (s *Server) checkRequest(h http.Header) (admitInput, *Error) {
	names := s.cfg.Check
	in := admitInput{APIKey: h.Get(names.APIKey), IdempotencyKey: h.Get(names.IdempotencyKey), Tool: h.Get(names.Tool)}
	if names.Account != "" {
		in.Account = h.Get(names.Account)
	}
	switch {
	case in.APIKey == "" && in.Account == "":
		return in, &Error{Status: http.StatusUnauthorized, Code: "missing_api_key", Message: "the " + names.APIKey + " header is required"}
	case in.APIKey != "" && in.Account != "":
		return in, badRequest("ambiguous_account", "a check names its key (%s) or its account (%s), not both", names.APIKey, names.Account)
	case in.Account != "" && !policy.ValidID(in.Account):
		return in, badRequest("invalid_account", "the check's account header %s must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit", names.Account)
	case len(in.APIKey) > 256:
		return in, &Error{Status: http.StatusUnauthorized, Code: "unknown_api_key", Message: "the API key is not known"}
	}
	if e := validIdempotencyKey(in.IdempotencyKey); e != nil {
		return in, e
	}
	in.Units = map[policy.Unit]int64{policy.Requests: 1}
	if raw := h.Get(names.Tokens); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 64)
		if errors.Is(err, strconv.ErrRange) || err == nil && n > policy.MaxAmount {
			return in, unitsTooLarge(names.Tokens)
		}
		if err != nil || n < 0 {
			return in, badRequest("invalid_units", "%s must be a whole number of tokens, 0 or more, got %.40q", names.Tokens, raw)
		}
		in.Units[policy.Tokens] = n
	}
	if in.Tool != "" {
		cost, ok := s.cfg.Tools[in.Tool]
		if !ok {
			return in, badRequest("unknown_tool", "unknown tool %q", in.Tool)
		}
		in.Units[policy.Credits] = cost
	}
	return in, nil
}

// check answers the forward-auth subrequest of a gateway: the gate's decision, taken from
// the original request's headers, as a Gateway door (a replayed idempotency key is refused,
// never passed). A 200 allows the request and names its event (EventIDHeader); every
// refusal is admit's, with its JSON body (also in ReplyHeader), RateLimit fields and
// Retry-After, which the gateway passes to the client.
func (s *Server) check(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	in, e := s.checkRequest(r.Header)
	if e != nil {
		s.gate.Rejected(e.Code)
		writeCheck(w, e.Status, map[string]*Error{"error": e})
		return
	}
	a, err := s.gate.Admit(r.Context(), in.gate(gate.Gateway, 0, "check"))
	if err != nil {
		e, ok := refusal(h, err)
		if !ok {
			panic(http.ErrAbortHandler) // the gateway left: nobody is answered (writeRefusal)
		}
		writeCheck(w, e.Status, map[string]*Error{"error": e})
		return
	}
	status, reply := s.reply(h, s.shown(a), nil)
	if status == http.StatusOK {
		h.Set(EventIDHeader, reply.EventID)
		h.Set(AccountHeader, reply.Account)
	}
	writeCheck(w, status, reply)
}

// writeCheck answers the check with v as JSON; a refusal repeats its body in ReplyHeader,
// for gateways that cannot pass an auth reply's body to the client (nginx's auth_request).
func writeCheck(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"internal error"}}`)
	}
	if status != http.StatusOK {
		w.Header().Set(ReplyHeader, string(body))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n')) // a failed write means the gateway left
}

// checkService is service (the service token, loaded policies) with the token read from
// the configured header, by default not Authorization.
func (s *Server) checkService(h http.HandlerFunc) http.HandlerFunc {
	name := s.cfg.Check.Token
	if strings.EqualFold(name, "Authorization") {
		return s.service(h)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get(name))
		if s.cfg.ServiceToken == "" || subtle.ConstantTimeCompare(got, []byte(s.cfg.ServiceToken)) != 1 {
			code := http.StatusUnauthorized
			if s.cfg.AdminToken != "" && subtle.ConstantTimeCompare(got, []byte(s.cfg.AdminToken)) == 1 {
				code = http.StatusForbidden // the admin token does not take decisions
			}
			writeError(w, authError(code, "a valid service token is required ("+name+": <token>)"))
			return
		}
		if !s.cfg.Policies.Loaded() { // as service: a node that has just started retries shortly
			w.Header().Set("Retry-After", "1")
			writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "policies_loading",
				Message: "this node has not loaded the policies yet; retry later"})
			return
		}
		h(w, r)
	}
}

// withDefaults fills the names left empty with DefaultCheckHeaders'.
func (h CheckHeaders) withDefaults() CheckHeaders {
	d := DefaultCheckHeaders
	if h.Token == "" {
		h.Token = d.Token
	}
	if h.APIKey == "" {
		h.APIKey = d.APIKey
	}
	if h.Tokens == "" {
		h.Tokens = d.Tokens
	}
	if h.Tool == "" {
		h.Tool = d.Tool
	}
	if h.IdempotencyKey == "" {
		h.IdempotencyKey = d.IdempotencyKey
	}
	return h
}
