package api_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// The seeds' tree through the admin API; a request that would take agent-1 past its
// 25,000 tokens/h is 429 naming agent-1, with the RateLimit fields and Retry-After.
func TestSeedsTree(t *testing.T) {
	t.Parallel()
	onRedisAndCluster(t, func(t *testing.T, o setupOpts) {
		b := setup(t, o)
		tokensPerHour := func(n int) map[string]any {
			return map[string]any{"tokens": map[string]any{"limit": n, "window_s": 3600}}
		}
		org, eng, alice, agent := b.id("acme"), b.id("engineering"), b.id("alice"), b.id("agent-1")
		b.account(t, map[string]any{"id": org, "kind": "org", "plan": "enterprise", "limits": tokensPerHour(1_000_000)})
		b.account(t, map[string]any{"id": eng, "kind": "team", "parent": org, "limits": tokensPerHour(500_000)})
		b.account(t, map[string]any{"id": alice, "kind": "user", "parent": eng, "limits": tokensPerHour(100_000)})
		b.account(t, map[string]any{"id": agent, "kind": "agent", "parent": alice, "limits": tokensPerHour(25_000)})
		key := b.apiKey(t, agent)
		b.waitResolvable(t, agent)

		r := b.admit(t, map[string]any{"api_key": key, "units": map[string]any{"requests": 1, "tokens": 20_000}})
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		require.Equal(t, "allow", r.Body["decision"])
		require.Equal(t, agent, r.Body["account"])
		require.Equal(t, org, r.Body["org"])
		require.Regexp(t, `^\d{4}-\d{2}$`, r.Body["period"])
		require.NotEmpty(t, r.Body["event_id"])
		require.NotEmpty(t, r.Header.Get("RateLimit-Policy"))
		require.Regexp(t, `^"[^"]+";r=\d+;t=\d+`, r.Header.Get("RateLimit"))

		r = b.admit(t, map[string]any{"api_key": key, "units": map[string]any{"requests": 1, "tokens": 6_000}})
		require.Equal(t, http.StatusTooManyRequests, r.Status, r.Raw)
		require.Equal(t, "rate_limited", r.Body["decision"])
		require.Equal(t, map[string]any{"account": agent, "level": "agent", "unit": "tokens"}, r.Body["blocked_by"])
		retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
		require.NoError(t, err)
		require.GreaterOrEqual(t, retry, 1)
		ms := r.Body["retry_after_ms"].(float64)
		require.Equal(t, int((time.Duration(ms)*time.Millisecond+time.Second-1)/time.Second), retry, "Retry-After is retry_after_ms rounded up")
		require.Contains(t, r.Header.Get("RateLimit"), `"`+agent+`-tokens";r=`)
	})
}

// A free key firing 30 requests at once: 20 allowed, 10 get 429 with Retry-After.
func TestFreeBurst(t *testing.T) {
	t.Parallel()
	onRedisAndCluster(t, func(t *testing.T, o setupOpts) {
		b := setup(t, o)
		org := b.id("free")
		b.account(t, map[string]any{"id": org, "kind": "org", "plan": "free"})
		key := b.apiKey(t, org)
		b.waitResolvable(t, org)

		var mu sync.Mutex
		counts := map[int]int{}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r := b.admit(t, map[string]any{"api_key": key})
				mu.Lock()
				defer mu.Unlock()
				counts[r.Status]++
				if r.Status == http.StatusTooManyRequests {
					require.NotEmpty(t, r.Header.Get("Retry-After"))
				}
			}()
		}
		close(start)
		wg.Wait()
		// 10/s refill: a slow machine may refill one or two tokens while the 30 are in flight.
		require.GreaterOrEqual(t, counts[200], 20)
		require.LessOrEqual(t, counts[200], 22)
		require.Equal(t, 30, counts[200]+counts[429], "%v", counts)
	})
}

func TestClientErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org := b.id("errs")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	key := b.apiKey(t, org)
	b.waitResolvable(t, org)

	k := b.call(t, "POST", "/v1/admin/api-keys", adminToken, map[string]any{"account": org})
	require.Equal(t, 201, k.Status)
	revoked := k.Body["api_key"].(string)
	del := b.call(t, "DELETE", "/v1/admin/api-keys/"+k.Body["id"].(string), adminToken, nil)
	require.Equal(t, http.StatusNoContent, del.Status, del.Raw)
	// Wait until the cache has seen the revocation (LISTEN/NOTIFY); a key it has not loaded
	// yet is unknown, not revoked.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, err := b.cache.Authenticate(revoked); errors.Is(err, policy.ErrRevoked) {
			break
		}
		require.True(t, time.Now().Before(deadline), "revocation never reached the cache")
		time.Sleep(5 * time.Millisecond)
	}

	r := b.admit(t, map[string]any{"api_key": key, "idempotency_key": "same", "units": map[string]any{"requests": 1}})
	require.Equal(t, 200, r.Status, r.Raw)

	tests := []struct {
		name   string
		method string
		path   string
		token  string
		body   any
		status int
		code   string
	}{
		{"bad json", "POST", "/v1/admit", serviceToken, `{"api_key":`, 400, "invalid_json"},
		{"unknown field", "POST", "/v1/admit", serviceToken, `{"api_key":"x","x":1}`, 400, "unknown_field"},
		{"negative units", "POST", "/v1/admit", serviceToken, `{"api_key":"x","units":{"tokens":-1}}`, 400, "invalid_units"},
		{"fractional units", "POST", "/v1/admit", serviceToken, `{"api_key":"x","units":{"tokens":0.5}}`, 400, "invalid_units"},
		{"unknown unit", "POST", "/v1/admit", serviceToken, `{"api_key":"x","units":{"gpu":1}}`, 400, "unknown_unit"},
		{"long idempotency key", "POST", "/v1/admit", serviceToken, `{"api_key":"x","idempotency_key":"` + strings.Repeat("a", 256) + `"}`, 400, "invalid_idempotency_key"},
		{"body over 64 KiB", "POST", "/v1/admit", serviceToken, `{"api_key":"` + strings.Repeat("a", 70_000) + `"}`, 400, "body_too_large"},
		{"no token", "POST", "/v1/admit", "", `{"api_key":"x"}`, 401, "unauthorized"},
		{"wrong token", "POST", "/v1/admit", "nope", `{"api_key":"x"}`, 401, "unauthorized"},
		{"unknown api key", "POST", "/v1/admit", serviceToken, `{"api_key":"mgk_unknown"}`, 401, "unknown_api_key"},
		{"unknown account", "POST", "/v1/admit", serviceToken, `{"account":"nobody-here"}`, 401, "unknown_account"},
		{"revoked key", "POST", "/v1/admit", serviceToken, map[string]any{"api_key": revoked}, 403, "revoked_api_key"},
		{"idempotency key reused", "POST", "/v1/admit", serviceToken, map[string]any{"api_key": key, "idempotency_key": "same", "units": map[string]any{"requests": 2}}, 422, "idempotency_key_reused"},
		{"admin with service token", "GET", "/v1/admin/accounts/" + org, serviceToken, nil, 403, "forbidden"},
		{"decision with admin token", "POST", "/v1/admit", adminToken, map[string]any{"account": org}, 403, "forbidden"},
		{"admin without token", "GET", "/v1/admin/accounts/" + org, "", nil, 401, "unauthorized"},
		{"bad account id", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": "bad id!", "kind": "org"}, 400, ""},
		{"unknown kind", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("k"), "kind": "galaxy"}, 400, ""},
		{"duplicate account", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": org, "kind": "org"}, 409, "exists"},
		{"missing account", "GET", "/v1/admin/accounts/" + b.id("ghost"), adminToken, nil, 404, "not_found"},
		{"bad outcome", "POST", "/v1/outcomes", serviceToken, `{"event_id":"x","status":42}`, 400, "invalid_status"},
		{"usage of bad id", "GET", "/v1/usage/bad%20id", serviceToken, nil, 400, "invalid_account"},
		{"unknown route", "POST", "/v1/nothing", serviceToken, nil, 404, "not_found"},
		{"unknown version", "POST", "/v2/admit", serviceToken, nil, 404, "not_found"},
		{"wrong method", "GET", "/v1/admit", serviceToken, nil, 405, "method_not_allowed"},
		{"wrong method on openapi", "POST", "/openapi.yaml", "", nil, 405, "method_not_allowed"},
		// The document refuses each of these too (apitest checks it) ...
		{"no credentials", "POST", "/v1/admit", serviceToken, `{"units":{"requests":1}}`, 400, "missing_credentials"},
		{"both credentials", "POST", "/v1/admit", serviceToken, map[string]any{"api_key": key, "account": org}, 400, "ambiguous_account"},
		{"bad account", "POST", "/v1/admit", serviceToken, `{"account":"-x"}`, 400, "invalid_account"},
		{"idempotency key with a space", "POST", "/v1/admit", serviceToken, `{"api_key":"x","idempotency_key":"a b"}`, 400, "invalid_idempotency_key"},
		{"units as a string", "POST", "/v1/admit", serviceToken, `{"api_key":"x","units":{"tokens":"5"}}`, 400, "invalid_units"},
		{"no body", "POST", "/v1/admit", serviceToken, nil, 400, "invalid_json"},
		{"malformed event id", "POST", "/v1/outcomes", serviceToken, `{"event_id":"x","status":200}`, 400, "invalid_event_id"},
		{"outcome without status", "POST", "/v1/outcomes", serviceToken, `{"event_id":"0196a0c4-7b1e-7c3a-9f00-0123456789ab.0.` + org + `"}`, 400, "invalid_status"},
		{"team without parent", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("orphan"), "kind": "team"}, 400, "invalid_parent"},
		{"org with a parent", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("rooted"), "kind": "org", "parent": org}, 400, "invalid_parent"},
		{"negative concurrency", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("c"), "kind": "org", "concurrency": -1}, 400, "invalid_concurrency"},
		{"concurrency past int32", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("c"), "kind": "org", "concurrency": 3_000_000_000}, 400, "invalid_concurrency"},
		{"plan that is no id", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("p"), "kind": "org", "plan": "no plan!"}, 400, "invalid_plan"},
		{"limit of an unknown unit", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("l"), "kind": "org", "limits": map[string]any{"gpus": map[string]any{"quota": 1}}}, 400, "invalid_limits"},
		{"negative quota", "PUT", "/v1/admin/accounts/" + org, adminToken, map[string]any{"limits": map[string]any{"requests": map[string]any{"quota": -2}}}, 400, "invalid_limits"},
		{"api key of a bad id", "POST", "/v1/admin/api-keys", adminToken, map[string]any{"account": "bad id"}, 400, "invalid_account"},
		{"api key without account", "POST", "/v1/admin/api-keys", adminToken, `{}`, 400, "invalid_account"},
		// ... and these it cannot (apitest.Inexpressible says why).
		{"units written 1.0", "POST", "/v1/admit", serviceToken, `{"api_key":"x","units":{"tokens":1.0}}`, 400, "invalid_units"},
		{"data after the object", "POST", "/v1/admit", serviceToken, `{"api_key":"x"} {}`, 400, "invalid_json"},
		{"unknown tool", "POST", "/v1/admit", serviceToken, `{"api_key":"x","tool":"teleport"}`, 400, "unknown_tool"},
		{"event id of another shard", "POST", "/v1/outcomes", serviceToken, `{"event_id":"0196a0c4-7b1e-7c3a-9f00-0123456789ab.999.` + org + `","status":200}`, 400, "invalid_event_id"},
		{"unknown plan", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("p"), "kind": "org", "plan": "platinum"}, 400, "invalid_plan"},
		{"parent that does not exist", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("lost"), "kind": "team", "parent": b.id("ghost")}, 400, "invalid_parent"},
		{"limit without a burst", "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("l"), "kind": "org", "limits": map[string]any{"tokens": map[string]any{"rate_per_s": 5}}}, 400, "invalid_limits"},
		{"burst written 1.0", "POST", "/v1/admin/accounts", adminToken, `{"id":"` + b.id("l") + `","kind":"org","limits":{"tokens":{"rate_per_s":1,"burst":1.0}}}`, 400, "invalid_field"},
		{"another id in the body", "PUT", "/v1/admin/accounts/" + org, adminToken, map[string]any{"id": b.id("other")}, 400, "invalid_id"},
		{"another kind", "PUT", "/v1/admin/accounts/" + org, adminToken, map[string]any{"kind": "team"}, 400, "invalid_kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.call(t, tt.method, tt.path, tt.token, tt.body)
			require.Equal(t, tt.status, r.Status, r.Raw)
			errObj, ok := r.Body["error"].(map[string]any)
			require.True(t, ok, "JSON error body: %s", r.Raw)
			require.NotEmpty(t, errObj["message"])
			if tt.status == 405 {
				require.NotEmpty(t, r.Header.Get("Allow"))
			}
			if tt.code != "" {
				require.Equal(t, tt.code, errObj["code"])
			} else {
				require.NotEmpty(t, errObj["code"])
			}
		})
	}
}

// Idempotency through the API: the same key twice returns the same event id and charges once.
func TestIdempotentRetryAndUsage(t *testing.T) {
	t.Parallel()
	onRedisAndCluster(t, func(t *testing.T, o setupOpts) {
		b := setup(t, o)
		org := b.id("idem")
		b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro", "limits": map[string]any{"requests": map[string]any{"rate_per_s": 100, "burst": 300, "quota": 10}}})
		b.waitResolvable(t, org)
		first := b.admit(t, map[string]any{"account": org, "idempotency_key": "retry-1"})
		again := b.admit(t, map[string]any{"account": org, "idempotency_key": "retry-1"})
		require.Equal(t, 200, first.Status, first.Raw)
		require.Equal(t, 200, again.Status, again.Raw)
		require.Equal(t, first.Body["event_id"], again.Body["event_id"])
		require.Equal(t, true, again.Body["replayed"])

		u := b.call(t, "GET", "/v1/usage/"+org, serviceToken, nil)
		require.Equal(t, 200, u.Status, u.Raw)
		req := u.Body["units"].(map[string]any)["requests"].(map[string]any)
		require.Equal(t, float64(1), req["used"], "charged once")
		require.Equal(t, float64(10), req["quota"])
		require.Equal(t, float64(9), req["remaining"])

		for range 9 {
			require.Equal(t, 200, b.admit(t, map[string]any{"account": org}).Status)
		}
		r := b.admit(t, map[string]any{"account": org})
		require.Equal(t, http.StatusPaymentRequired, r.Status, r.Raw)
		require.Equal(t, "quota_exceeded", r.Body["decision"])
		require.Equal(t, map[string]any{"account": org, "level": "org", "unit": "requests"}, r.Body["blocked_by"])
		require.Equal(t, first.Body["period"], r.Body["period"])

		out := b.call(t, "POST", "/v1/outcomes", serviceToken, map[string]any{"event_id": first.Body["event_id"], "status": 503, "units": map[string]any{"tokens": 10}})
		require.Equal(t, http.StatusAccepted, out.Status, out.Raw)
	})
}

// A PUT returns once its own node enforces the change: the next admission there is decided
// with it. (Every other node within 1 s of the commit: cmd/admit
// TestPolicyChangeReachesEveryNodeWithinOneSecond.)
func TestPolicyChangeEnforcedWhenThePutReturns(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org := b.id("upgrade")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "free", "limits": map[string]any{"requests": map[string]any{"quota": 1}}})
	b.waitResolvable(t, org)
	require.Equal(t, 200, b.admit(t, map[string]any{"account": org}).Status)
	require.Equal(t, http.StatusPaymentRequired, b.admit(t, map[string]any{"account": org}).Status)

	r := b.call(t, "PUT", "/v1/admin/accounts/"+org, adminToken, map[string]any{"plan": "pro", "limits": map[string]any{"requests": map[string]any{"quota": 100}}})
	require.Equal(t, 200, r.Status, r.Raw)
	require.Equal(t, 200, b.admit(t, map[string]any{"account": org}).Status, "the upgrade is enforced when the PUT returns")
	require.Equal(t, "pro", effective(t, r)["plan"], "the PUT reply shows the new effective policy")
	g := b.call(t, "GET", "/v1/admin/accounts/"+org, adminToken, nil)
	require.Equal(t, 200, g.Status)
	require.Equal(t, "pro", effective(t, g)["plan"])
	created := b.call(t, "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": b.id("fresh"), "kind": "org", "plan": "pro"})
	require.Equal(t, 201, created.Status, created.Raw)
	require.Equal(t, b.id("fresh"), effective(t, created)["org"], "the POST reply shows the effective policy")
}

// effective returns the effective policy of an account reply; it is left out only when the
// cache did not load the write within 2 s.
func effective(t *testing.T, r reply) map[string]any {
	t.Helper()
	e, ok := r.Body["effective"].(map[string]any)
	require.True(t, ok, "no effective policy in %s", r.Raw)
	return e
}

// Redis unavailable: quota-bearing accounts fail closed with 503 and Retry-After;
// rate-only accounts fail open, their event written straight to Kafka.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{rdb: deadRedis(t), recorder: true})
	quota, rateOnly := b.id("quota"), b.id("rate-only")
	b.account(t, map[string]any{"id": quota, "kind": "org", "plan": "pro"})
	b.account(t, map[string]any{"id": rateOnly, "kind": "org", "plan": "enterprise"}) // uncapped quota
	b.waitResolvable(t, quota)
	b.waitResolvable(t, rateOnly)

	r := b.admit(t, map[string]any{"account": quota})
	require.Equal(t, http.StatusServiceUnavailable, r.Status, r.Raw)
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	require.Zero(t, b.metric(t, "metergate_admit_voids_total", nil)+b.metric(t, "metergate_admit_voids_pending", nil),
		"a call that never reached Redis decided nothing to void")

	r = b.admit(t, map[string]any{"account": rateOnly, "units": map[string]any{"requests": 1, "tokens": 42}})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Equal(t, true, r.Body["fail_open"])
	id := r.Body["event_id"].(string)

	ev := b.recorded(t, rateOnly)
	require.Equal(t, id, ev.ID)
	require.Equal(t, event.TypeAdmitted, ev.Type)
	require.Equal(t, "1.0", ev.SpecVersion)
	var data event.Admitted
	require.NoError(t, json.Unmarshal(ev.Data, &data))
	require.True(t, data.FailOpen)
	require.Equal(t, int64(42), data.Units["tokens"])
}

// deadRedis is a client of a Redis that is not there.
func deadRedis(t *testing.T) *redis.Client {
	dead := redis.NewClient(&redis.Options{Addr: testenv.FreeAddr(t), DialTimeout: 200 * time.Millisecond, MaxRetries: -1,
		DialerRetries: 1})
	t.Cleanup(func() { _ = dead.Close() })
	return dead
}

// recorded is the first event the Kafka recorder wrote, which must be keyed by org.
func (b *testBundle) recorded(t *testing.T, org string) event.CloudEvent {
	t.Helper()
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: testenv.KafkaBrokers(t), Topic: b.topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rd.Close() })
	msg, err := rd.ReadMessage(testenv.Context(t, time.Minute))
	require.NoError(t, err)
	require.Equal(t, org, string(msg.Key))
	var ev event.CloudEvent
	require.NoError(t, json.Unmarshal(msg.Value, &ev))
	return ev
}

// Redis and Kafka both unavailable: a rate-only account is denied (503), because an
// admission that cannot be recorded is not made.
func TestRedisAndKafkaDown(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{rdb: deadRedis(t), deadKafka: true})
	rateOnly := b.id("rate-only")
	b.account(t, map[string]any{"id": rateOnly, "kind": "org", "plan": "enterprise"})
	b.waitResolvable(t, rateOnly)
	r := b.admit(t, map[string]any{"account": rateOnly})
	require.Equal(t, http.StatusServiceUnavailable, r.Status, r.Raw)
	require.Equal(t, "unavailable", r.Body["error"].(map[string]any)["code"])
	require.NotEmpty(t, r.Header.Get("Retry-After"))
}

// A node whose policy cache has not loaded yet (just started, PostgreSQL slow) answers the
// service API with 503 policies_loading and Retry-After, never 401 for a valid key.
func TestPoliciesNotLoaded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{unloaded: true})
	for _, path := range []string{"/v1/admit", "/v1/outcomes"} {
		r := b.call(t, "POST", path, serviceToken, map[string]any{"api_key": "mg_whatever", "units": map[string]any{"requests": 1}})
		require.Equal(t, http.StatusServiceUnavailable, r.Status, r.Raw)
		require.Equal(t, "policies_loading", r.Body["error"].(map[string]any)["code"], r.Raw)
		require.Equal(t, "1", r.Header.Get("Retry-After"))
	}
	require.Equal(t, http.StatusUnauthorized, b.call(t, "POST", "/v1/admit", "", map[string]any{}).Status, "credentials come first")
}
