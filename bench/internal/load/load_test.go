package load

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testBundle is a server that records what it was sent.
type testBundle struct {
	srv    *httptest.Server
	served atomic.Int64

	mu     sync.Mutex
	bodies [][]byte
	auth   map[string]int
}

// setup starts a server that answers status(n) for its n-th request (from 1), after delay.
func setup(t *testing.T, delay time.Duration, status func(n int64) int) *testBundle {
	t.Helper()
	b := &testBundle{auth: map[string]int{}}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		n := b.served.Add(1)
		b.mu.Lock()
		b.bodies = append(b.bodies, body)
		b.auth[r.Header.Get("Authorization")]++
		b.mu.Unlock()
		if delay > 0 {
			time.Sleep(delay) // the latency under test, not synchronisation
		}
		w.WriteHeader(status(n))
		_, _ = w.Write([]byte(`{"decision":"allow"}`))
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func ok(int64) int { return http.StatusOK }

func config(t *testing.T, b *testBundle) Config {
	t.Helper()
	tmpl, err := NewTemplate(`{"units":{"requests":1}}`, nil, false)
	require.NoError(t, err)
	return Config{URL: b.srv.URL, Body: tmpl, Concurrency: 4, Duration: 500 * time.Millisecond,
		LateAfter: 5 * time.Millisecond, Timeout: 5 * time.Second}
}

func TestClosedLoopCountsStatuses(t *testing.T) {
	t.Parallel()
	b := setup(t, 0, func(n int64) int {
		if n%2 == 0 {
			return http.StatusTooManyRequests
		}
		return http.StatusOK
	})
	cfg := config(t, b)
	cfg.Token = "svc-test"

	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)

	require.Equal(t, "closed", res.Mode)
	require.Positive(t, res.Requests)
	require.Zero(t, res.Errors)
	// No warmup: every request the server saw was measured.
	require.Equal(t, b.served.Load(), res.Requests)
	require.Equal(t, res.Requests, res.Status["200"]+res.Status["429"])
	require.InDelta(t, res.Status["200"], res.Status["429"], 1)
	require.Equal(t, map[string]int{"Bearer svc-test": int(res.Requests)}, b.auth)
	require.InDelta(t, float64(res.Requests)/res.DurationS, res.Rate, 1e-6)
	require.GreaterOrEqual(t, res.DurationS, 0.5)
}

func TestWarmupIsNotMeasured(t *testing.T) {
	t.Parallel()
	b := setup(t, 0, ok)
	cfg := config(t, b)
	cfg.Warmup = 300 * time.Millisecond
	cfg.Duration = 300 * time.Millisecond

	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Positive(t, res.Requests)
	require.Less(t, res.Requests, b.served.Load(), "warmup requests were counted")
	require.Equal(t, b.served.Load(), res.Sent, "Sent counts the warmup too")
	require.InDelta(t, 0.3, res.DurationS, 0.2)
}

func TestLatencyReflectsServerDelay(t *testing.T) {
	t.Parallel()
	const delay = 20 * time.Millisecond
	b := setup(t, delay, ok)
	cfg := config(t, b)
	cfg.Duration = 400 * time.Millisecond

	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Positive(t, res.Requests)
	l := res.Latency
	require.GreaterOrEqual(t, l.P50, ms(delay))
	require.Less(t, l.P50, ms(10*delay), "2 shared cores are slow, not that slow")
	require.LessOrEqual(t, l.P50, l.P90)
	require.LessOrEqual(t, l.P90, l.P99)
	require.LessOrEqual(t, l.P99, l.Max)
	// 4 workers, each at most one request per delay.
	require.LessOrEqual(t, res.Rate, 4/delay.Seconds()*1.1)
}

func TestOpenLoopHoldsTheRate(t *testing.T) {
	t.Parallel()
	b := setup(t, 0, ok)
	cfg := config(t, b)
	cfg.Rate = 200
	cfg.Warmup = 200 * time.Millisecond
	cfg.Duration = time.Second

	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Equal(t, "open", res.Mode)
	require.Equal(t, 200.0, res.TargetRate)
	// A loaded CI machine (-race, 2 cores, every package at once) sends the last slots of
	// the window late or not at all (two runs: 189 sent, 3 unsent): 15 % is its allowance.
	// A closed loop on this fast server would send thousands, and a stalled one none.
	require.InEpsilon(t, 200, res.Rate, 0.25)
	require.InDelta(t, 200, res.Requests, 30)
	// Nothing beyond the schedule went out: the warmup's 40 slots and the window's 200.
	require.LessOrEqual(t, b.served.Load(), int64(240+10))
	require.Greater(t, b.served.Load(), int64(240-30))
	require.LessOrEqual(t, res.Unsent, int64(30), "a fast server leaves at most the late few unsent")
}

// A server slower than the schedule: latency is counted from when each request was due, so
// it grows with the queue instead of staying at the server's delay (coordinated omission),
// and the requests that waited are reported.
func TestOpenLoopCountsFromDueTime(t *testing.T) {
	t.Parallel()
	const delay = 50 * time.Millisecond
	b := setup(t, delay, ok)
	cfg := config(t, b)
	cfg.Concurrency = 1 // at most 20/s
	cfg.Rate = 100
	cfg.Duration = time.Second

	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.LessOrEqual(t, res.Requests, int64(25))
	require.Positive(t, res.Late)
	require.Greater(t, res.MaxSendDelayMS, ms(4*delay))
	require.GreaterOrEqual(t, res.Unsent, int64(100-25))
	require.Greater(t, res.Latency.P90, ms(4*delay), "latency measured from send, not due time")
	require.Less(t, res.Rate, 30.0)
}

func TestTransportErrorsAreCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, 0, ok)
	cfg := config(t, b)
	cfg.Duration = 100 * time.Millisecond
	b.srv.Close()

	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Positive(t, res.Errors)
	require.Equal(t, res.Errors, res.Requests)
	require.Empty(t, res.Status)
	require.NotEmpty(t, res.ErrorSamples)
	require.LessOrEqual(t, len(res.ErrorSamples), maxErrorSamples)
}

func TestBodiesCarryItemsAndDistinctIdempotencyKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, 0, ok)
	cfg := config(t, b)
	tmpl, err := NewTemplate(`{"account":"{{item}}","units":{"requests":1}}`, []string{"acme", "globex"}, true)
	require.NoError(t, err)
	cfg.Body = tmpl
	cfg.Duration = 200 * time.Millisecond

	_, err = Run(context.Background(), cfg)
	require.NoError(t, err)

	b.mu.Lock()
	defer b.mu.Unlock()
	require.NotEmpty(t, b.bodies)
	keys := map[string]bool{}
	accounts := map[string]int{}
	for _, raw := range b.bodies {
		var body struct {
			Account        string `json:"account"`
			IdempotencyKey string `json:"idempotency_key"`
		}
		require.NoError(t, json.Unmarshal(raw, &body), string(raw))
		require.NotEmpty(t, body.IdempotencyKey)
		require.False(t, keys[body.IdempotencyKey], "idempotency key %q sent twice", body.IdempotencyKey)
		keys[body.IdempotencyKey] = true
		accounts[body.Account]++
	}
	require.Len(t, accounts, 2)
	require.InDelta(t, accounts["acme"], accounts["globex"], 1)
}

// Requests ends a closed loop after exactly that many requests, each item sent once.
func TestRequestsSendsEachItemOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 0, ok)
	cfg := config(t, b)
	items := []string{"a", "b", "c", "d", "e", "f", "g"}
	tmpl, err := NewTemplate(`{"account":"{{item}}"}`, items, false)
	require.NoError(t, err)
	cfg.Body, cfg.Requests, cfg.Duration = tmpl, uint64(len(items)), time.Minute

	begin := time.Now()
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Less(t, time.Since(begin), 30*time.Second, "the run waited for its duration")
	require.Equal(t, int64(len(items)), res.Sent)
	require.Equal(t, int64(len(items)), b.served.Load())
	b.mu.Lock()
	defer b.mu.Unlock()
	seen := map[string]bool{}
	for _, raw := range b.bodies {
		var body struct{ Account string }
		require.NoError(t, json.Unmarshal(raw, &body))
		seen[body.Account] = true
	}
	require.Len(t, seen, len(items))
}

func TestValidate(t *testing.T) {
	t.Parallel()
	err := Config{Concurrency: 0, Rate: -1}.Validate()
	for _, want := range []string{"url", "body", "concurrency", "duration", "rate"} {
		require.ErrorContains(t, err, want)
	}
	require.ErrorContains(t, Config{Rate: 5, Requests: 3}.Validate(), "requests: for a closed loop only")
}
