package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/client"
)

// gpt-4, one user message "hello world", max_tokens 10: 1 ("user") + 2 ("hello world", 2
// tokens in cl100k_base as tiktoken publishes) + 3 per message + 3 reply priming = 9 in,
// 10 out (internal/estimate tests each term).
const helloGPT4 = `{"model":"gpt-4","messages":[{"role":"user","content":"hello world"}],"max_tokens":10}`

// An estimate is what admit charges: POST /v1/estimate's total, admit's estimated and the
// tokens used in Redis are one number, on a single Redis and on the Cluster.
func TestAdmitChargesTheEstimate(t *testing.T) {
	t.Parallel()
	onRedisAndCluster(t, func(t *testing.T, o setupOpts) {
		b := setup(t, o)
		org := b.id("est")
		b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro",
			"limits": map[string]any{"tokens": map[string]any{"rate_per_s": 10, "burst": 100, "quota": 1_000_000}}})
		b.waitResolvable(t, org)

		est := b.call(t, "POST", "/v1/estimate", serviceToken, `{"request":`+helloGPT4+`}`)
		require.Equal(t, http.StatusOK, est.Status, est.Raw)
		require.Equal(t, map[string]any{"model": "gpt-4", "provider": "openai", "method": "cl100k_base",
			"input_tokens": float64(9), "output_tokens": float64(10), "total_tokens": float64(19), "output_from": "max_tokens",
			"breakdown": map[string]any{"text": float64(3), "overhead": float64(6), "images": float64(0), "image_count": float64(0)}}, est.Body)

		r := b.call(t, "POST", "/v1/admit", serviceToken, `{"account":"`+org+`","estimate":{"request":`+helloGPT4+`}}`)
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		require.Equal(t, est.Body, r.Body["estimated"])
		used := func() float64 {
			u := b.call(t, "GET", "/v1/usage/"+org, serviceToken, nil)
			require.Equal(t, http.StatusOK, u.Status, u.Raw)
			return u.Body["units"].(map[string]any)["tokens"].(map[string]any)["used"].(float64)
		}
		require.Equal(t, float64(19), used())

		// Anthropic (the character fallback): 35 characters → 10, max_tokens 50.
		claude := `{"model":"claude-sonnet-4-5","max_tokens":50,"messages":[{"role":"user","content":"` + strings.Repeat("x", 35) + `"}]}`
		r = b.call(t, "POST", "/v1/admit", serviceToken, `{"account":"`+org+`","estimate":{"request":`+claude+`}}`)
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		e := r.Body["estimated"].(map[string]any)
		require.Equal(t, "anthropic", e["provider"])
		require.Equal(t, "chars/3.5", e["method"])
		require.Equal(t, float64(60), e["total_tokens"])
		require.Equal(t, float64(19+60), used())

		// Past the burst: refused, nothing charged, and the reply still says what was estimated.
		big := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":500}`
		r = b.call(t, "POST", "/v1/admit", serviceToken, `{"account":"`+org+`","estimate":{"request":`+big+`}}`)
		require.Equal(t, http.StatusTooManyRequests, r.Status, r.Raw)
		require.Equal(t, "o200k_base", r.Body["estimated"].(map[string]any)["method"])
		require.Equal(t, float64(19+60), used())
	})
}

// Malformed, ambiguous and oversized estimates are coded 400s; the estimate takes the
// service token.
func TestEstimateErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org := b.id("esterr")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	b.waitResolvable(t, org)
	huge := `{"request":{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("a", api.MaxEstimateBodyBytes) + `"}]}}`
	for _, tc := range []struct {
		name, path, token, body string
		status                  int
		code                    string
	}{
		{"admin token", "/v1/estimate", adminToken, `{"request":` + helloGPT4 + `}`, 403, "forbidden"},
		{"no token", "/v1/estimate", "", `{"request":` + helloGPT4 + `}`, 401, "unauthorized"},
		{"not a model request", "/v1/estimate", serviceToken, `{"request":{"prompt":"hi","model":"gpt-4o"}}`, 400, "invalid_estimate"},
		{"request not an object", "/v1/estimate", serviceToken, `{"model":"gpt-4o","request":"hi"}`, 400, "invalid_estimate"},
		{"no max_tokens for claude", "/v1/estimate", serviceToken, `{"request":{"model":"claude-3","messages":[{"role":"user","content":"x"}]}}`, 400, "invalid_estimate"},
		{"unknown provider", "/v1/estimate", serviceToken, `{"provider":"google","request":` + helloGPT4 + `}`, 400, "invalid_estimate"},
		{"unknown field", "/v1/estimate", serviceToken, `{"request":` + helloGPT4 + `,"x":1}`, 400, "unknown_field"},
		{"over 1 MiB", "/v1/estimate", serviceToken, huge, 400, "body_too_large"},
		{"admit over 1 MiB", "/v1/admit", serviceToken, `{"account":"` + org + `","estimate":` + huge + `}`, 400, "body_too_large"},
		{"tokens and estimate", "/v1/admit", serviceToken, `{"account":"` + org + `","units":{"tokens":5},"estimate":{"request":` + helloGPT4 + `}}`, 400, "ambiguous_tokens"},
		{"admit bad estimate", "/v1/admit", serviceToken, `{"account":"` + org + `","estimate":{"request":{"model":"gpt-4o","messages":[]}}}`, 400, "invalid_estimate"},
	} {
		r := b.call(t, "POST", tc.path, tc.token, tc.body)
		require.Equal(t, tc.status, r.Status, "%s: %s", tc.name, r.Raw)
		require.Equal(t, tc.code, r.Body["error"].(map[string]any)["code"], tc.name)
	}
}

// pkg/client's Estimate and Admit with an estimate, against the real admit.
func TestClientEstimate(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org := b.id("estclient")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	b.waitResolvable(t, org)
	c := &client.Client{BaseURL: b.url, Token: serviceToken}
	ctx := testenv.Context(t, time.Minute)

	e, err := c.Estimate(ctx, client.EstimateRequest{Request: json.RawMessage(helloGPT4)})
	require.NoError(t, err)
	require.Equal(t, int64(19), e.TotalTokens)
	require.Equal(t, "cl100k_base", e.Method)
	require.Equal(t, int64(3), e.Breakdown.Text)

	d, err := c.Admit(ctx, client.Request{Account: org, Estimate: &client.EstimateRequest{Model: "gpt-4o", Request: json.RawMessage(helloGPT4)}})
	require.NoError(t, err)
	require.True(t, d.Allowed())
	require.NotNil(t, d.Estimated)
	require.Equal(t, "o200k_base", d.Estimated.Method) // the estimate's model wins over the body's

	_, err = c.Estimate(ctx, client.EstimateRequest{Request: json.RawMessage(`{"model":"gpt-4o"}`)})
	var apiErr *client.APIError
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, "invalid_estimate", apiErr.Code)
}
