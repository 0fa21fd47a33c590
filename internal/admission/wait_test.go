package admission_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// queueKey is the queue of the token bucket of org's account's unit letter (lua/admit.lua).
func (b *testBundle) queueKey(org, account, letter string) string {
	return b.keys.Tag(b.keys.Shard(org)) + "k:" + account + ":" + letter
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
		require.NoError(t, ctx.Err(), "queue %s: %d places, want %d", queue, got, n)
		time.Sleep(time.Millisecond)
	}
}

func withPriority(pol policy.Resolved, p int) policy.Resolved {
	pol.Priority = p
	return pol
}

type waited struct {
	name string
	d    admission.Decision
	err  error
}

// While requests wait for the same limit, capacity goes to the highest priority first
// and first come first served within a priority, across admit nodes: the queue is in
// Redis. Waiters join alternately from two nodes while the bucket is empty for a minute;
// then it refills at 10 a second, and the order of their admissions (by the Redis time of
// each) is the queue's.
func TestWaitersByPriorityThenArrival(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: bucket(10, 1)}})
		one := map[policy.Unit]int64{policy.Requests: 1}
		ctx := testenv.Context(t, 30*time.Second)
		field := b.org + ":r"
		// Empty until a minute from now: nobody is admitted while the waiters join.
		redisNow, err := b.rdb.Time(ctx).Result()
		require.NoError(t, err)
		require.NoError(t, b.rdb.HSet(ctx, b.stateHash(), field, redisNow.Add(time.Minute).UnixMicro()).Err())
		nodes := []*admission.Admitter{b.adm, b.secondNode(t)}
		queue := b.queueKey(b.org, b.org, "r")

		arrivals := []struct {
			name     string
			priority int
		}{{"low-1", 0}, {"low-2", 0}, {"high-1", 50}, {"low-3", 0}, {"high-2", 50}, {"mid-1", 10}}
		results := make(chan waited, len(arrivals))
		var wg sync.WaitGroup
		for i, a := range arrivals {
			wg.Add(1)
			go func() {
				defer wg.Done()
				adm := nodes[i%2]
				d, err := adm.Decide(testenv.Context(t, 3*time.Minute), admission.Request{
					EventID: adm.NewEventID(b.org), Units: one, Policy: withPriority(pol, a.priority),
					Source: a.name, MaxWait: 2 * time.Minute})
				results <- waited{a.name, d, err}
			}()
			b.waitQueued(t, queue, int64(i+1))
		}
		// Full again: the head's node finds out within a second (its poll).
		require.NoError(t, b.rdb.HDel(ctx, b.stateHash(), field).Err())
		wg.Wait()
		close(results)
		var got []waited
		for r := range results {
			require.NoError(t, r.err, r.name)
			require.Equal(t, admission.Allow, r.d.Result, r.name)
			got = append(got, r)
		}
		sort.Slice(got, func(i, j int) bool { return got[i].d.Time.Before(got[j].d.Time) })
		var order []string
		for _, r := range got {
			order = append(order, r.name)
		}
		require.Equal(t, []string{"high-1", "high-2", "mid-1", "low-1", "low-2", "low-3"}, order)
		b.waitQueued(t, queue, 0)
	})
}

// A request that waits is ahead of later ones: a request of the same priority that does
// not wait is refused even though the bucket could take it (the waiter needs more), and
// one of a higher priority goes first.
func TestWaiterIsNotOvertaken(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		// A token a second, burst 5.
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Tokens: bucket(1, 5)}})
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, map[policy.Unit]int64{policy.Tokens: 5}).Result)
		done := make(chan waited, 1)
		go func() {
			d, err := b.adm.Decide(testenv.Context(t, 20*time.Second), admission.Request{EventID: b.adm.NewEventID(b.org),
				Units: map[policy.Unit]int64{policy.Tokens: 5}, Policy: pol, Source: "big", MaxWait: 10 * time.Second})
			done <- waited{"big", d, err}
		}()
		b.waitQueued(t, b.queueKey(b.org, b.org, "t"), 1)
		// A token is back after a second: enough for a small request, not for the waiter
		// (5 s).
		time.Sleep(1200 * time.Millisecond)
		small := b.mustDecide(t, pol, map[policy.Unit]int64{policy.Tokens: 1})
		require.Equal(t, admission.RateLimited, small.Result, "behind the waiter")
		require.Equal(t, b.org, small.Blocked.Account)
		high := b.mustDecide(t, withPriority(pol, 1), map[policy.Unit]int64{policy.Tokens: 1})
		require.Equal(t, admission.Allow, high.Result, "a higher priority goes first")
		r := <-done
		require.NoError(t, r.err)
		require.Equal(t, admission.Allow, r.d.Result)
	})
}

// A request whose wait runs out gets the refusal it would have had, and leaves its queue;
// one that cannot be admitted within its wait is refused at once, without queueing, and so
// is a waiter as soon as its turn is further away than its wait.
func TestWaitRunsOut(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		// One request every 10 s.
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: bucket(0.1, 1)}})
		one := map[policy.Unit]int64{policy.Requests: 1}
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, one).Result)
		queue := b.queueKey(b.org, b.org, "r")

		start := time.Now()
		d, err := b.adm.Decide(testenv.Context(t, 10*time.Second), admission.Request{EventID: b.adm.NewEventID(b.org),
			Units: one, Policy: pol, Source: "test", MaxWait: time.Second})
		require.NoError(t, err)
		require.Equal(t, admission.RateLimited, d.Result)
		require.Less(t, time.Since(start), time.Second, "10 s away: no use waiting 1 s")
		require.Greater(t, d.RetryAfter, 8*time.Second)
		b.waitQueued(t, queue, 0)

		// One every 2 s now: the head gets the next one, the request behind it would get
		// the one after, at ~4 s, but may wait only 3 s.
		pol = tree(policy.Level{Account: b.org + "-2", Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: bucket(0.5, 1)}})
		queue = b.queueKey(b.org+"-2", b.org+"-2", "r")
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, one).Result)
		headDone := make(chan waited, 1)
		go func() {
			d, err := b.adm.Decide(testenv.Context(t, 30*time.Second), admission.Request{EventID: b.adm.NewEventID(pol.Org),
				Units: one, Policy: pol, Source: "head", MaxWait: 20 * time.Second})
			headDone <- waited{"head", d, err}
		}()
		b.waitQueued(t, queue, 1)
		start = time.Now()
		d, err = b.adm.Decide(testenv.Context(t, 10*time.Second), admission.Request{EventID: b.adm.NewEventID(pol.Org),
			Units: one, Policy: pol, Source: "next", MaxWait: 3 * time.Second})
		require.NoError(t, err)
		require.Equal(t, admission.RateLimited, d.Result, "out of time")
		require.Equal(t, pol.Org, d.Blocked.Account)
		require.Greater(t, d.RetryAfter, time.Duration(0))
		// It waited for the head's turn (~2 s); then its own was ~2 s away with ~1 s left:
		// refused then, not at the end of a wait that could not be enough.
		require.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "it waited")
		r := <-headDone
		require.NoError(t, r.err)
		require.Equal(t, admission.Allow, r.d.Result)
		b.waitQueued(t, queue, 0)
	})
}

// A waiting caller that hangs up leaves no trace: no place in a queue, no capacity
// taken, no event.
func TestHangUpLeavesNoTrace(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: bucket(0.2, 1)}})
		one := map[policy.Unit]int64{policy.Requests: 1}
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, one).Result)
		ctx := testenv.Context(t, 10*time.Second)
		bucketBefore, err := b.rdb.HGet(ctx, b.stateHash(), b.org+":r").Result()
		require.NoError(t, err)
		events, err := b.rdb.XLen(ctx, b.keys.Outbox(b.keys.Shard(b.org))).Result()
		require.NoError(t, err)

		queue := b.queueKey(b.org, b.org, "r")
		for _, node := range []*admission.Admitter{b.adm, b.secondNode(t)} {
			callerCtx, hangUp := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := node.Decide(callerCtx, admission.Request{EventID: node.NewEventID(b.org), Units: one, Policy: pol,
					Source: "test", MaxWait: 8 * time.Second})
				done <- err
			}()
			b.waitQueued(t, queue, 1)
			hangUp()
			require.ErrorIs(t, <-done, context.Canceled)
			b.waitQueued(t, queue, 0)
		}
		bucketAfter, err := b.rdb.HGet(ctx, b.stateHash(), b.org+":r").Result()
		require.NoError(t, err)
		require.Equal(t, bucketBefore, bucketAfter, "no capacity taken")
		n, err := b.rdb.XLen(ctx, b.keys.Outbox(b.keys.Shard(b.org))).Result()
		require.NoError(t, err)
		require.Equal(t, events, n, "no event")
	})
}

// Waiting costs Redis script calls per queue and node, not per waiting request: 200
// requests waiting on two nodes for 2 s make a handful of calls (each node's poll of its
// first waiter, once a second), not one per waiter.
func TestWaitersDoNotPoll(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		// One request every 30 s: the head's turn does not come during the test.
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: bucket(1.0/30, 1)}})
		one := map[policy.Unit]int64{policy.Requests: 1}
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, one).Result)
		node2, reg2 := b.secondNodeMetrics(t)
		nodes := []*admission.Admitter{b.adm, node2}
		regs := []*prometheus.Registry{b.reg, reg2}
		calls := func() uint64 {
			var n uint64
			for _, r := range regs {
				c, _ := histogram(t, r, "metergate_admit_script_seconds")
				n += c
			}
			return n
		}

		const waiters = 200
		ctx, cancel := context.WithCancel(testenv.Context(t, 60*time.Second))
		defer cancel()
		var wg sync.WaitGroup
		for i := range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				node := nodes[i%2]
				_, _ = node.Decide(ctx, admission.Request{EventID: node.NewEventID(b.org), Units: one, Policy: pol,
					Source: "test", MaxWait: 50 * time.Second})
			}()
		}
		b.waitQueued(t, b.queueKey(b.org, b.org, "r"), waiters)
		before := calls()
		time.Sleep(2 * time.Second) // the span measured, not a wait for a condition
		made := calls() - before
		require.LessOrEqual(t, made, uint64(12), "script calls in 2 s with %d waiters", waiters)
		cancel()
		wg.Wait()
		b.waitQueued(t, b.queueKey(b.org, b.org, "r"), 0)
	})
}
