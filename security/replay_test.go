package security_test

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api"
)

// Finding 1: a replayed idempotency key never passes a second request through a gateway
// (served = billed). Finding 2: a replayed key costs O(1).
func replayProbes() []probe {
	return []probe{
		{name: "F1a-nginx-replay", desc: "80 requests with one Idempotency-Key through nginx: the app sees at most burst + refill, each with a distinct event id",
			run: func(p *P, s *stack) { gatewayReplay(p, s, s.nginx, "nginx") }},
		{name: "F1a-caddy-replay", desc: "80 requests with one Idempotency-Key through Caddy: the app sees at most burst + refill, each with a distinct event id",
			run: func(p *P, s *stack) { gatewayReplay(p, s, s.caddy, "caddy") }},
		{name: "F1b-check-replay", desc: "GET /v1/check twice with one Idempotency-Key: 200 with an event id, then 409 idempotency_key_replayed with Idempotent-Replayed: true",
			run: checkReplay},
		{name: "F1c-grpc-replay", desc: "ShouldRateLimit twice with one idempotency_key: OK, then OVER_LIMIT with dynamic metadata code idempotency_key_replayed",
			run: grpcReplay},
		{name: "F1d-admit-replay", desc: "POST /v1/admit replayed: 200 \"replayed\": true, Idempotent-Replayed: true, the first event id; the first answer has no such header",
			run: admitReplay},
		{name: "F2-replay-cost", serial: true, desc: fmt.Sprintf("%d replays of one key on POST /v1/admit: 409 idempotency_key_exhausted after at most 16 attempts, the record's Redis hash grows < 2 KB, p50 latency last/first ≤ 3", pick(200, 2000)),
			run: replayCost},
	}
}

// gatewayReplay: a key of burst 5 refilling 2/s sends 80 requests with one Idempotency-Key
// through a gateway; whatever the gateway does with the header, the app must see no more
// requests than the bucket allows, each a billed event of its own.
func gatewayReplay(p *P, s *stack, gw, name string) {
	const burst, rate, requests = 5, 2.0, 80
	org := s.id("replay-" + name)
	s.org(p, org, "free", map[string]any{"requests": map[string]any{"rate_per_s": rate, "burst": burst}})
	key := s.apiKey(p, org)

	begin := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < requests; i += 8 {
				a, err := send(p.Context(), http.MethodGet, gw+"/v1/chat", [][2]string{{"X-Api-Key", key}, {"Idempotency-Key", "one-key"}}, nil)
				mu.Lock()
				if err != nil {
					statuses[-1]++
				} else {
					statuses[a.status]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(begin)

	var events []string
	for _, h := range s.app.Requests() {
		if h.Get(api.AccountHeader) == org {
			events = append(events, h.Get(api.EventIDHeader))
		}
	}
	bound := burst + int(rate*elapsed.Seconds()) + 1
	p.Logf("%s: %d requests in %s: answers %v, the app saw %d (bound %d)", name, requests, elapsed.Round(time.Millisecond), statuses, len(events), bound)
	require.LessOrEqual(p, len(events), bound, "the app saw more requests than the bucket allows (answers %v)", statuses)
	seen := map[string]bool{}
	for _, e := range events {
		require.NotEmpty(p, e, "a request reached the app without an event id")
		require.False(p, seen[e], "the app got event %s twice: one billed event served twice", e)
		seen[e] = true
	}
}

// checkHeaders are the headers of a direct GET /v1/check with key.
func checkHeaders(key string, more ...[2]string) [][2]string {
	return append([][2]string{{"X-Metergate-Token", serviceToken}, {"X-Api-Key", key}}, more...)
}

func checkReplay(p *P, s *stack) {
	org := s.id("check-replay")
	s.org(p, org, "pro", nil)
	key := s.apiKey(p, org)
	first := do(p, http.MethodGet, s.admit+"/v1/check", checkHeaders(key, [2]string{"Idempotency-Key", "ck-1"}), nil)
	require.Equal(p, http.StatusOK, first.status, first.body)
	require.NotEmpty(p, first.header.Get(api.EventIDHeader), "the first check names its event")
	second := do(p, http.MethodGet, s.admit+"/v1/check", checkHeaders(key, [2]string{"Idempotency-Key", "ck-1"}), nil)
	require.NotEqual(p, http.StatusOK, second.status, "a replayed key passed a second request: %s", second)
	require.Equal(p, http.StatusConflict, second.status, second.body)
	require.Equal(p, "idempotency_key_replayed", second.code(), second.body)
	require.Equal(p, "true", second.header.Get(api.ReplayedHeader), "Idempotent-Replayed on the refused replay")
}

func grpcReplay(p *P, s *stack) {
	org := s.id("grpc-replay")
	s.org(p, org, "pro", nil)
	key := s.apiKey(p, org)
	rls := s.rls(p)
	first, err := rls.call(p, descriptor("api_key", key, "idempotency_key", "g-1"))
	require.NoError(p, err)
	require.Equal(p, rlsv3.RateLimitResponse_OK, first.GetOverallCode(), "%v", first)
	second, err := rls.call(p, descriptor("api_key", key, "idempotency_key", "g-1"))
	require.NoError(p, err)
	require.Equal(p, rlsv3.RateLimitResponse_OVER_LIMIT, second.GetOverallCode(), "a replayed key passed a second call: %v", second)
	require.Equal(p, "idempotency_key_replayed", second.GetDynamicMetadata().GetFields()["code"].GetStringValue(), "%v", second)
}

func admitReply(p *P, s *stack, key, idem string) answer {
	p.Helper()
	return post(p, s.admit+"/v1/admit", serviceToken, map[string]any{"api_key": key, "idempotency_key": idem, "units": map[string]any{"requests": 1}})
}

func admitReplay(p *P, s *stack) {
	org := s.id("admit-replay")
	s.org(p, org, "pro", nil)
	key := s.apiKey(p, org)
	first := admitReply(p, s, key, "ad-1")
	require.Equal(p, http.StatusOK, first.status, first.body)
	require.Empty(p, first.header.Get(api.ReplayedHeader), "the first answer is no replay")
	require.NotEqual(p, true, first.json["replayed"], first.body)
	second := admitReply(p, s, key, "ad-1")
	require.Equal(p, http.StatusOK, second.status, second.body)
	require.Equal(p, true, second.json["replayed"], second.body)
	require.Equal(p, "true", second.header.Get(api.ReplayedHeader), "Idempotent-Replayed on the replay")
	require.Equal(p, first.json["event_id"], second.json["event_id"], "the replay names the first event")
}

// replayCost replays one key many times, one at a time: the record stops growing, and so
// does the time a replay takes.
func replayCost(p *P, s *stack) {
	replays := pick(200, 2000)
	org := s.id("replay-cost")
	s.org(p, org, "pro", nil)
	key := s.apiKey(p, org)

	var (
		took      []time.Duration
		answered  int    // 200s
		exhausted = -1   // the first attempt answered 409 idempotency_key_exhausted
		bucket    string // the idempotency hash holding the record
		at20      int64  // its MEMORY USAGE after the 20th replay
	)
	for i := range replays + 1 {
		begin := time.Now()
		a := admitReply(p, s, key, "cost-1")
		took = append(took, time.Since(begin))
		switch {
		case a.status == http.StatusOK && exhausted < 0:
			answered++
		case a.status == http.StatusConflict && a.code() == "idempotency_key_exhausted":
			if exhausted < 0 {
				exhausted = i
			}
		default:
			require.Failf(p, "unexpected answer", "attempt %d (%d answered, first 409 at %d): %d %s", i+1, answered, exhausted, a.status, a.body)
		}
		if i == 20 {
			bucket = idempotencyBucket(p, s, org, "cost-1")
			at20 = memoryUsage(p, s, bucket)
		}
	}
	require.LessOrEqual(p, answered, 16, "replays answered before the key was exhausted")
	require.GreaterOrEqual(p, exhausted, 0, "after %d replays the key is still answered: a record that grows with every replay", replays)
	last := memoryUsage(p, s, bucket)
	p.Logf("%d attempts: %d answered, 409 exhausted from attempt %d; %s: %d bytes after replay 20, %d after the last",
		replays+1, answered, exhausted+1, bucket, at20, last)
	require.LessOrEqual(p, last-at20, int64(2048), "the idempotency hash %s grew from %d to %d bytes between the 20th and the last replay", bucket, at20, last)

	first, lastP50 := p50(took[1:51]), p50(took[len(took)-50:])
	ratio := float64(lastP50) / float64(first)
	p.Logf("p50 of replays 1-50: %s, of the last 50: %s (×%.2f)", first, lastP50, ratio)
	require.LessOrEqual(p, ratio, 3.0, "a replay got slower as the key was replayed: p50 %s → %s", first, lastP50)
}

func p50(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// idempotencyBucket finds the hot bucket "<prefix>{N}:h:<bucket>" holding the record of key
// charged to account: its field is 16 bytes of SHA-256(account, 0, key) (lua/admit.lua,
// internal/admission/keys.go).
func idempotencyBucket(p *P, s *stack, account, key string) string {
	p.Helper()
	sum := sha256.Sum256([]byte(account + "\x00" + key))
	field := string(sum[:16])
	pattern := fmt.Sprintf("%s{%d}:h:*", s.prefix, s.keys.Shard(account))
	iter := s.rdb.Scan(p.Context(), 0, pattern, 1000).Iterator()
	var seen []string
	for iter.Next(p.Context()) {
		k := iter.Val()
		seen = append(seen, k)
		if ok, err := s.rdb.HExists(p.Context(), k, field).Result(); err == nil && ok {
			return k
		}
	}
	require.NoError(p, iter.Err())
	require.Failf(p, "no idempotency record", "no hash of %s holds the record of %q (keys: %s)", pattern, key, strings.Join(seen, ", "))
	return ""
}

func memoryUsage(p *P, s *stack, key string) int64 {
	p.Helper()
	n, err := s.rdb.MemoryUsage(p.Context(), key, 0).Result()
	require.NoError(p, err, "MEMORY USAGE %s", key)
	return n
}
