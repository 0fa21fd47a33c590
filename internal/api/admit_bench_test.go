package api_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/policy"
)

// fixedDecider is a named fake of the admitter for BenchmarkAdmitHandler: it allows every
// request with the limits the bench's model reports (4 levels × requests and tokens
// buckets, a monthly quota), so the benchmark measures what admit spends per request
// besides the script call: the body's decoding, the gate, the metrics and the reply.
type fixedDecider struct{ limits []admission.LimitState }

func (fixedDecider) NewEventID(org string) string {
	return "01a20ad9-148d-78fb-a967-f5cd45a1595b.7." + org
}
func (d fixedDecider) Decide(_ context.Context, r admission.Request) (admission.Decision, error) {
	return admission.Decision{Result: admission.Allow, EventID: r.EventID, Period: "2026-11", Limits: d.limits,
		Time: time.Date(2026, 11, 23, 10, 47, 20, 0, time.UTC)}, nil
}
func (fixedDecider) Void(context.Context, admission.Void) (bool, error) { return true, nil }
func (fixedDecider) Outcome(context.Context, admission.Outcome) error   { return nil }
func (fixedDecider) Usage(context.Context, policy.Resolved) (map[policy.Unit]admission.UnitUsage, error) {
	return nil, nil
}

// BenchmarkAdmitHandler is POST /v1/admit through the API's handler as admit serves it
// (bearer check, body limit and decoding, the gate, metrics, the reply and its RateLimit
// fields), the decision taken by fixedDecider: admit's own CPU per request but for the
// script call and the network. docs/bench.md, "admit's own CPU".
//
//	go test -run '^$' -bench AdmitHandler -benchmem ./internal/api/
func BenchmarkAdmitHandler(b *testing.B) {
	names := []string{"acme", "eng", "alice", "agent-1"}
	kinds := []policy.Kind{policy.Org, policy.Team, policy.User, policy.Agent}
	pol := policy.Resolved{Org: "acme", Plan: "pro", Stamp: policy.NewStamp()}
	var limits []admission.LimitState
	for i, name := range names {
		pol.Path = append(pol.Path, policy.Level{Account: name, Kind: kinds[i]})
		for _, u := range []string{"requests", "tokens"} {
			limits = append(limits, admission.LimitState{Account: name, Unit: u, Limit: 2000, Window: 2 * time.Second,
				Remaining: 1500, Reset: time.Second})
		}
	}
	limits = append(limits, admission.LimitState{Account: "acme", Unit: "requests", Quota: true, Limit: 5_000_000,
		Window: 30 * 24 * time.Hour, Remaining: 4_000_000, Reset: 7 * 24 * time.Hour})
	srv := api.New(api.Config{
		Log: slog.New(slog.DiscardHandler), Policies: benchPolicies{pol: pol}, Decider: fixedDecider{limits: limits},
		ServiceToken: serviceToken, AdminToken: adminToken, Source: "bench",
	})
	b.Cleanup(func() { _ = srv.Close(context.Background()) })
	// bench/admit.go's body.
	const body = `{"api_key":"mg_live_0123456789abcdef0123456789abcdef","units":{"requests":1,"tokens":500}}`
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/v1/admit", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+serviceToken)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("admit: %d %s", w.Code, w.Body)
		}
	}
}
