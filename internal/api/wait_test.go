package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/pkg/event"
)

// Waiting for capacity through the HTTP API (max_wait_ms; docs/admission.md, "Waiting for
// capacity"), on two admit nodes sharing one Redis and one policy store.

// queue is the queue of org's requests bucket (lua/admit.lua "Queues").
func (b *testBundle) queue(org string) string {
	return b.keys.Tag(b.keys.Shard(org)) + "k:" + org + ":r"
}

// stateHash holds the buckets of org's accounts (lua/admit.lua).
func (b *testBundle) stateHash(org string) string {
	return b.keys.Tag(b.keys.Shard(org)) + "s:" + org
}

// waitQueued polls until queue holds n places.
func (b *testBundle) waitQueued(t *testing.T, queue string, n int64) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	for {
		got, err := b.rdb.ZCard(ctx, queue).Result()
		require.NoError(t, err)
		if got == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("queue %s holds %d places, want %d", queue, got, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// admitted lists the event ids of org's usage.admitted events in its outbox.
func (b *testBundle) admitted(t *testing.T, org string) []string {
	t.Helper()
	entries, err := b.rdb.XRange(testenv.Context(t, 10*time.Second), b.keys.Outbox(b.keys.Shard(org)), "-", "+").Result()
	require.NoError(t, err)
	var ids []string
	for _, e := range entries {
		key, v, err := wire.OutboxMessage(e.Values)
		require.NoError(t, err)
		var ev struct{ ID, Type string }
		require.NoError(t, json.Unmarshal(v, &ev))
		if key == org && ev.Type == event.TypeAdmitted {
			ids = append(ids, ev.ID)
		}
	}
	return ids
}

// Waiters of two priorities join one org's queue alternately through two nodes while the
// bucket is held empty; once it refills at 10 a second they are admitted one by one (at
// least 100 ms apart): priority 50 first, first come first served within a priority.
func TestWaitersThroughHTTPByPriorityThenArrival(t *testing.T) {
	t.Parallel()
	wb := setup(t, setupOpts{nodes: 2, maxWait: 2 * time.Minute})
	org := wb.nodes[0].id("org")
	wb.accounts(t,
		map[string]any{"id": org, "kind": "org", "limits": map[string]any{"requests": map[string]any{"rate_per_s": 10, "burst": 1}}},
		map[string]any{"id": org + "-low", "kind": "team", "parent": org, "priority": 0},
		map[string]any{"id": org + "-high", "kind": "team", "parent": org, "priority": 50})
	ctx := testenv.Context(t, 2*time.Minute)
	queue, field := wb.queue(org), org+":r"
	// Empty for the next 30 s: nobody is admitted while the waiters join.
	now, err := wb.nodes[0].rdb.Time(ctx).Result()
	require.NoError(t, err)
	require.NoError(t, wb.nodes[0].rdb.HSet(ctx, wb.stateHash(org), field, now.Add(30*time.Second).UnixMicro()).Err())

	arrivals := []struct{ name, account string }{
		{"low-1", "-low"}, {"low-2", "-low"}, {"high-1", "-high"}, {"low-3", "-low"}, {"high-2", "-high"},
	}
	var (
		mu      sync.Mutex
		order   []string
		replies = map[string]reply{}
		wg      sync.WaitGroup
	)
	for i, a := range arrivals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := wb.nodes[i%2].admit(t, map[string]any{"account": org + a.account, "max_wait_ms": 60_000})
			mu.Lock()
			defer mu.Unlock()
			order = append(order, a.name)
			replies[a.name] = r
		}()
		wb.waitQueued(t, queue, int64(i+1))
	}
	// Full again: the head's node finds out within a second (its poll).
	require.NoError(t, wb.nodes[0].rdb.HDel(ctx, wb.stateHash(org), field).Err())
	wg.Wait()
	for name, r := range replies {
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", name, r.Raw)
		waited, ok := r.Body["waited_ms"].(float64)
		require.True(t, ok, "%s: no waited_ms: %s", name, r.Raw)
		require.Positive(t, waited, name)
	}
	require.Equal(t, []string{"high-1", "high-2", "low-1", "low-2", "low-3"}, order)
	wb.waitQueued(t, queue, 0)
	require.Zero(t, wb.errors.Load(), "errors logged")
}

// A waiter whose max_wait_ms runs out behind another is refused as it would have been
// without waiting: 429 naming the limit, with retry_after_ms and Retry-After.
func TestWaiterOutOfTime(t *testing.T) {
	t.Parallel()
	wb := setup(t, setupOpts{nodes: 2, maxWait: 30 * time.Second})
	org := wb.nodes[0].id("org")
	// A request a second.
	wb.accounts(t, map[string]any{"id": org, "kind": "org", "limits": map[string]any{"requests": map[string]any{"rate_per_s": 1, "burst": 1}}})
	first := wb.nodes[0].admit(t, map[string]any{"account": org})
	require.Equal(t, http.StatusOK, first.Status, first.Raw)
	_, hasWaited := first.Body["waited_ms"]
	require.False(t, hasWaited, "waited_ms without max_wait_ms: %s", first.Raw)

	// One waiter ahead takes the next token, in a second; the one behind it may wait 1.5 s,
	// which is enough for a token but not for two: it waits, then is refused.
	ahead := make(chan reply, 1)
	go func() { ahead <- wb.nodes[0].admit(t, map[string]any{"account": org, "max_wait_ms": 10_000}) }()
	wb.waitQueued(t, wb.queue(org), 1)
	behind := make(chan reply, 1)
	go func() { behind <- wb.nodes[1].admit(t, map[string]any{"account": org, "max_wait_ms": 1500}) }()
	wb.waitQueued(t, wb.queue(org), 2)
	a := <-ahead
	require.Equal(t, http.StatusOK, a.Status, a.Raw)
	r := <-behind
	require.Equal(t, http.StatusTooManyRequests, r.Status, r.Raw)
	require.Equal(t, map[string]any{"account": org, "level": "org", "unit": "requests"}, r.Body["blocked_by"])
	require.Contains(t, r.Body, "retry_after_ms")
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	// It waited for the token the one ahead took (a second less the time it joined after).
	require.Greater(t, r.Body["waited_ms"], float64(800))
	require.LessOrEqual(t, r.Body["waited_ms"], float64(1500+500))
	wb.waitQueued(t, wb.queue(org), 0)
	require.Zero(t, wb.errors.Load(), "errors logged")
}

// A caller that hangs up while its request waits leaves the queue at once, is charged
// nothing (no usage.admitted event) and logs no error.
func TestWaiterHangsUp(t *testing.T) {
	t.Parallel()
	wb := setup(t, setupOpts{nodes: 2, maxWait: 30 * time.Second})
	org := wb.nodes[0].id("org")
	// A request every 10 s.
	wb.accounts(t, map[string]any{"id": org, "kind": "org", "limits": map[string]any{"requests": map[string]any{"rate_per_s": 0.1, "burst": 1}}})
	first := wb.nodes[0].admit(t, map[string]any{"account": org})
	require.Equal(t, http.StatusOK, first.Status, first.Raw)

	ctx, cancel := context.WithCancel(testenv.Context(t, time.Minute))
	defer cancel()
	raw, err := json.Marshal(map[string]any{"account": org, "max_wait_ms": 20_000})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, wb.nodes[1].url+"/v1/admit", bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+serviceToken)
	gone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			err = errors.New("answered " + resp.Status)
		}
		gone <- err
	}()
	wb.waitQueued(t, wb.queue(org), 1)
	cancel()
	require.ErrorIs(t, <-gone, context.Canceled)
	wb.waitQueued(t, wb.queue(org), 0)
	require.Equal(t, []string{first.Body["event_id"].(string)}, wb.admitted(t, org), "only the first request is charged")
	require.Zero(t, wb.errors.Load(), "errors logged")
}

// max_wait_ms must be a whole number of milliseconds from 0 to ADMIT_MAX_WAIT; a node
// with ADMIT_MAX_WAIT=0 takes only 0.
func TestInvalidMaxWait(t *testing.T) {
	t.Parallel()
	wb := setup(t, setupOpts{nodes: 2, maxWait: 2 * time.Second})
	org := wb.nodes[0].id("org")
	wb.accounts(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	for _, tc := range []struct {
		body    string
		message string
	}{
		{`-1`, "whole number"},
		{`1.5`, "whole number"},
		{`1.0`, "whole number"},
		{`"x"`, "whole number"},
		{`"10"`, "whole number"},
		{`2001`, "at most 2000 (ADMIT_MAX_WAIT=2s)"},
		{`99999999999999999999`, "whole number"},
	} {
		r := wb.nodes[0].call(t, "POST", "/v1/admit", serviceToken, `{"account":"`+org+`","max_wait_ms":`+tc.body+`}`)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", tc.body, r.Raw)
		e, _ := r.Body["error"].(map[string]any)
		require.Equal(t, "invalid_max_wait", e["code"], tc.body)
		require.Contains(t, e["message"], tc.message, tc.body)
	}
	for _, ms := range []int{0, 2000} {
		r := wb.nodes[0].admit(t, map[string]any{"account": org, "max_wait_ms": ms})
		require.Equal(t, http.StatusOK, r.Status, "%d: %s", ms, r.Raw)
	}

	off := setup(t, setupOpts{nodes: 2})
	off.nodes[0].waitResolvable(t, org)
	r := off.nodes[0].admit(t, map[string]any{"account": org, "max_wait_ms": 1})
	require.Equal(t, http.StatusBadRequest, r.Status, r.Raw)
	require.Contains(t, r.Raw, "ADMIT_MAX_WAIT=0")
	r = off.nodes[0].admit(t, map[string]any{"account": org, "max_wait_ms": 0})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	_, hasWaited := r.Body["waited_ms"]
	require.False(t, hasWaited, r.Raw)
}
