package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/client"
)

const serviceToken = "svc-token-0123456789abcdef"

// The RateLimit fields the fake admit writes, one pair per kind of decision.
const (
	allowPolicy = `"a-tokens";q=100;w=60`
	allowState  = `"a-tokens";r=90;t=6`
	quotaPolicy = `"org-1-tokens-quota";q=1000;w=2592000`
	quotaState  = `"org-1-tokens-quota";r=0;t=86400`
)

// step is one scripted reply of the fake admit.
type step struct {
	status       int               // 200 allow, 429 rate_limited, 402 quota_exceeded, else an error
	retryAfterMS int64             // for 429
	code         string            // error code, for other statuses
	raw          string            // when set, the body verbatim (e.g. a proxy's HTML page)
	header       map[string]string // extra reply fields
	replayed     bool              // for 200: a replay of an idempotency key
}

func allow() step                  { return step{status: http.StatusOK} }
func replayed() step               { return step{status: http.StatusOK, replayed: true} }
func rateLimited(ms int64) step    { return step{status: http.StatusTooManyRequests, retryAfterMS: ms} }
func quotaExceeded() step          { return step{status: http.StatusPaymentRequired} }
func failure(s int, c string) step { return step{status: s, code: c} }

func (s step) with(k, v string) step {
	h := map[string]string{k: v}
	for k2, v2 := range s.header {
		h[k2] = v2
	}
	s.header = h
	return s
}

// admitCall is one POST /v1/admit the fake received, and what it answered.
type admitCall struct {
	Auth        string
	ContentType string
	Request     client.Request
	MaxWaitMS   *int64 // the body's max_wait_ms, when sent
	Status      int
	EventID     string // issued when allowed
	Reply       []byte
}

// outcomeCall is one POST /v1/outcomes the fake received.
type outcomeCall struct {
	EventID string
	Status  int
	Units   map[string]int64
}

// fakeAdmit speaks admit's HTTP API: service token, strict JSON bodies, decisions with
// RateLimit fields and Retry-After, outcomes for issued event ids only. Its admit replies
// follow a script (allow once the script is used up); it records every call.
type fakeAdmit struct {
	srv *httptest.Server

	mu          sync.Mutex
	script      []step
	outcomeStep *step // reply to outcomes; nil accepts
	issued      map[string]bool
	admits      []admitCall
	outcomes    []outcomeCall
}

func newFakeAdmit(t *testing.T, script ...step) *fakeAdmit {
	t.Helper()
	f := &fakeAdmit{script: script, issued: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/admit", f.admit)
	mux.HandleFunc("POST /v1/outcomes", f.outcome)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAdmit) URL() string { return f.srv.URL }

func (f *fakeAdmit) failOutcomes(s step) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.outcomeStep = &s
}

func (f *fakeAdmit) Admits() []admitCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]admitCall(nil), f.admits...)
}

func (f *fakeAdmit) Outcomes() []outcomeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]outcomeCall(nil), f.outcomes...)
}

// waitOutcomes polls until n outcomes were reported (they are sent in the background).
func (f *fakeAdmit) waitOutcomes(t *testing.T, n int) []outcomeCall {
	t.Helper()
	require.Eventually(t, func() bool { return len(f.Outcomes()) >= n }, 5*time.Second, 2*time.Millisecond,
		"expected %d outcomes to be reported", n)
	got := f.Outcomes()
	require.Len(t, got, n)
	return got
}

func writeJSON(w http.ResponseWriter, status int, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
	return b
}

func writeError(w http.ResponseWriter, status int, code, msg string) []byte {
	type apiErr struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	return writeJSON(w, status, map[string]apiErr{"error": {Code: code, Message: msg}})
}

func authorized(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+serviceToken }

func decodeStrict(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func (f *fakeAdmit) admit(w http.ResponseWriter, r *http.Request) {
	call := admitCall{Auth: r.Header.Get("Authorization"), ContentType: r.Header.Get("Content-Type")}
	defer func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.admits = append(f.admits, call)
	}()
	if !authorized(r) {
		call.Status = http.StatusUnauthorized
		call.Reply = writeError(w, call.Status, "unauthorized", "a valid service token is required (Authorization: Bearer …)")
		return
	}
	var body struct {
		client.Request
		MaxWaitMS *int64 `json:"max_wait_ms"`
	}
	err := decodeStrict(r.Body, &body)
	call.Request, call.MaxWaitMS = body.Request, body.MaxWaitMS
	if err != nil {
		call.Status = http.StatusBadRequest
		call.Reply = writeError(w, call.Status, "invalid_json", err.Error())
		return
	}
	if (call.Request.APIKey == "") == (call.Request.Account == "") {
		call.Status = http.StatusBadRequest
		call.Reply = writeError(w, call.Status, "missing_credentials", "give api_key or account")
		return
	}

	f.mu.Lock()
	s := allow()
	if len(f.script) > 0 {
		s, f.script = f.script[0], f.script[1:]
	}
	if s.status == http.StatusOK {
		call.EventID = fmt.Sprintf("ev-%04d", len(f.issued)+1)
		f.issued[call.EventID] = true
	}
	f.mu.Unlock()

	for k, v := range s.header {
		w.Header().Set(k, v)
	}
	call.Status = s.status
	type blocker struct {
		Account string `json:"account"`
		Level   string `json:"level"`
		Unit    string `json:"unit"`
	}
	type decision struct {
		Decision     string   `json:"decision"`
		EventID      string   `json:"event_id,omitempty"`
		Account      string   `json:"account"`
		Org          string   `json:"org"`
		Period       string   `json:"period,omitempty"`
		BlockedBy    *blocker `json:"blocked_by,omitempty"`
		RetryAfterMS *int64   `json:"retry_after_ms,omitempty"`
		Replayed     bool     `json:"replayed,omitempty"`
	}
	account := call.Request.Account
	if account == "" {
		account = "a"
	}
	switch {
	case s.raw != "":
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(s.status)
		_, _ = io.WriteString(w, s.raw)
		call.Reply = []byte(s.raw)
	case s.status == http.StatusOK:
		w.Header().Set("RateLimit-Policy", allowPolicy)
		w.Header().Set("RateLimit", allowState)
		call.Reply = writeJSON(w, s.status, decision{Decision: "allow", EventID: call.EventID, Account: account, Org: "org-1", Period: "2026-11",
			Replayed: s.replayed})
	case s.status == http.StatusTooManyRequests:
		w.Header().Set("RateLimit-Policy", allowPolicy)
		secs := max(1, (s.retryAfterMS+999)/1000)
		w.Header().Set("RateLimit", fmt.Sprintf(`"a-tokens";r=0;t=%d`, secs))
		if s.retryAfterMS >= 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		}
		ms := s.retryAfterMS
		call.Reply = writeJSON(w, s.status, decision{Decision: "rate_limited", Account: account, Org: "org-1",
			BlockedBy: &blocker{Account: "a", Level: "agent", Unit: "tokens"}, RetryAfterMS: &ms})
	case s.status == http.StatusPaymentRequired:
		w.Header().Set("RateLimit-Policy", quotaPolicy)
		w.Header().Set("RateLimit", quotaState)
		call.Reply = writeJSON(w, s.status, decision{Decision: "quota_exceeded", Account: account, Org: "org-1", Period: "2026-11",
			BlockedBy: &blocker{Account: "org-1", Level: "org", Unit: "tokens"}})
	default:
		call.Reply = writeError(w, s.status, s.code, "scripted "+s.code)
	}
}

func (f *fakeAdmit) outcome(w http.ResponseWriter, r *http.Request) {
	if !authorized(r) {
		writeError(w, http.StatusUnauthorized, "unauthorized", "a valid service token is required (Authorization: Bearer …)")
		return
	}
	var body struct {
		EventID string           `json:"event_id"`
		Status  int              `json:"status"`
		Units   map[string]int64 `json:"units"`
	}
	if err := decodeStrict(r.Body, &body); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", err.Error())
		return
	}
	f.mu.Lock()
	f.outcomes = append(f.outcomes, outcomeCall(body))
	known, fail := f.issued[body.EventID], f.outcomeStep
	f.mu.Unlock()
	switch {
	case !known:
		writeError(w, http.StatusBadRequest, "invalid_event_id", fmt.Sprintf("event_id %q was not issued by admit", body.EventID))
	case fail != nil:
		for k, v := range fail.header {
			w.Header().Set(k, v)
		}
		writeError(w, fail.status, fail.code, "scripted "+fail.code)
	default:
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "accepted", "event_id": body.EventID})
	}
}

type testBundle struct {
	fake   *fakeAdmit
	client *client.Client
	logs   *testenv.SyncBuffer
	served atomic.Int32 // calls of the wrapped handler
}

func setup(t *testing.T, script ...step) *testBundle {
	t.Helper()
	b := &testBundle{fake: newFakeAdmit(t, script...), logs: &testenv.SyncBuffer{}}
	b.client = &client.Client{
		BaseURL: b.fake.URL() + "/", // the trailing slash must not make "//v1/admit"
		Token:   serviceToken,
		HTTP: &http.Client{
			Transport: b.fake.srv.Client().Transport,
			// ServeMux answers an unclean path ("//v1/admit") with a redirect; refusing
			// redirects makes such a path fail the test instead of being papered over.
			CheckRedirect: func(*http.Request, []*http.Request) error { return errors.New("admit must not redirect") },
		},
		Log: slog.New(slog.NewTextHandler(b.logs, nil)),
	}
	return b
}

// identifyByHeader admits the caller's X-Api-Key for 10 tokens.
func identifyByHeader(r *http.Request) (client.Request, error) {
	key := r.Header.Get("X-Api-Key")
	if key == "" {
		return client.Request{}, errors.New("missing X-Api-Key")
	}
	return client.Request{APIKey: key, Units: map[string]int64{"tokens": 10}, Tool: "search"}, nil
}

// handler counts its calls, then runs fn (which may be nil: write nothing).
func (b *testBundle) handler(fn func(http.ResponseWriter, *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.served.Add(1)
		if fn != nil {
			fn(w, r)
		}
	})
}

func (b *testBundle) serve(failOpen bool, fn func(http.ResponseWriter, *http.Request), req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	b.client.Middleware(identifyByHeader, failOpen)(b.handler(fn)).ServeHTTP(rec, req)
	return rec
}

func newRequest(apiKey string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat", strings.NewReader(`{"prompt":"hi"}`))
	if apiKey != "" {
		r.Header.Set("X-Api-Key", apiKey)
	}
	return r
}

func closedURL(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	return srv.URL
}

func TestAdmitDecisions(t *testing.T) {
	t.Parallel()
	ms := func(v int64) *int64 { return &v }
	tests := []struct {
		name        string
		reply       step
		wantStatus  int
		wantAllowed bool
		want        client.Decision // the decoded JSON fields
		wantHeader  map[string]string
	}{
		{
			name: "allow", reply: allow(), wantStatus: 200, wantAllowed: true,
			want:       client.Decision{Decision: "allow", EventID: "ev-0001", Account: "a", Org: "org-1", Period: "2026-11"},
			wantHeader: map[string]string{"RateLimit-Policy": allowPolicy, "RateLimit": allowState, "Retry-After": ""},
		},
		{
			name: "rate limited", reply: rateLimited(1500), wantStatus: 429,
			want: client.Decision{Decision: "rate_limited", Account: "a", Org: "org-1",
				BlockedBy: &client.Blocker{Account: "a", Level: "agent", Unit: "tokens"}, RetryAfterMS: ms(1500)},
			wantHeader: map[string]string{"RateLimit-Policy": allowPolicy, "RateLimit": `"a-tokens";r=0;t=2`, "Retry-After": "2"},
		},
		{
			name: "rate limited, never fits", reply: rateLimited(-1), wantStatus: 429,
			want: client.Decision{Decision: "rate_limited", Account: "a", Org: "org-1",
				BlockedBy: &client.Blocker{Account: "a", Level: "agent", Unit: "tokens"}, RetryAfterMS: ms(-1)},
			wantHeader: map[string]string{"Retry-After": ""},
		},
		{
			name: "quota exceeded", reply: quotaExceeded(), wantStatus: 402,
			want: client.Decision{Decision: "quota_exceeded", Account: "a", Org: "org-1", Period: "2026-11",
				BlockedBy: &client.Blocker{Account: "org-1", Level: "org", Unit: "tokens"}},
			wantHeader: map[string]string{"RateLimit-Policy": quotaPolicy, "RateLimit": quotaState, "Retry-After": ""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.reply)
			in := client.Request{APIKey: "key-a", IdempotencyKey: "idem-1", Units: map[string]int64{"tokens": 250}, Tool: "search"}

			d, err := b.client.Admit(t.Context(), in)
			require.NoError(t, err)

			require.Equal(t, tt.wantStatus, d.Status)
			require.Equal(t, tt.wantAllowed, d.Allowed())
			calls := b.fake.Admits()
			require.Len(t, calls, 1)
			require.Equal(t, "Bearer "+serviceToken, calls[0].Auth)
			require.Equal(t, "application/json", calls[0].ContentType)
			require.Equal(t, in, calls[0].Request, "admit must get the request as given")
			require.Equal(t, calls[0].Reply, d.Body, "Body is the raw reply")
			for k, v := range tt.wantHeader {
				require.Equal(t, v, d.Header.Get(k), "header %s", k)
			}
			got := d
			got.Status, got.Header, got.Body = 0, nil, nil
			require.Equal(t, tt.want, got)
		})
	}
}

func TestAdmitAPIErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		token       string
		request     *client.Request // nil: a valid one
		reply       step
		wantStatus  int
		wantCode    string
		wantMessage string
		wantHeader  map[string]string
	}{
		{
			name: "400 from admit's validation", request: &client.Request{}, // neither api_key nor account
			wantStatus: 400, wantCode: "missing_credentials", wantMessage: "give api_key or account",
		},
		{
			name: "401 wrong service token", token: "not-the-token",
			wantStatus: 401, wantCode: "unauthorized", wantMessage: "a valid service token is required (Authorization: Bearer …)",
		},
		{
			name: "403 revoked key", reply: failure(403, "revoked_api_key"),
			wantStatus: 403, wantCode: "revoked_api_key", wantMessage: "scripted revoked_api_key",
		},
		{
			name: "422 idempotency key reused", reply: failure(422, "idempotency_key_reused"),
			wantStatus: 422, wantCode: "idempotency_key_reused", wantMessage: "scripted idempotency_key_reused",
		},
		{
			name: "503 redis down", reply: failure(503, "unavailable").with("Retry-After", "3"),
			wantStatus: 503, wantCode: "unavailable", wantMessage: "scripted unavailable",
			wantHeader: map[string]string{"Retry-After": "3"},
		},
		{
			name: "502 from a proxy, not JSON", reply: step{status: 502, raw: "<html>bad gateway</html>"},
			wantStatus: 502, wantCode: "", wantMessage: "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.reply)
			if tt.token != "" {
				b.client.Token = tt.token
			}
			in := client.Request{APIKey: "key-a"}
			if tt.request != nil {
				in = *tt.request
			}

			d, err := b.client.Admit(t.Context(), in)

			var apiErr *client.APIError
			require.ErrorAs(t, err, &apiErr)
			require.Equal(t, tt.wantStatus, apiErr.Status)
			require.Equal(t, tt.wantCode, apiErr.Code)
			require.Equal(t, tt.wantMessage, apiErr.Message)
			require.Contains(t, apiErr.Error(), strconv.Itoa(tt.wantStatus))
			for k, v := range tt.wantHeader {
				require.Equal(t, v, apiErr.Header.Get(k), "header %s", k)
			}
			calls := b.fake.Admits()
			require.Len(t, calls, 1, "an error is not retried")
			require.Equal(t, calls[0].Reply, apiErr.Body)
			require.Zero(t, d.Status)
			require.False(t, d.Allowed())
		})
	}
}

func TestAdmitTransportErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		baseURL func(t *testing.T, b *testBundle) string
		reply   step
		wantErr string
	}{
		{name: "unreachable", baseURL: func(t *testing.T, _ *testBundle) string { return closedURL(t) }, wantErr: "call /v1/admit"},
		{name: "undecodable decision", reply: step{status: 200, raw: "<html>ok</html>"}, wantErr: "decode admit reply"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.reply)
			if tt.baseURL != nil {
				b.client.BaseURL = tt.baseURL(t, b)
			}

			d, err := b.client.Admit(t.Context(), client.Request{APIKey: "key-a"})

			require.ErrorContains(t, err, tt.wantErr)
			var apiErr *client.APIError
			require.False(t, errors.As(err, &apiErr), "a transport failure is not an *APIError")
			require.Zero(t, d.Status)
		})
	}
}

func TestOutcome(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		token      string
		eventID    string // "" uses the event admitted first
		failWith   *step
		wantStatus int // of the *APIError; 0 for success
		wantCode   string
	}{
		{name: "accepted"},
		{name: "unknown event", eventID: "ev-bogus", wantStatus: 400, wantCode: "invalid_event_id"},
		{name: "wrong token", token: "nope", wantStatus: 401, wantCode: "unauthorized"},
		{name: "unavailable", failWith: &step{status: 503, code: "unavailable", header: map[string]string{"Retry-After": "1"}},
			wantStatus: 503, wantCode: "unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			d, err := b.client.Admit(t.Context(), client.Request{APIKey: "key-a"})
			require.NoError(t, err)
			require.True(t, d.Allowed())
			id := d.EventID
			if tt.eventID != "" {
				id = tt.eventID
			}
			if tt.token != "" {
				b.client.Token = tt.token
			}
			if tt.failWith != nil {
				b.fake.failOutcomes(*tt.failWith)
			}

			err = b.client.Outcome(t.Context(), id, 201, map[string]int64{"tokens": 42})

			if tt.wantStatus == 0 {
				require.NoError(t, err)
				require.Equal(t, []outcomeCall{{EventID: d.EventID, Status: 201, Units: map[string]int64{"tokens": 42}}}, b.fake.Outcomes())
				return
			}
			var apiErr *client.APIError
			require.ErrorAs(t, err, &apiErr)
			require.Equal(t, tt.wantStatus, apiErr.Status)
			require.Equal(t, tt.wantCode, apiErr.Code)
		})
	}
}

// An allowed request runs the handler with admit's RateLimit fields, and the handler's
// status is reported for the event admit issued.
func TestMiddlewareAllowed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		fn          func(http.ResponseWriter, *http.Request)
		wantStatus  int
		wantOutcome int
	}{
		{name: "writes nothing", fn: nil, wantStatus: 200, wantOutcome: 200},
		{name: "writes a body only", fn: func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello") },
			wantStatus: 200, wantOutcome: 200},
		{name: "503 from upstream", fn: func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) },
			wantStatus: 503, wantOutcome: 503},
		{name: "first status wins", fn: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(201)
			w.WriteHeader(500) // superfluous: the client already got 201
		}, wantStatus: 201, wantOutcome: 201},
		{name: "status after a body is ignored", fn: func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "partial")
			w.WriteHeader(500)
		}, wantStatus: 200, wantOutcome: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, allow(), allow()) // a first event, so the id reported must be the right one
			_, err := b.client.Admit(t.Context(), client.Request{APIKey: "key-other"})
			require.NoError(t, err)

			rec := b.serve(false, tt.fn, newRequest("key-a"))

			require.Equal(t, tt.wantStatus, rec.Code)
			require.Equal(t, int32(1), b.served.Load())
			require.Equal(t, allowPolicy, rec.Header().Get("RateLimit-Policy"))
			require.Equal(t, allowState, rec.Header().Get("RateLimit"))
			calls := b.fake.Admits()
			require.Len(t, calls, 2)
			require.Equal(t, client.Request{APIKey: "key-a", Units: map[string]int64{"tokens": 10}, Tool: "search"}, calls[1].Request)
			require.Equal(t, []outcomeCall{{EventID: calls[1].EventID, Status: tt.wantOutcome}}, b.fake.waitOutcomes(t, 1))
		})
	}
}

// A replay of an idempotency key (admitted and served before) is 409, never served again,
// and reports no outcome: serving it would serve a request nobody is billed for.
func TestMiddlewareReplayRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, replayed())
	rec := b.serve(false, nil, newRequest("key-a"))
	require.Equal(t, http.StatusConflict, rec.Code, rec.Body.String())
	require.Equal(t, "true", rec.Header().Get("Idempotent-Replayed"))
	require.JSONEq(t, `{"error":{"code":"idempotency_key_replayed","message":"a request with this idempotency key was admitted and served already"}}`, rec.Body.String())
	require.Zero(t, b.served.Load(), "the handler does not run")
	require.Empty(t, b.fake.Outcomes())
}

// Concurrent requests each get their own outcome: no event id is reported with another
// request's status.
func TestMiddlewareOutcomePerRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mw := b.client.Middleware(identifyByHeader, false)(b.handler(func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.Header.Get("X-Want-Status"))
		if err != nil {
			panic(err)
		}
		w.WriteHeader(code)
	}))
	statuses := []int{200, 201, 404, 429, 500, 503}
	const n = 24
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := newRequest("key-" + strconv.Itoa(i))
			r.Header.Set("X-Want-Status", strconv.Itoa(statuses[i%len(statuses)]))
			mw.ServeHTTP(httptest.NewRecorder(), r)
		})
	}
	wg.Wait()

	keyOf := map[string]string{}
	for _, c := range b.fake.Admits() {
		keyOf[c.EventID] = c.Request.APIKey
	}
	outcomes := b.fake.waitOutcomes(t, n)
	seen := map[string]bool{}
	for _, o := range outcomes {
		key, ok := keyOf[o.EventID]
		require.True(t, ok, "outcome for unknown event %q", o.EventID)
		require.False(t, seen[o.EventID], "event %q reported twice", o.EventID)
		seen[o.EventID] = true
		i, err := strconv.Atoi(strings.TrimPrefix(key, "key-"))
		require.NoError(t, err)
		require.Equal(t, statuses[i%len(statuses)], o.Status, "outcome of %s (%s)", o.EventID, key)
	}
	require.Equal(t, int32(n), b.served.Load())
}

// A denial is forwarded as admit wrote it, and the handler does not run.
func TestMiddlewareDenied(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		reply      step
		wantStatus int
		wantHeader map[string]string
		wantJSON   string
	}{
		{
			name: "rate limited", reply: rateLimited(2500), wantStatus: 429,
			wantHeader: map[string]string{"Retry-After": "3", "RateLimit-Policy": allowPolicy, "RateLimit": `"a-tokens";r=0;t=3`},
			wantJSON:   `{"decision":"rate_limited","account":"a","org":"org-1","blocked_by":{"account":"a","level":"agent","unit":"tokens"},"retry_after_ms":2500}`,
		},
		{
			name: "quota exceeded", reply: quotaExceeded(), wantStatus: 402,
			wantHeader: map[string]string{"Retry-After": "", "RateLimit-Policy": quotaPolicy, "RateLimit": quotaState},
			wantJSON:   `{"decision":"quota_exceeded","account":"a","org":"org-1","period":"2026-11","blocked_by":{"account":"org-1","level":"org","unit":"tokens"}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.reply)

			rec := b.serve(false, nil, newRequest("key-a"))

			require.Equal(t, tt.wantStatus, rec.Code)
			require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			for k, v := range tt.wantHeader {
				require.Equal(t, v, rec.Header().Get(k), "header %s", k)
			}
			require.JSONEq(t, tt.wantJSON, rec.Body.String())
			calls := b.fake.Admits()
			require.Len(t, calls, 1)
			require.Equal(t, calls[0].Reply, rec.Body.Bytes(), "admit's body is forwarded byte for byte")
			require.Zero(t, b.served.Load(), "a denied request must not reach the handler")
			require.Empty(t, b.fake.Outcomes(), "nothing was admitted, so there is no outcome")
		})
	}
}

func TestMiddlewareFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		apiKey      string                               // "" makes identify fail
		adjust      func(t *testing.T, c *client.Client) // e.g. point at a closed server
		reply       step
		failOpen    bool
		wantStatus  int
		wantHeader  map[string]string
		wantBody    string // substring
		wantJSON    string // whole body, when a JSON error is forwarded
		wantServed  bool
		wantAdmits  int
		wantLogLine string
	}{
		{
			name: "identify fails", apiKey: "", wantStatus: 400, wantBody: "missing X-Api-Key", wantAdmits: 0,
		},
		{
			name:   "admit unreachable, fail closed",
			apiKey: "key-a", adjust: func(t *testing.T, c *client.Client) { c.BaseURL = closedURL(t) },
			wantStatus: 503, wantHeader: map[string]string{"Retry-After": "1"}, wantBody: "admission unavailable",
		},
		{
			name:   "admit unreachable, fail open",
			apiKey: "key-a", adjust: func(t *testing.T, c *client.Client) { c.BaseURL = closedURL(t) }, failOpen: true,
			wantStatus: 200, wantBody: "served", wantServed: true, wantLogLine: "admit unreachable: serving fail-open",
		},
		{
			name:   "admit reply undecodable, fail closed",
			apiKey: "key-a", reply: step{status: 200, raw: "<html>captive portal</html>"},
			wantStatus: 503, wantHeader: map[string]string{"Retry-After": "1"}, wantAdmits: 1,
		},
		{
			name:   "admit rejects the service token",
			apiKey: "key-a", adjust: func(_ *testing.T, c *client.Client) { c.Token = "wrong" }, failOpen: true,
			wantStatus: 401, wantAdmits: 1,
			wantJSON: `{"error":{"code":"unauthorized","message":"a valid service token is required (Authorization: Bearer …)"}}`,
		},
		{
			name:   "admit unavailable, forwarded with Retry-After",
			apiKey: "key-a", reply: failure(503, "unavailable").with("Retry-After", "7"),
			wantStatus: 503, wantHeader: map[string]string{"Retry-After": "7"}, wantAdmits: 1,
			wantJSON: `{"error":{"code":"unavailable","message":"scripted unavailable"}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.reply)
			if tt.adjust != nil {
				tt.adjust(t, b.client)
			}

			rec := b.serve(tt.failOpen, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "served") },
				newRequest(tt.apiKey))

			require.Equal(t, tt.wantStatus, rec.Code)
			for k, v := range tt.wantHeader {
				require.Equal(t, v, rec.Header().Get(k), "header %s", k)
			}
			require.Contains(t, rec.Body.String(), tt.wantBody)
			if tt.wantJSON != "" {
				require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
				require.JSONEq(t, tt.wantJSON, rec.Body.String())
			}
			if tt.wantServed {
				require.Equal(t, int32(1), b.served.Load())
			} else {
				require.Zero(t, b.served.Load(), "the handler must not run")
			}
			require.Len(t, b.fake.Admits(), tt.wantAdmits)
			require.Contains(t, b.logs.String(), tt.wantLogLine)
			require.Empty(t, b.fake.Outcomes())
		})
	}
}

// The "queue" burst policy: a 429 whose retry fits in MaxWait is waited out and retried
// with the same idempotency key.
func TestAdmitMaxWait(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		script     []step
		maxWait    time.Duration
		key        string
		wantStatus int
		wantCalls  int
		minElapsed time.Duration
		maxElapsed time.Duration // 0: no bound
	}{
		{
			name: "waits, then allowed; key generated", script: []step{rateLimited(50), allow()},
			maxWait: 2 * time.Second, wantStatus: 200, wantCalls: 2, minElapsed: 50 * time.Millisecond,
		},
		{
			name: "waits twice; caller's key kept", script: []step{rateLimited(20), rateLimited(20), allow()},
			maxWait: 2 * time.Second, key: "caller-key-1", wantStatus: 200, wantCalls: 3, minElapsed: 40 * time.Millisecond,
		},
		{
			name: "retry longer than MaxWait: 429 at once", script: []step{rateLimited(5000)},
			maxWait: 200 * time.Millisecond, wantStatus: 429, wantCalls: 1, maxElapsed: time.Second,
		},
		{
			// 100 ms fits in 150 ms once; a second 100 ms does not fit in what is left.
			name: "only what is left of MaxWait counts", script: []step{rateLimited(100), rateLimited(100), allow()},
			maxWait: 150 * time.Millisecond, wantStatus: 429, wantCalls: 2, minElapsed: 100 * time.Millisecond, maxElapsed: time.Second,
		},
		{
			name: "no MaxWait: 429 at once, no key", script: []step{rateLimited(50), allow()},
			maxWait: 0, wantStatus: 429, wantCalls: 1, // the scripted allow is never asked for
		},
		{
			name: "negative retry_after_ms is never retried", script: []step{rateLimited(-1), allow()},
			maxWait: 2 * time.Second, wantStatus: 429, wantCalls: 1, maxElapsed: time.Second,
		},
		{
			name: "402 is not retried", script: []step{quotaExceeded(), allow()},
			maxWait: 2 * time.Second, wantStatus: 402, wantCalls: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.script...)
			b.client.MaxWait = tt.maxWait

			start := time.Now()
			d, err := b.client.Admit(t.Context(), client.Request{APIKey: "key-a", IdempotencyKey: tt.key, Units: map[string]int64{"tokens": 5}})
			elapsed := time.Since(start)

			require.NoError(t, err)
			require.Equal(t, tt.wantStatus, d.Status)
			require.GreaterOrEqual(t, elapsed, tt.minElapsed)
			if tt.maxElapsed > 0 {
				require.Less(t, elapsed, tt.maxElapsed, "must not wait")
			}
			calls := b.fake.Admits()
			require.Len(t, calls, tt.wantCalls)
			key := calls[0].Request.IdempotencyKey
			switch {
			case tt.key != "":
				require.Equal(t, tt.key, key)
			case tt.maxWait > 0:
				require.Regexp(t, `^mgc-[0-9a-f]{32}$`, key, "a retried request needs an idempotency key")
			default:
				require.Empty(t, key, "no key is invented when nothing is retried")
			}
			for _, c := range calls {
				require.Equal(t, key, c.Request.IdempotencyKey, "every try must carry the same key")
				require.Equal(t, map[string]int64{"tokens": 5}, c.Request.Units)
			}
			if d.Allowed() {
				require.Equal(t, calls[len(calls)-1].EventID, d.EventID)
			}
		})
	}
}

func TestAdmitMaxWaitKeysDiffer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.client.MaxWait = time.Second
	for range 2 {
		_, err := b.client.Admit(t.Context(), client.Request{APIKey: "key-a"})
		require.NoError(t, err)
	}
	calls := b.fake.Admits()
	require.Len(t, calls, 2)
	require.NotEqual(t, calls[0].Request.IdempotencyKey, calls[1].Request.IdempotencyKey,
		"two admissions must not share a generated key (the second would replay the first)")
}

// closeNotifier tells when a reply body was closed: after that Admit only decodes and
// starts waiting, so a cancellation then lands in the wait, not in the call.
type closeNotifier struct {
	base   http.RoundTripper
	closed chan struct{}
}

func (c *closeNotifier) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &notifyingBody{ReadCloser: resp.Body, closed: c.closed}
	return resp, nil
}

type notifyingBody struct {
	io.ReadCloser
	once   sync.Once
	closed chan struct{}
}

func (b *notifyingBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() {
		select {
		case b.closed <- struct{}{}:
		default:
		}
	})
	return err
}

func TestAdmitMaxWaitCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, rateLimited(10_000), allow())
	b.client.MaxWait = time.Minute
	closed := make(chan struct{}, 1)
	b.client.HTTP = &http.Client{Transport: &closeNotifier{base: b.fake.srv.Client().Transport, closed: closed}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		select {
		case <-closed:
			cancel()
		case <-ctx.Done():
		}
	}()

	start := time.Now()
	d, err := b.client.Admit(ctx, client.Request{APIKey: "key-a"})

	require.Equal(t, ctx.Err(), err)
	require.ErrorIs(t, err, context.Canceled)
	require.Less(t, time.Since(start), 5*time.Second, "the wait must end with the context")
	require.Equal(t, http.StatusTooManyRequests, d.Status, "cancelled while waiting, after the 429")
	require.Len(t, b.fake.Admits(), 1)
}

// The middleware with MaxWait queues the request and serves it once allowed.
func TestMiddlewareMaxWait(t *testing.T) {
	t.Parallel()
	b := setup(t, rateLimited(30), allow())
	b.client.MaxWait = 2 * time.Second

	rec := b.serve(false, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(202) }, newRequest("key-a"))

	require.Equal(t, 202, rec.Code)
	require.Equal(t, int32(1), b.served.Load())
	require.Equal(t, allowState, rec.Header().Get("RateLimit"), "the fields of the final decision")
	require.Empty(t, rec.Header().Get("Retry-After"))
	calls := b.fake.Admits()
	require.Len(t, calls, 2)
	require.Equal(t, calls[0].Request.IdempotencyKey, calls[1].Request.IdempotencyKey)
	require.NotEmpty(t, calls[0].Request.IdempotencyKey)
	require.Equal(t, []outcomeCall{{EventID: calls[1].EventID, Status: 202}}, b.fake.waitOutcomes(t, 1))
}

// A panicking handler is reported as a 500 and the panic goes on to the server.
func TestMiddlewarePanic(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		fn    func(http.ResponseWriter, *http.Request)
		value any
	}{
		{name: "before writing", value: "boom"},
		{name: "after a 200", value: "late boom", fn: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(200)
			_, _ = io.WriteString(w, "partial")
		}},
		{name: "abort handler", value: http.ErrAbortHandler},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			h := b.client.Middleware(identifyByHeader, false)(b.handler(func(w http.ResponseWriter, r *http.Request) {
				if tt.fn != nil {
					tt.fn(w, r)
				}
				panic(tt.value)
			}))

			recovered := func() (v any) {
				defer func() { v = recover() }()
				h.ServeHTTP(httptest.NewRecorder(), newRequest("key-a"))
				return nil
			}()

			require.Equal(t, tt.value, recovered, "the panic must propagate unchanged")
			calls := b.fake.Admits()
			require.Len(t, calls, 1)
			require.Equal(t, []outcomeCall{{EventID: calls[0].EventID, Status: 500}}, b.fake.waitOutcomes(t, 1))
		})
	}
}

// A failed outcome report is logged with its event id (the caller already has its reply).
func TestMiddlewareOutcomeFailureLogged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.failOutcomes(failure(503, "unavailable"))

	rec := b.serve(false, nil, newRequest("key-a"))

	require.Equal(t, 200, rec.Code)
	calls := b.fake.Admits()
	require.Len(t, calls, 1)
	b.fake.waitOutcomes(t, 1)
	require.Eventually(t, func() bool {
		l := b.logs.String()
		return strings.Contains(l, "report outcome") && strings.Contains(l, calls[0].EventID) && strings.Contains(l, "unavailable")
	}, 5*time.Second, 2*time.Millisecond, "logs: %s", b.logs.String())
}

// The status recorder does not hide the real writer from http.ResponseController.
func TestMiddlewareResponseController(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var flushErr error
	rec := httptest.NewRecorder()
	b.client.Middleware(identifyByHeader, false)(b.handler(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "data: 1\n\n")
		flushErr = http.NewResponseController(w).Flush()
	})).ServeHTTP(rec, newRequest("key-a"))

	require.NoError(t, flushErr)
	require.True(t, rec.Flushed)
	b.fake.waitOutcomes(t, 1)
}

// Regressions found while these tests were written.

// A context that ends before the wait would: the 429 is returned at once, and the
// middleware forwards it rather than serving fail-open or answering 503.
func TestAdmitWaitLongerThanContext(t *testing.T) {
	t.Parallel()
	b := setup(t, rateLimited(5_000), allow())
	b.client.MaxWait = 10 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	d, err := b.client.Admit(ctx, client.Request{APIKey: "key-a"})
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, d.Status)
	require.Less(t, time.Since(start), time.Second, "no wait that cannot finish")

	b = setup(t, rateLimited(5_000), allow())
	b.client.MaxWait = 10 * time.Second
	served := false
	req := newRequest("key-a")
	reqCtx, cancelReq := context.WithTimeout(req.Context(), 2*time.Second)
	defer cancelReq()
	rec := b.serve(true, func(http.ResponseWriter, *http.Request) { served = true }, req.WithContext(reqCtx))
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.False(t, served, "a rate-limited request is never served fail-open")
}

// 103 Early Hints before the real status: the outcome is the real status.
func TestMiddlewareInformationalStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.serve(false, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusCreated)
	}, newRequest("key-a"))
	require.Equal(t, http.StatusCreated, b.fake.waitOutcomes(t, 1)[0].Status)
}

// A streaming handler that asserts http.Flusher still flushes through the middleware.
func TestMiddlewareFlusher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok := false
	rec := b.serve(false, func(w http.ResponseWriter, _ *http.Request) {
		var f http.Flusher
		f, ok = w.(http.Flusher)
		if ok {
			_, _ = io.WriteString(w, "data: 1\n\n")
			f.Flush()
		}
	}, newRequest("key-a"))
	require.True(t, ok, "the middleware's writer is an http.Flusher")
	require.True(t, rec.Flushed)
	b.fake.waitOutcomes(t, 1)
}

// retry_after_ms of 0 does not make the queueing client spin.
func TestAdmitZeroRetryDoesNotSpin(t *testing.T) {
	t.Parallel()
	script := make([]step, 0, 1000)
	for range 1000 {
		script = append(script, rateLimited(0))
	}
	b := setup(t, script...)
	b.client.MaxWait = 100 * time.Millisecond
	d, err := b.client.Admit(t.Context(), client.Request{APIKey: "key-a"})
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, d.Status)
	require.LessOrEqual(t, len(b.fake.Admits()), 21, "at most one call per 5 ms of MaxWait")
}

// Request.MaxWait is sent as max_wait_ms, cut to end before ctx's deadline and the HTTP
// client's Timeout; without it, no max_wait_ms is sent.
func TestAdmitRequestMaxWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		maxWait     time.Duration
		ctxTimeout  time.Duration
		httpTimeout time.Duration
		min, max    int64 // bounds of the max_wait_ms sent; max 0: none sent
	}{
		{name: "none", maxWait: 0},
		{name: "whole", maxWait: 2 * time.Second, min: 1990, max: 2000},
		{name: "cut by ctx", maxWait: 10 * time.Second, ctxTimeout: time.Second, min: 600, max: 750},
		{name: "cut by the http client", maxWait: 10 * time.Second, httpTimeout: time.Second, min: 700, max: 750},
		{name: "no time left", maxWait: 10 * time.Second, ctxTimeout: 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.client.HTTP.Timeout = tc.httpTimeout
			ctx := context.Background()
			if tc.ctxTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctxTimeout)
				defer cancel()
			}
			d, err := b.client.Admit(ctx, client.Request{APIKey: "k", MaxWait: tc.maxWait})
			require.NoError(t, err)
			require.True(t, d.Allowed())
			calls := b.fake.Admits()
			require.Len(t, calls, 1)
			if tc.max == 0 {
				require.Nil(t, calls[0].MaxWaitMS)
				return
			}
			require.NotNil(t, calls[0].MaxWaitMS)
			require.GreaterOrEqual(t, *calls[0].MaxWaitMS, tc.min)
			require.LessOrEqual(t, *calls[0].MaxWaitMS, tc.max)
		})
	}
}
