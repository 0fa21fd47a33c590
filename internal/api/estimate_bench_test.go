package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// benchPolicies is one org whose limits never refuse: the benchmark measures the decision
// path (handler, estimate, Redis script), not the policy store.
type benchPolicies struct{ pol policy.Resolved }

func (p benchPolicies) Resolve(string) (policy.Resolved, error) { return p.pol, nil }
func (p benchPolicies) Authenticate(string) (policy.APIKey, policy.Resolved, error) {
	return policy.APIKey{}, p.pol, nil
}
func (benchPolicies) WaitFresh(context.Context, time.Time) error { return nil }
func (benchPolicies) Loaded() bool                               { return true }

// BenchmarkAdmitEstimate compares admit's throughput with units.tokens and with an
// estimate of a 4 KiB prompt (o200k_base, gpt-4o), against the real Redis, in-process.
// The two kinds alternate in rounds of 64 requests so that both see the same machine; the
// estimate/tokens metric is the ratio of their times per request.
func BenchmarkAdmitEstimate(b *testing.B) {
	quota := int64(-1)
	org := "bench-est"
	pol := policy.Resolved{Org: org, Plan: "pro", Path: []policy.Level{{Account: org, Kind: policy.Org,
		Limits: map[policy.Unit]policy.Limit{policy.Tokens: {RatePerS: 1e12, Burst: 1e15, Quota: &quota, QuotaPeriod: policy.Month}}}},
		Stamp: policy.NewStamp()}
	srv := api.New(api.Config{
		Log: slog.New(slog.DiscardHandler), Policies: benchPolicies{pol: pol},
		Decider:      admission.New(testenv.Redis(b), admission.Options{KeyPrefix: testenv.Prefix(b) + "mg", LeaseTTL: 5 * time.Second}),
		ServiceToken: serviceToken, AdminToken: adminToken, Source: "bench",
	})
	b.Cleanup(func() { _ = srv.Close(context.Background()) })

	chunk := "Summarise the quarterly usage report for the platform team. Totals: 12,345 requests, 6.7M tokens. "
	text, _ := json.Marshal(strings.Repeat(chunk, 4096/len(chunk)+1)[:4096])
	request := `{"model":"gpt-4o","messages":[{"role":"user","content":` + string(text) + `}],"max_tokens":256}`
	bodies := map[string]string{
		"tokens":   fmt.Sprintf(`{"account":%q,"units":{"tokens":1200}}`, org),
		"estimate": fmt.Sprintf(`{"account":%q,"estimate":{"request":%s}}`, org, request),
	}
	call := func(body string) {
		r := httptest.NewRequest(http.MethodPost, "/v1/admit", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+serviceToken)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("admit: %d %s", w.Code, w.Body)
		}
	}
	call(bodies["estimate"]) // loads the encoding
	spent := map[string]time.Duration{}
	const round = 64
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		kind := "tokens"
		if (n/round)%2 == 1 {
			kind = "estimate"
		}
		start := time.Now()
		call(bodies[kind])
		spent[kind] += time.Since(start)
		n++
	}
	if spent["tokens"] > 0 && spent["estimate"] > 0 {
		b.ReportMetric(float64(spent["tokens"].Nanoseconds())/float64(n/2), "ns/tokens-admit")
		b.ReportMetric(float64(spent["estimate"].Nanoseconds())/float64(n/2), "ns/estimate-admit")
		b.ReportMetric(float64(spent["estimate"])/float64(spent["tokens"]), "estimate/tokens")
	}
}
