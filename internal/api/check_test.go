package api_test

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api"
)

// check sends a forward-auth subrequest as a gateway does: the original method and
// headers, and the service token in the check's token header (none when token is empty).
func (b *testBundle) check(t *testing.T, method, path, token string, h map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(method, b.url+path, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("X-Metergate-Token", token)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	return b.do(t, req)
}

// The check takes the decision of POST /v1/admit from headers: 200 with the event and the
// RateLimit fields, then 429 with Retry-After and the body repeated in X-Metergate-Reply,
// 402 for a spent quota, 401 and 403 for keys, whatever the method and for Envoy's
// appended path; and the usage counts exactly the allowed checks.
func TestCheckDecides(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org, spent := b.id("gw"), b.id("gw-quota")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro",
		"limits": map[string]any{"tokens": map[string]any{"limit": 1000, "window_s": 3600}}})
	b.account(t, map[string]any{"id": spent, "kind": "org", "plan": "pro",
		"limits": map[string]any{"requests": map[string]any{"quota": 1, "quota_period": "month"}}})
	key, spentKey := b.apiKey(t, org), b.apiKey(t, spent)
	b.waitResolvable(t, org)
	b.waitResolvable(t, spent)

	allowed := 0
	for _, method := range []string{"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		r := b.check(t, method, "/v1/check", serviceToken, map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": "100"})
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", method, r.Raw)
		allowed++
		require.Equal(t, r.Body["event_id"], r.Header.Get(api.EventIDHeader), method)
		require.NotEmpty(t, r.Header.Get(api.EventIDHeader))
		require.Equal(t, org, r.Header.Get(api.AccountHeader))
		require.Contains(t, r.Header.Get("RateLimit"), `"`+org+`-tokens";r=`)
		require.NotEmpty(t, r.Header.Get("RateLimit-Policy"))
		require.Empty(t, r.Header.Get(api.ReplyHeader), "an admission repeats no body")
	}
	// Envoy's ext_authz appends the original path to /v1/check.
	r := b.check(t, "POST", "/v1/check/completions", serviceToken, map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": "100"})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	allowed++

	// 7 × 100 tokens taken of 1000: 400 more is over.
	r = b.check(t, "GET", "/v1/check", serviceToken, map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": "400"})
	require.Equal(t, http.StatusTooManyRequests, r.Status, r.Raw)
	require.Equal(t, "rate_limited", r.Body["decision"])
	retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, retry, 1)
	require.JSONEq(t, r.Raw, r.Header.Get(api.ReplyHeader), "the refusal's body, for nginx")
	require.Empty(t, r.Header.Get(api.EventIDHeader))

	// The same idempotency key is one admission, and its replay passes nothing: a gateway
	// would serve it again, unbilled.
	r = b.check(t, "GET", "/v1/check", serviceToken, map[string]string{"X-Api-Key": key, "Idempotency-Key": "gw-1"})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Empty(t, r.Header.Get(api.ReplayedHeader))
	allowed++
	for range 2 {
		r = b.check(t, "GET", "/v1/check", serviceToken, map[string]string{"X-Api-Key": key, "Idempotency-Key": "gw-1"})
		require.Equal(t, http.StatusConflict, r.Status, r.Raw)
		require.Equal(t, "idempotency_key_replayed", errCode(r))
		require.Equal(t, "true", r.Header.Get(api.ReplayedHeader))
		require.Empty(t, r.Header.Get(api.EventIDHeader))
		require.JSONEq(t, r.Raw, r.Header.Get(api.ReplyHeader), "the refusal's body, for nginx")
	}

	r = b.check(t, "GET", "/v1/check", serviceToken, map[string]string{"X-Api-Key": spentKey})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	r = b.check(t, "GET", "/v1/check", serviceToken, map[string]string{"X-Api-Key": spentKey})
	require.Equal(t, http.StatusPaymentRequired, r.Status, r.Raw)
	require.Equal(t, "quota_exceeded", r.Body["decision"])
	require.JSONEq(t, r.Raw, r.Header.Get(api.ReplyHeader))

	usage := b.call(t, "GET", "/v1/usage/"+org, serviceToken, nil)
	require.Equal(t, http.StatusOK, usage.Status, usage.Raw)
	require.Contains(t, usage.Raw, `"requests":{"used":`+strconv.Itoa(allowed), "every allowed check is an admission: %s", usage.Raw)
}

// Bad input is a refusal with admit's codes, never a 5xx: missing key 401, unknown 401,
// revoked 403, bad tokens 400, and the service token in its own header only.
func TestCheckRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org := b.id("gw-bad")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	key := b.apiKey(t, org)
	revoked := b.apiKey(t, org)
	b.waitResolvable(t, org)
	b.revoke(t, revoked)

	tests := []struct {
		name   string
		token  string
		h      map[string]string
		status int
		code   string
	}{
		{"no token", "", map[string]string{"X-Api-Key": key}, 401, "unauthorized"},
		{"wrong token", "nope", map[string]string{"X-Api-Key": key}, 401, "unauthorized"},
		{"admin token", adminToken, map[string]string{"X-Api-Key": key}, 403, "forbidden"},
		{"token as bearer only", "", map[string]string{"Authorization": "Bearer " + serviceToken, "X-Api-Key": key}, 401, "unauthorized"},
		{"no api key", serviceToken, nil, 401, "missing_api_key"},
		{"unknown api key", serviceToken, map[string]string{"X-Api-Key": "mgk_unknown"}, 401, "unknown_api_key"},
		{"long api key", serviceToken, map[string]string{"X-Api-Key": strings.Repeat("k", 300)}, 401, "unknown_api_key"},
		{"revoked api key", serviceToken, map[string]string{"X-Api-Key": revoked}, 403, "revoked_api_key"},
		{"account header off by default", serviceToken, map[string]string{"X-Account": org}, 401, "missing_api_key"},
		{"tokens not a number", serviceToken, map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": "lots"}, 400, "invalid_units"},
		{"negative tokens", serviceToken, map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": "-1"}, 400, "invalid_units"},
		{"fractional tokens", serviceToken, map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": "1.5"}, 400, "invalid_units"},
		{"huge tokens", serviceToken, map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": "99999999999999999999"}, 400, "invalid_units"},
		{"unknown tool", serviceToken, map[string]string{"X-Api-Key": key, "X-Tool": "teleport"}, 400, "unknown_tool"},
		{"long idempotency key", serviceToken, map[string]string{"X-Api-Key": key, "Idempotency-Key": strings.Repeat("i", 256)}, 400, "invalid_idempotency_key"},
	}
	for _, tt := range tests {
		r := b.check(t, "GET", "/v1/check", tt.token, tt.h)
		require.Equal(t, tt.status, r.Status, "%s: %s", tt.name, r.Raw)
		require.Equal(t, tt.code, errCode(r), tt.name)
	}
	r := b.check(t, "GET", "/v1/check", serviceToken, map[string]string{"X-Api-Key": key, "X-Tool": "web_search", "X-Estimated-Tokens": "0"})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
}

// Every header name is configurable; the account header, once named, takes an account,
// and the token header may be Authorization.
func TestCheckHeaderNames(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{check: api.CheckHeaders{Token: "Authorization", APIKey: "X-Key", Account: "X-Tenant",
		Tokens: "X-Tokens", Tool: "X-Call", IdempotencyKey: "X-Request-Id"}})
	org := b.id("gw-names")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro",
		"limits": map[string]any{"tokens": map[string]any{"limit": 100, "window_s": 3600}}})
	key := b.apiKey(t, org)
	b.waitResolvable(t, org)

	send := func(h map[string]string) reply {
		req, err := http.NewRequest("GET", b.url+"/v1/check", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+serviceToken)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		return b.do(t, req)
	}
	r := send(map[string]string{"X-Key": key, "X-Tokens": "60", "X-Request-Id": "names-1"})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	r = send(map[string]string{"X-Tenant": org, "X-Tokens": "60", "X-Call": "web_search"})
	require.Equal(t, http.StatusTooManyRequests, r.Status, "the tokens header is read: %s", r.Raw)
	r = send(map[string]string{"X-Key": key, "X-Request-Id": "names-1", "X-Tokens": "60"})
	require.Equal(t, http.StatusConflict, r.Status, "the idempotency header is read: a replay: %s", r.Raw)
	require.Equal(t, "idempotency_key_replayed", errCode(r))
	require.Equal(t, "unknown_tool", errCode(send(map[string]string{"X-Tenant": org, "X-Call": "teleport"})))
	require.Equal(t, "ambiguous_account", errCode(send(map[string]string{"X-Tenant": org, "X-Key": key})))
	require.Equal(t, "invalid_account", errCode(send(map[string]string{"X-Tenant": "-bad"})))
	require.Equal(t, "missing_api_key", errCode(send(map[string]string{"X-Api-Key": key})), "the default names are not read")

	req, err := http.NewRequest("GET", b.url+"/v1/check", nil)
	require.NoError(t, err)
	req.Header.Set("X-Metergate-Token", serviceToken)
	req.Header.Set("X-Key", key)
	require.Equal(t, http.StatusUnauthorized, b.do(t, req).Status, "the token is read from Authorization only")
}

// A free key's burst of 30 checks: about 20 pass, the rest are 429 with Retry-After.
func TestCheckFreeBurst(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org := b.id("gw-free")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "free"})
	key := b.apiKey(t, org)
	b.waitResolvable(t, org)

	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 30 {
		wg.Go(func() {
			<-start
			r := b.check(t, "GET", "/v1/check", serviceToken, map[string]string{"X-Api-Key": key})
			mu.Lock()
			defer mu.Unlock()
			counts[r.Status]++
			if r.Status == http.StatusTooManyRequests {
				require.NotEmpty(t, r.Header.Get("Retry-After"))
			}
		})
	}
	close(start)
	wg.Wait()
	require.GreaterOrEqual(t, counts[200], 20, "%v", counts)
	require.LessOrEqual(t, counts[200], 22, "%v", counts)
	require.Equal(t, 30, counts[200]+counts[429], "%v", counts)
}

// revoke revokes an API key and waits until the cache has seen it.
func (b *testBundle) revoke(t *testing.T, secret string) {
	t.Helper()
	key, _, err := b.cache.Authenticate(secret)
	require.NoError(t, err)
	del := b.call(t, "DELETE", "/v1/admin/api-keys/"+key.ID, adminToken, nil)
	require.Equal(t, http.StatusNoContent, del.Status, del.Raw)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, err := b.cache.Authenticate(secret); err != nil {
			return
		}
		require.True(t, time.Now().Before(deadline), "revocation never reached the cache")
		time.Sleep(5 * time.Millisecond)
	}
}
