// Package apitest holds admit's API to its OpenAPI document (internal/api/openapi.yaml) in the
// tests of every package that talks to the API. Handler wraps a server's handler and
// Transport a client's transport: every exchange through them is checked with kin-openapi's
// openapi3filter, and the test fails when
//
//   - a reply is not one the document describes (status, headers, every field), or
//   - the document and the API judge a request differently: the API answered it as a
//     well-formed request (2xx, 402, 409, 422, 429) and the document refuses it, or the API
//     refused it with 400 and the document accepts it, unless the 400 is one of the rules
//     OpenAPI cannot express (Inexpressible).
//
// Both get the document the way a client does, from GET /openapi.yaml.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// Inexpressible lists the 400s a request may get although the document accepts it, because
// OpenAPI 3.0 cannot state the rule behind them. An exception matches a reply's error code
// and, when Messages is not empty, one of these fragments of its message. Every other 400
// must answer a request the document refuses: that keeps the document's constraints as
// strict as the API's.
var Inexpressible = []struct {
	Code     string
	Messages []string
	Why      string
}{
	{"body_too_large", nil,
		"OpenAPI bounds values, not a body's bytes: white space alone can take a body past 64 KiB (1 MiB with an estimate)"},
	{"invalid_estimate", nil,
		"the model request inside an estimate is the providers' body, described by their documents, not this one"},
	{"invalid_json", []string{"data after the JSON object"},
		"the validator reads a body's first JSON value and ignores what follows"},
	{"invalid_units", []string{"whole number"},
		"a JSON Schema integer is a value, so 1.0 and 1e3 are integers to the document; the API wants them written as whole numbers within int64"},
	{"invalid_field", nil,
		"the same for the admin API's integer fields (burst, quota, concurrency, ...), which encoding/json will not read from 1.0"},
	{"unknown_tool", nil,
		"the priced tools are configuration (ADMIT_TOOL_CREDITS), not part of the API"},
	{"forbidden_target", nil,
		"whether a webhook URL may name a private, loopback or link-local address is configuration (WEBHOOK_ALLOW_PRIVATE)"},
	{"invalid_url", []string{"absolute http or https URL", "credentials"},
		"the document's pattern checks a webhook URL's scheme and host; Go's URL parser refuses more (bad escapes, ports, brackets)"},
	{"invalid_range", []string{"before to"}, "a replay's from must be before its to: OpenAPI bounds each field alone"},
	{"invalid_expiry", []string{"must be after effective_at", "is in the past"},
		"a grant's expiry is compared with its effect and with now: OpenAPI bounds each field alone"},
	{"invalid_amount", []string{"whole number"},
		"as for units: 1.0 and 1e3 are integers to the document, not whole numbers to the API"},
	{"invalid_priority", []string{"whole number"},
		"as for units: 1.0 and 1e3 are integers to the document, not whole numbers to the API"},
	{"invalid_event_id", []string{"was not issued by admit"},
		"an event id's shard must be its org's (a hash of the org) and below the deployment's shard count"},
	{"invalid_id", []string{"differs from the path"},
		"a PUT body's id must be the path's: OpenAPI cannot compare a body with a path"},
	{"invalid_kind", []string{"cannot change"}, "the stored account's kind is data, not syntax"},
	{"invalid_parent", []string{"does not exist", "cannot be under", "cannot move"},
		"which accounts exist, their kinds and parents are data"},
	{"invalid_plan", []string{"unknown plan"}, "which plans exist is data (seeded, written by the operator)"},
	{"invalid_limits", []string{"needs both", "needs limit", "at most 31 days", "go together", "give either",
		"are for token_bucket", "quota_period needs a quota", "neither a rate nor a quota",
		"a ceiling needs a token bucket", "ceiling must be at least the burst", "the time the bucket takes to fill"},
		"how a limit's fields combine is the store's check (docs/admission.md, \"Writing limits\"); the document bounds each field alone"},
	{"duplicate_key", nil,
		"JSON Schema sees an object after decoding, when a repeated key has kept one value: the API refuses the repetition"},
	{"unknown_account", nil, "which accounts exist is data: a webhook endpoint's account filter must name one"},
	{"invalid_max_wait", []string{"at most", "waiting is disabled"},
		"max_wait_ms's bound is configuration (ADMIT_MAX_WAIT); the document states only its greatest value"},
	{"invalid_max_wait", []string{"whole number"},
		"as for units: 1.0 and 1e3 are integers to the document, not whole numbers to the API"},
	{"invalid_limits", []string{"no parent to borrow from"},
		"a ceiling is refused on an org's limits, and a PUT does not repeat the stored account's kind"},
	{"invalid_rank", []string{"is plan"}, "which ranks other plans have is data"},
	{"invalid_range", []string{"to must be after from", "covers at most"},
		"a usage query's from must be before its to, within a span: OpenAPI bounds each field alone"},
	{"limit_exceeds_parent", nil,
		"a customer's limit is bounded by the limits of the levels above the account, which are data"},
	{"invalid_body", []string{"only limits and concurrency"},
		"a customer's PUT may repeat the path's id but change nothing else: OpenAPI cannot compare a body with a path"},
	{"invalid_price", []string{"would be the smallest"},
		"whether a plan would be the smallest (lowest rank) is data: the smallest plan must have a price"},
	{"invalid_price_effective_period", []string{"is closed", "applies from the start", "needs the month"},
		"which periods are closed and whether the plan has a price already are data"},
	{"invalid_price_units", []string{"starts at", "ends at", "has no end", "the last tier ends"},
		"that tiers run contiguously from included to no end compares items of an array, which OpenAPI 3.0 cannot"},
	{"invalid_price_units", []string{"whole number"},
		"as for units: 1.0 and 1e3 are integers to the document, not whole numbers to the API"},
	{"invalid_owner", []string{"exactly one of account and plan", "no such account or plan"},
		"that a rule names one owner, and which accounts and plans exist, are not the document's to state"},
	{"ambiguous_account", []string{"a check names its key"},
		"that the forward-auth check gets an API key or an account, not both, relates two headers, which OpenAPI 3.0 cannot"},
	{"invalid_account", []string{"the check's account header"},
		"the check's header names are configuration (ADMIT_CHECK_*_HEADER): the document describes the defaults"},
	{"invalid_period", []string{"only a quota_percent rule"}, "which periods a rule may watch depends on its kind"},
	{"invalid_thresholds", []string{"percentages must be from 1 to 100", "whole numbers"},
		"whether thresholds are percentages depends on the rule's kind; and, as for units, 1.0 is an integer to the document"},
	{"invalid_price_base_fee_minor", []string{"whole number"},
		"as for units: 1.0 and 1e3 are integers to the document, not whole numbers to the API"},
	{"invalid_billing_details", []string{"bytes, more than", "is not an address"},
		"the API bounds billing details in bytes, the document in characters (the same for ASCII); and an email must parse as one address (net/mail), which a pattern cannot state"},
	{"invalid_reason", []string{"bytes, more than"},
		"the API bounds a reason in bytes, the document in characters (the same for ASCII)"},
	{"invalid_amendment", []string{"more than one org or period", "amend them in parts"},
		"which org and period each event of an amendment is of, and how many events a filter matches, are data"},
}

// Unchecked lists the paths served beside the API that the document does not describe.
var Unchecked = map[string]string{
	"/healthz": "internal/ops liveness probe, plain text",
	"/readyz":  "internal/ops readiness probe",
	"/metrics": "Prometheus exposition",
}

// accepted are the statuses of a request the API read as well-formed: the document must
// accept it too.
func accepted(status int) bool {
	switch status {
	case http.StatusPaymentRequired, http.StatusConflict, http.StatusUnprocessableEntity, http.StatusTooManyRequests:
		return true
	}
	return status >= 200 && status < 300
}

// Contract is a parsed OpenAPI document, ready to check exchanges. It is safe for
// concurrent use.
type Contract struct {
	doc    *openapi3.T
	router routers.Router
	// unlisted answer paths and methods the document does not list (404 and 405).
	unlisted map[int]*openapi3.Operation
}

// Load parses and validates an OpenAPI document.
func Load(raw []byte) (*Contract, error) {
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		return nil, fmt.Errorf("load the openapi document: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("the openapi document is invalid: %w", err)
	}
	// The document names admit's default address; the tests' servers listen elsewhere, and
	// the router would match a request's host against it.
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("route the openapi document: %w", err)
	}
	c := &Contract{doc: doc, router: router, unlisted: map[int]*openapi3.Operation{}}
	for status, name := range map[int]string{http.StatusNotFound: "NotFound", http.StatusMethodNotAllowed: "MethodNotAllowed"} {
		ref := doc.Components.Responses[name]
		if ref == nil {
			return nil, fmt.Errorf("the openapi document has no components.responses.%s for unlisted routes", name)
		}
		c.unlisted[status] = &openapi3.Operation{Responses: openapi3.NewResponses(openapi3.WithStatus(status, ref))}
	}
	return c, nil
}

var (
	cacheMu sync.Mutex
	cache   = map[string]*Contract{}
)

// cached parses each distinct document once per test binary, and checks the reply that
// served it (GET /openapi.yaml, whose status, content type and body it describes too).
func cached(served *http.Response, raw []byte) (*Contract, error) {
	cacheMu.Lock()
	defer cacheMu.Unlock()
	if c, ok := cache[string(raw)]; ok {
		return c, nil
	}
	c, err := Load(raw)
	if err != nil {
		return nil, err
	}
	err = c.Check(Exchange{Request: served.Request, Status: served.StatusCode, Header: served.Header, Body: raw})
	if err != nil {
		return nil, err
	}
	cache[string(raw)] = c
	return c, nil
}

// Exchange is one request and the reply it got.
type Exchange struct {
	Request     *http.Request // its Body is not read: RequestBody is
	RequestBody []byte
	Status      int
	Header      http.Header
	Body        []byte
}

var options = &openapi3filter.Options{
	IncludeResponseStatus: true, // a status the document does not list is a mismatch
	MultiError:            true,
	AuthenticationFunc:    bearer,
	// The reason and the JSON pointer are enough; Check prints the body itself.
	SchemaValidationOptions: []openapi3.SchemaValidationOption{openapi3.DisableSchemaErrorDetails()},
}

// bearer is the document's security as far as a document can see it: an Authorization
// header with a bearer token, or the header of an apiKey scheme (the forward-auth check's
// token). Which token opens which endpoint is the server's to say (401 and 403 are not
// judged on the request).
func bearer(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if s := in.SecurityScheme; s.Type == "apiKey" && s.In == "header" { // the forward-auth check's token
		if strings.TrimSpace(in.RequestValidationInput.Request.Header.Get(s.Name)) == "" {
			return in.NewError(fmt.Errorf("no %s header", s.Name))
		}
		return nil
	}
	if in.SecurityScheme.Type != "http" || !strings.EqualFold(in.SecurityScheme.Scheme, "bearer") {
		return in.NewError(fmt.Errorf("security scheme %q is not http bearer", in.SecuritySchemeName))
	}
	scheme, token, _ := strings.Cut(in.RequestValidationInput.Request.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return in.NewError(errors.New("no bearer token"))
	}
	return nil
}

// Check returns every way ex departs from the document, each naming the route, the status
// and the validator's error; nil if none.
func (c *Contract) Check(ex Exchange) error {
	r := ex.Request
	if _, ok := Unchecked[r.URL.Path]; ok {
		return nil
	}
	what := fmt.Sprintf("%s %s → %d", r.Method, r.URL.RequestURI(), ex.Status)
	ctx := context.Background()

	// A copy the validator may read. The server reads a body as JSON whatever its
	// Content-Type says (the document says so), and so does the check.
	req := r.Clone(ctx)
	req.Body = io.NopCloser(bytes.NewReader(ex.RequestBody))
	req.ContentLength = int64(len(ex.RequestBody))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(ex.RequestBody)), nil }
	if len(ex.RequestBody) > 0 {
		req.Header.Set("Content-Type", "application/json")
	}

	in := &openapi3filter.RequestValidationInput{Request: req, Options: options}
	var reqErr error
	route, params, err := c.router.FindRoute(req)
	switch {
	case errors.Is(err, routers.ErrPathNotFound):
		in.Route = &routers.Route{Spec: c.doc, Path: r.URL.Path, Method: r.Method, Operation: c.unlisted[http.StatusNotFound]}
		what += " (no such path in the document)"
	case errors.Is(err, routers.ErrMethodNotAllowed):
		in.Route = &routers.Route{Spec: c.doc, Path: r.URL.Path, Method: r.Method, Operation: c.unlisted[http.StatusMethodNotAllowed]}
		what += " (no such method in the document)"
	case err != nil:
		return fmt.Errorf("%s: routing against the document: %w", what, err)
	default:
		in.Route, in.PathParams = route, params
		what = fmt.Sprintf("%s (%s %s)", what, route.Method, route.Path)
		reqErr = openapi3filter.ValidateRequest(ctx, in)
	}

	var errs []error
	respErr := openapi3filter.ValidateResponse(ctx, &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: ex.Status, Header: ex.Header,
		Body: io.NopCloser(bytes.NewReader(ex.Body)), Options: options,
	})
	if respErr != nil {
		errs = append(errs, fmt.Errorf("%s: the reply is not the document's: %w\n  reply: %s %s",
			what, respErr, ex.Header.Get("Content-Type"), clip(ex.Body)))
	}
	if route != nil { // a route the document lists: judge the request too
		switch {
		case accepted(ex.Status) && reqErr != nil:
			errs = append(errs, fmt.Errorf("%s: the API took a request the document refuses: %w\n  request: %s",
				what, reqErr, clip(ex.RequestBody)))
		case ex.Status == http.StatusBadRequest && reqErr == nil:
			if code, msg := errorOf(ex.Body); !inexpressible(code, msg) {
				errs = append(errs, fmt.Errorf("%s: the API refused (%s: %s) a request the document accepts; "+
					"tighten the document, or list the rule in apitest.Inexpressible if OpenAPI cannot state it\n  request: %s",
					what, code, msg, clip(ex.RequestBody)))
			}
		}
	}
	return errors.Join(errs...)
}

func inexpressible(code, msg string) bool {
	for _, e := range Inexpressible {
		if e.Code != code {
			continue
		}
		if len(e.Messages) == 0 {
			return true
		}
		for _, m := range e.Messages {
			if strings.Contains(msg, m) {
				return true
			}
		}
	}
	return false
}

// errorOf reads the code and message of a JSON error reply.
func errorOf(body []byte) (code, msg string) {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	return e.Error.Code, e.Error.Message
}

func clip(b []byte) string {
	const n = 600
	if len(b) > n {
		return fmt.Sprintf("%q… (%d bytes)", b[:n], len(b))
	}
	return fmt.Sprintf("%q", b)
}

// shown is how many mismatches a test prints in full; more are counted.
const shown = 10

// reporter fails a test with the mismatches its exchanges had.
type reporter struct {
	t  testing.TB
	mu sync.Mutex
	n  int
}

func newReporter(t testing.TB) *reporter {
	r := &reporter{t: t}
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.n > shown {
			t.Errorf("apitest: %d more exchanges departed from the document", r.n-shown)
		}
	})
	return r
}

func (r *reporter) report(err error) {
	r.mu.Lock()
	r.n++
	n := r.n
	r.mu.Unlock()
	if n <= shown {
		r.t.Errorf("apitest: %v", err)
	} else {
		r.t.Fail()
	}
}

// Handler serves h and checks every exchange with it against the document h serves at
// GET /openapi.yaml: a mismatch fails t (before the reply is sent, so the test that made
// the request is still running). A reply to a caller that hung up is not checked: no one
// sees it.
func Handler(t testing.TB, h http.Handler) http.Handler {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil)
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("apitest: GET /openapi.yaml answered %d: %s", rec.Code, clip(rec.Body.Bytes()))
	}
	served := rec.Result()
	served.Request = req
	c, err := cached(served, rec.Body.Bytes())
	if err != nil {
		t.Fatalf("apitest: %v", err)
	}
	rep := newReporter(t)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil { // the caller went away while sending
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		out := httptest.NewRecorder()
		h.ServeHTTP(out, r)
		if r.Context().Err() == nil {
			if err := c.Check(Exchange{Request: r, RequestBody: body, Status: out.Code, Header: out.Header(), Body: out.Body.Bytes()}); err != nil {
				rep.report(err)
			}
		}
		for k, v := range out.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(out.Code)
		_, _ = w.Write(out.Body.Bytes())
	})
}

// Transport returns a RoundTripper over next (http.DefaultTransport when nil) that checks
// every exchange against the document served at baseURL + "/openapi.yaml".
func Transport(t testing.TB, baseURL string, next http.RoundTripper) http.RoundTripper {
	t.Helper()
	if next == nil {
		next = http.DefaultTransport
	}
	resp, err := (&http.Client{Transport: next}).Get(strings.TrimSuffix(baseURL, "/") + "/openapi.yaml")
	if err != nil {
		t.Fatalf("apitest: get the openapi document: %v", err)
	}
	raw, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("apitest: GET %s/openapi.yaml answered %d (%v): %s", baseURL, resp.StatusCode, err, clip(raw))
	}
	c, err := cached(resp, raw)
	if err != nil {
		t.Fatalf("apitest: %v", err)
	}
	return &transport{rep: newReporter(t), c: c, next: next}
}

type transport struct {
	rep  *reporter
	c    *Contract
	next http.RoundTripper
}

func (tr *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		var err error
		body, err = io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("apitest: read the request body: %w", err)
		}
	}
	out := r.Clone(r.Context())
	if r.Body != nil {
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	resp, err := tr.next.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	reply, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("apitest: read the reply: %w", err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(reply))
	if err := tr.c.Check(Exchange{Request: r, RequestBody: body, Status: resp.StatusCode, Header: resp.Header, Body: reply}); err != nil {
		tr.rep.report(err)
	}
	return resp, nil
}
