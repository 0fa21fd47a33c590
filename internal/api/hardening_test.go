package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/pkg/event"
)

// POST /v1/admit is the calling service's door: a replay is answered with the first
// decision, charged nothing, marked Idempotent-Replayed; past admission.MaxAttempts
// answers, a replay is 409 idempotency_key_exhausted.
func TestAdmitReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org := b.id("org")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	b.waitResolvable(t, org)
	body := map[string]any{"account": org, "idempotency_key": "svc-1", "units": map[string]any{"tokens": 10}}
	first := b.admit(t, body)
	require.Equal(t, http.StatusOK, first.Status, first.Raw)
	require.Empty(t, first.Header.Get(api.ReplayedHeader))
	for i := 1; i < admission.MaxAttempts; i++ {
		r := b.admit(t, body)
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		require.Equal(t, true, r.Body["replayed"])
		require.Equal(t, first.Body["event_id"], r.Body["event_id"])
		require.Equal(t, "true", r.Header.Get(api.ReplayedHeader))
	}
	r := b.admit(t, body)
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "idempotency_key_exhausted", errCode(r))
}

// Envoy's rate-limit service is a gateway's door: a replayed idempotency key is OVER_LIMIT
// with the 409 of the check, never OK.
func TestRLSReplayRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true})
	org := b.id("org")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	key := b.apiKey(t, org)
	first := b.mustShould(t, desc("api_key", key, "idempotency_key", "gw-1"))
	require.Equal(t, rlsv3.RateLimitResponse_OK, first.GetOverallCode(), "%s", first.GetRawBody())
	for range 2 {
		again := b.mustShould(t, desc("api_key", key, "idempotency_key", "gw-1"))
		require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, again.GetOverallCode())
		require.Equal(t, http.StatusConflict, httpStatus(again))
		require.Equal(t, "idempotency_key_replayed", again.GetDynamicMetadata().GetFields()["code"].GetStringValue())
		require.Equal(t, "true", headers(again).Get(api.ReplayedHeader))
		require.Empty(t, rlsEventID(again), "nothing is passed upstream")
	}
	require.Equal(t, float64(1), b.usage(t, org)["requests"])
}

// Behind a gateway an end client sees its own account's id, the others by their kind: a
// team's limit refuses a user's key at the check and the rate-limit service without naming
// the org or the team. The calling service's POST /v1/admit names them, and so do the
// gateways with RevealAccounts.
func TestGatewaysShowOwnAccountOnly(t *testing.T) {
	t.Parallel()
	for _, reveal := range []bool{false, true} {
		t.Run("reveal="+strconv.FormatBool(reveal), func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{grpc: true, reveal: reveal})
			org, team, user := b.id("secretorg"), b.id("secretteam"), b.id("user")
			b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
			b.account(t, map[string]any{"id": team, "kind": "team", "parent": org,
				"limits": map[string]any{"tokens": map[string]any{"rate_per_s": 1, "burst": 100}}})
			b.account(t, map[string]any{"id": user, "kind": "user", "parent": team})
			key := b.apiKey(t, user)

			leaks := func(what string, texts ...string) {
				t.Helper()
				for _, s := range texts {
					for _, id := range []string{org, team} {
						if reveal {
							continue
						}
						require.NotContains(t, s, id, "%s names an account above the client's", what)
					}
				}
			}
			allowed := b.check(t, "GET", "/v1/check", serviceToken, map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": "10"})
			require.Equal(t, http.StatusOK, allowed.Status, allowed.Raw)
			// An admission's body and event id go to the gateway and the app, not the client:
			// its RateLimit fields do.
			leaks("an admission", allowed.Header.Get("RateLimit"), allowed.Header.Get("RateLimit-Policy"))
			require.Equal(t, user, allowed.Header.Get(api.AccountHeader))

			refused := b.check(t, "GET", "/v1/check", serviceToken, map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": "500"})
			require.Equal(t, http.StatusTooManyRequests, refused.Status, refused.Raw)
			leaks("a refusal", refused.Raw, refused.Header.Get(api.ReplyHeader), refused.Header.Get("RateLimit"), refused.Header.Get("RateLimit-Policy"))
			blocked := refused.Body["blocked_by"].(map[string]any)
			require.Equal(t, "team", blocked["level"])
			if reveal {
				require.Equal(t, team, blocked["account"])
				require.Equal(t, org, refused.Body["org"])
			} else {
				require.Equal(t, "team", blocked["account"], "named by its kind")
				require.Equal(t, "org", refused.Body["org"])
				require.Contains(t, refused.Header.Get("RateLimit"), `"team-tokens"`)
			}

			resp := b.mustShould(t, hits(desc("api_key", key), 500))
			require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.GetOverallCode())
			h := headers(resp)
			leaks("the rate-limit service's refusal", string(resp.GetRawBody()), h.Get("RateLimit"), h.Get("RateLimit-Policy"),
				resp.GetStatuses()[0].GetCurrentLimit().GetName())

			// The calling service is told everything.
			r := b.admit(t, map[string]any{"api_key": key, "units": map[string]any{"tokens": 500}})
			require.Equal(t, http.StatusTooManyRequests, r.Status, r.Raw)
			require.Equal(t, team, r.Body["blocked_by"].(map[string]any)["account"])
			require.Equal(t, org, r.Body["org"])
		})
	}
}

// Every unit is at most 10^15 at every door: past it, 400 invalid_units naming the field.
func TestUnitsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true})
	org := b.id("org")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "enterprise",
		"limits": map[string]any{"tokens": map[string]any{"quota": -1}}})
	key := b.apiKey(t, org)
	for _, raw := range []string{"9007199254740993", "4611686018427387904", "9223372036854775807", "1000000000000001", "99999999999999999999"} {
		r := b.call(t, "POST", "/v1/admit", serviceToken, `{"account":"`+org+`","units":{"tokens":`+raw+`}}`)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", raw, r.Raw)
		require.Equal(t, "invalid_units", errCode(r), raw)
		require.Contains(t, r.Body["error"].(map[string]any)["message"], "units.tokens", raw)

		c := b.check(t, "GET", "/v1/check", serviceToken, map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": raw})
		require.Equal(t, http.StatusBadRequest, c.Status, "%s: %s", raw, c.Raw)
		require.Equal(t, "invalid_units", errCode(c), raw)

		o := b.call(t, "POST", "/v1/outcomes", serviceToken, `{"event_id":"x","status":200,"units":{"tokens":`+raw+`}}`)
		require.Equal(t, http.StatusBadRequest, o.Status, "%s: %s", raw, o.Raw)
		require.Equal(t, "invalid_units", errCode(o), raw)
	}
	r := b.call(t, "POST", "/v1/admit", serviceToken, `{"account":"`+org+`","units":{"tokens":1000000000000000}}`)
	require.Equal(t, http.StatusOK, r.Status, "10^15 is the largest amount: %s", r.Raw)
	require.Equal(t, float64(1_000_000_000_000_000), b.usage(t, org)["tokens"])
}

// Estimates of large bodies run at most MaxEstimates at once: one more waits a second for
// a slot, then gets 503 busy with Retry-After.
func TestEstimatesBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxEstimates: 1})
	// Straight to the server: the contract checker in front of b.url reads a body whole
	// before the server sees it.
	direct := httptest.NewServer(b.srv)
	t.Cleanup(direct.Close)
	b.url = direct.URL
	// A body sent slowly holds the one slot while it is read.
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	held := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest("POST", b.url+"/v1/estimate", pr)
		req.Header.Set("Authorization", "Bearer "+serviceToken)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		held <- resp
	}()
	_, err := pw.Write([]byte(`{"request":{"model":"gpt-4o","messages":[{"role":"user","content":"`))
	require.NoError(t, err)

	body := `{"request":{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}]}}`
	deadline := time.Now().Add(20 * time.Second)
	var busy reply
	for { // until the slow request holds the slot
		busy = b.call(t, "POST", "/v1/estimate", serviceToken, body)
		if busy.Status == http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
	}
	require.Equal(t, http.StatusServiceUnavailable, busy.Status, busy.Raw)
	require.Equal(t, "busy", errCode(busy))
	require.Equal(t, "1", busy.Header.Get("Retry-After"))

	_, err = pw.Write([]byte(strings.Repeat("word ", 100) + `"}]}}`))
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	resp := <-held
	require.NotNil(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	r := b.call(t, "POST", "/v1/estimate", serviceToken, body)
	require.Equal(t, http.StatusOK, r.Status, "the slot is free again: %s", r.Raw)
}

// The stream-done call settles every unit the upstream reports: a descriptor naming its
// unit (RLS.Unit) counts that unit.
func TestRLSStreamDoneSettlesCredits(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true})
	org := b.id("org")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	key := b.apiKey(t, org)
	first := b.mustShould(t, desc("api_key", key))
	id := rlsEventID(first)
	require.NotEmpty(t, id)
	done := b.mustShould(t, hits(desc("event_id", id), 1234), hits(desc("event_id", id, "unit", "credits"), 7))
	require.Equal(t, rlsv3.RateLimitResponse_OK, done.GetOverallCode(), "%s", done.GetRawBody())
	require.Equal(t, []event.Outcome{{EventID: id, Status: 200, Units: map[string]int64{"tokens": 1234, "credits": 7}}}, b.outcomes(t, org, id))

	_, err := b.should(t, serviceToken, hits(desc("event_id", id, "unit", "gpus"), 1))
	require.Error(t, err, "an unknown unit")
	_, err = b.should(t, serviceToken, hits(desc("event_id", id, "unit", "credits"), 1), hits(desc("event_id", id, "unit", "credits"), 2))
	require.Error(t, err, "a unit counted twice")
	_, err = b.should(t, serviceToken, desc("api_key", key, "unit", "credits"))
	require.Error(t, err, "a unit entry belongs to the stream-done call")
}

// outcomes are the outcome events of event id in the outbox of org's shard.
func (b *testBundle) outcomes(t *testing.T, org, id string) []event.Outcome {
	t.Helper()
	entries, err := b.rdb.XRange(testenv.Context(t, 10*time.Second), b.keys.Outbox(b.keys.Shard(org)), "-", "+").Result()
	require.NoError(t, err)
	var out []event.Outcome
	for _, e := range entries {
		_, v, err := wire.OutboxMessage(e.Values)
		require.NoError(t, err)
		var ev event.CloudEvent
		require.NoError(t, json.Unmarshal(v, &ev))
		if ev.Type != event.TypeOutcome {
			continue
		}
		var o event.Outcome
		require.NoError(t, json.Unmarshal(ev.Data, &o))
		if o.EventID == id {
			out = append(out, o)
		}
	}
	return out
}
