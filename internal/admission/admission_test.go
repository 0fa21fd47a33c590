package admission_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/pkg/event"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

type testBundle struct {
	rdb  redis.UniversalClient
	adm  *admission.Admitter
	keys keyspace.Keys
	reg  *prometheus.Registry
	org  string // an org id unique to the test
}

type options struct {
	clock    func() time.Time
	leaseTTL time.Duration
	idemTTL  time.Duration // the idempotency window (default: the Admitter's)
	legacy   bool          // Options.IdempotencyLegacy
}

// forEachRedis runs f against the single Redis server and against the 3-master Redis
// Cluster: the script must behave the same on both.
func forEachRedis(t *testing.T, o options, f func(t *testing.T, b *testBundle)) {
	t.Helper()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		reg := prometheus.NewRegistry()
		adm := admission.New(rdb, admission.Options{
			KeyPrefix: testenv.Prefix(t) + "mg", Clock: o.clock, LeaseTTL: o.leaseTTL, Registerer: reg,
			IdempotencyTTL: o.idemTTL, IdempotencyLegacy: o.legacy,
		})
		org := strings.ReplaceAll(testenv.Name(t), "_", "-")
		f(t, &testBundle{rdb: rdb, adm: adm, keys: adm.Keys(), reg: reg, org: org})
	})
}

func ptr[T any](v T) *T { return &v }

func perHour(n int64) policy.Limit { return policy.Limit{Limit: n, WindowS: 3600}.Normalize() }

func bucket(rate float64, burst int64) policy.Limit {
	return policy.Limit{RatePerS: rate, Burst: burst}.Normalize()
}

func withQuota(l policy.Limit, quota int64, kind policy.QuotaPeriod) policy.Limit {
	l.Quota, l.QuotaPeriod = ptr(quota), kind
	return l.Normalize()
}

// tree builds a resolved path from levels given org first.
func tree(levels ...policy.Level) policy.Resolved {
	return policy.Resolved{Org: levels[0].Account, Plan: "pro", Path: levels}
}

func (b *testBundle) decide(t *testing.T, pol policy.Resolved, units map[policy.Unit]int64, idem string) (admission.Decision, error) {
	t.Helper()
	return b.adm.Decide(testenv.Context(t, 30*time.Second), admission.Request{
		EventID: b.adm.NewEventID(pol.Org), IdempotencyKey: idem, Units: units, Policy: pol, Source: "test",
	})
}

func (b *testBundle) mustDecide(t *testing.T, pol policy.Resolved, units map[policy.Unit]int64) admission.Decision {
	t.Helper()
	d, err := b.decide(t, pol, units, "")
	require.NoError(t, err)
	return d
}

// outbox returns the events in the org's shard's outbox.
func (b *testBundle) outbox(t *testing.T, org string) []event.CloudEvent {
	t.Helper()
	entries, err := b.rdb.XRange(testenv.Context(t, 10*time.Second), b.keys.Outbox(b.keys.Shard(org)), "-", "+").Result()
	require.NoError(t, err)
	var out []event.CloudEvent
	for _, e := range entries {
		for _, m := range wire.OutboxMessages(e.Values) {
			require.NoError(t, m.Err)
			require.Equal(t, org, m.Key, "events are keyed by org")
			var ev event.CloudEvent
			require.NoError(t, json.Unmarshal(m.Value, &ev), string(m.Value))
			out = append(out, ev)
		}
	}
	return out
}

// snapshot reads the raw value of every key of the org's shard whose name holds one of
// the accounts: what a denied request must leave untouched.
func (b *testBundle) snapshot(t *testing.T, accounts ...string) map[string]string {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	out := map[string]string{}
	for _, acc := range accounts {
		for _, f := range b.bucketFields(acc) {
			v, err := b.rdb.HGet(ctx, b.stateHash(), f).Result()
			if errors.Is(err, redis.Nil) {
				v = "<none>"
			} else {
				require.NoError(t, err)
			}
			out[b.stateHash()+" "+f] = v
		}
		for _, u := range policy.Units {
			k := b.keys.Quota(b.org, acc, u, period.MonthLabel(time.Now()))
			v, err := b.rdb.Get(ctx, k).Result()
			if errors.Is(err, redis.Nil) {
				v = "<none>"
			} else {
				require.NoError(t, err)
			}
			out[k] = v
		}
	}
	return out
}

// histogram returns the sample count and sum of a histogram without labels.
func histogram(t *testing.T, reg *prometheus.Registry, name string) (count uint64, sum float64) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0, 0
}

// The seeds' tree: org 1,000,000 tokens/h → engineering 500,000 → alice 100,000 →
// agent-1 25,000. A request that would take agent-1 past 25,000 is 429 naming agent-1, and
// nothing above it (nor at it) was consumed.
func TestSeedsTree(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		lv := func(id string, kind policy.Kind, tokens int64) policy.Level {
			return policy.Level{Account: id, Kind: kind, Limits: map[policy.Unit]policy.Limit{
				policy.Tokens:   withQuota(perHour(tokens), 10*tokens, policy.Month),
				policy.Requests: bucket(100, 300),
			}}
		}
		pol := tree(lv(b.org, policy.Org, 1_000_000), lv(b.org+"-eng", policy.Team, 500_000),
			lv(b.org+"-alice", policy.User, 100_000), lv(b.org+"-agent-1", policy.Agent, 25_000))

		d := b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 20_000})
		require.Equal(t, admission.Allow, d.Result)
		require.Len(t, d.Limits, 4*2+4, "a bucket per level and unit, a quota per level")

		ctx := testenv.Context(t, 10*time.Second)
		before := b.snapshot(t, b.org, b.org+"-eng", b.org+"-alice", b.org+"-agent-1")
		outboxBefore, err := b.rdb.XLen(ctx, b.keys.Outbox(b.keys.Shard(b.org))).Result()
		require.NoError(t, err)

		d = b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 6_000})
		require.Equal(t, admission.RateLimited, d.Result)
		require.Equal(t, &admission.Blocker{Account: b.org + "-agent-1", Level: policy.Agent, Unit: "tokens"}, d.Blocked)
		// 1,000 tokens short at 25,000/h: about 144 s.
		require.InDelta(t, 144*time.Second, d.RetryAfter, float64(2*time.Second))

		require.Equal(t, before, b.snapshot(t, b.org, b.org+"-eng", b.org+"-alice", b.org+"-agent-1"), "a denied request consumes nothing")
		outboxAfter, err := b.rdb.XLen(ctx, b.keys.Outbox(b.keys.Shard(b.org))).Result()
		require.NoError(t, err)
		require.Equal(t, outboxBefore, outboxAfter, "a denied request writes no event")

		// The org's bucket still has everything above what the first request took: a
		// request of 5,000 passes agent-1 (25,000 - 20,000 + refill) and every level above.
		d = b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 5_000})
		require.Equal(t, admission.Allow, d.Result, "%+v", d.Blocked)
		for _, l := range d.Limits {
			if l.Account == b.org && l.Unit == "tokens" && !l.Quota {
				// The org refills 278 tokens/s: allow for a few seconds of a slow machine.
				require.InDelta(t, 1_000_000-25_000, l.Remaining, 1_000, "org bucket after two requests")
			}
			if l.Account == b.org && l.Unit == "tokens" && l.Quota {
				require.Equal(t, int64(10_000_000-25_000), l.Remaining, "org quota after two requests")
			}
		}
	})
}

// 200 goroutines race one bucket of burst 100 that does not refill during the test:
// exactly 100 are allowed, and the concurrent decisions shared script calls.
func TestRaceOneBucket(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: bucket(100.0/1e6, 100), // 100 per million seconds
		}})
		var (
			mu      sync.Mutex
			results = map[admission.Result]int{}
			ids     = map[string]bool{}
			wg      sync.WaitGroup
			start   = make(chan struct{})
		)
		for range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				d, err := b.decide(t, pol, map[policy.Unit]int64{policy.Requests: 1}, "")
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					results["error: "+admission.Result(err.Error())]++
					return
				}
				results[d.Result]++
				if d.Result == admission.Allow {
					ids[d.EventID] = true
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, map[admission.Result]int{admission.Allow: 100, admission.RateLimited: 100}, results)

		events := b.outbox(t, b.org)
		require.Len(t, events, 100, "one event per allowed decision")
		for _, ev := range events {
			require.True(t, ids[ev.ID], "event %s was returned to a caller", ev.ID)
		}
		calls, decisions := histogram(t, b.reg, "metergate_admit_script_batch_size")
		require.Equal(t, 200.0, decisions, "every decision went through the script")
		require.Less(t, calls, uint64(200), "concurrent decisions shared script calls")
		t.Logf("200 decisions in %d script calls", calls)
	})
}

// Quotas: 402 once spent, naming the level and the period; rate limits win over quotas.
func TestQuota(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		team := b.org + "-team"
		pol := tree(
			policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
				policy.Requests: withQuota(bucket(1000, 1000), 100, policy.Month),
			}},
			policy.Level{Account: team, Kind: policy.Team, Limits: map[policy.Unit]policy.Limit{
				policy.Tokens: withQuota(policy.Limit{}, 1000, policy.Day),
			}},
		)
		units := map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 400}
		for range 2 {
			require.Equal(t, admission.Allow, b.mustDecide(t, pol, units).Result)
		}
		d := b.mustDecide(t, pol, units)
		require.Equal(t, admission.QuotaExceeded, d.Result)
		require.Equal(t, &admission.Blocker{Account: team, Level: policy.Team, Unit: "tokens"}, d.Blocked)
		require.Equal(t, period.DayLabel(d.Time), d.Period, "a daily quota names its day")

		// A smaller request still fits the day's 200 tokens left.
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 200}).Result)
		usage, err := b.adm.Usage(testenv.Context(t, 10*time.Second), policy.Resolved{Org: b.org, Path: pol.Path})
		require.NoError(t, err)
		require.Equal(t, admission.UnitUsage{Used: 1000, Quota: 1000, Remaining: 0, Period: d.Period}, usage[policy.Tokens])
		usage, err = b.adm.Usage(testenv.Context(t, 10*time.Second), policy.Resolved{Org: b.org, Path: pol.Path[:1]})
		require.NoError(t, err)
		require.Equal(t, admission.UnitUsage{Used: 3, Quota: 100, Remaining: 97, Period: period.MonthLabel(d.Time)}, usage[policy.Requests])

		// Rate limits win over quotas: with both spent the answer is 429.
		tight := tree(policy.Level{Account: b.org + "-tight", Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(bucket(1.0/3600, 1), 1, policy.Month),
		}})
		require.Equal(t, admission.Allow, b.mustDecide(t, tight, map[policy.Unit]int64{policy.Requests: 1}).Result)
		require.Equal(t, admission.RateLimited, b.mustDecide(t, tight, map[policy.Unit]int64{policy.Requests: 1}).Result)

		// A quota of 0 denies; -1 counts without capping.
		zero := tree(policy.Level{Account: b.org + "-zero", Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(policy.Limit{}, 0, policy.Month),
			policy.Tokens:   withQuota(policy.Limit{}, policy.Uncapped, policy.Month),
		}})
		require.Equal(t, admission.QuotaExceeded, b.mustDecide(t, zero, map[policy.Unit]int64{policy.Requests: 1}).Result)
		require.Equal(t, admission.Allow, b.mustDecide(t, zero, map[policy.Unit]int64{policy.Requests: 0, policy.Tokens: 5}).Result)
		usage, err = b.adm.Usage(testenv.Context(t, 10*time.Second), zero)
		require.NoError(t, err)
		require.Equal(t, admission.UnitUsage{Used: 5, Quota: -1, Remaining: -1, Period: period.MonthLabel(d.Time)}, usage[policy.Tokens])
	})
}

// The quota counter is picked by Redis TIME: an admit node whose clock still reads the
// previous month has its request charged to the month Redis is in, and one whose clock is
// months ahead is corrected from Redis TIME.
func TestQuotaPeriodByRedisTime(t *testing.T) {
	t.Parallel()
	for name, clock := range map[string]func() time.Time{
		"node behind, across the month boundary": func() time.Time {
			now := time.Now().UTC()
			return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).Add(-time.Millisecond)
		},
		"node two months ahead": func() time.Time { return time.Now().AddDate(0, 2, 0) },
		"node a year behind":    func() time.Time { return time.Now().AddDate(-1, 0, 0) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forEachRedis(t, options{clock: clock}, func(t *testing.T, b *testBundle) {
				pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
					policy.Requests: withQuota(policy.Limit{}, 10, policy.Month),
				}})
				d := b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1})
				require.Equal(t, admission.Allow, d.Result)
				redisNow, err := b.rdb.Time(testenv.Context(t, 10*time.Second)).Result()
				require.NoError(t, err)
				month := period.MonthLabel(redisNow)
				require.Equal(t, month, d.Period)

				ctx := testenv.Context(t, 10*time.Second)
				used, err := b.rdb.Get(ctx, b.keys.Quota(b.org, b.org, policy.Requests, month)).Int64()
				require.NoError(t, err)
				require.Equal(t, int64(1), used, "charged to the month Redis is in")
				nodeMonth := period.MonthLabel(clock())
				if nodeMonth != month {
					require.ErrorIs(t, b.rdb.Get(ctx, b.keys.Quota(b.org, b.org, policy.Requests, nodeMonth)).Err(), redis.Nil,
						"nothing charged to the node's month")
				}
				ttl, err := b.rdb.PTTL(ctx, b.keys.Quota(b.org, b.org, policy.Requests, month)).Result()
				require.NoError(t, err)
				require.Greater(t, ttl, 35*24*time.Hour-time.Minute, "the counter outlives its month by the retention")
				require.Less(t, ttl, 67*24*time.Hour)

				events := b.outbox(t, b.org)
				require.Len(t, events, 1)
				var data event.Admitted
				require.NoError(t, json.Unmarshal(events[0].Data, &data))
				require.Equal(t, month, data.Period, "the event names the period charged")
			})
		})
	}
}

// The same idempotency key twice returns the same decision and event id and charges once;
// with other units it is refused; a denied request does not take the key.
func TestIdempotency(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(bucket(1.0/3600, 2), 100, policy.Month),
		}})
		units := map[policy.Unit]int64{policy.Requests: 1}
		first, err := b.decide(t, pol, units, "k-1")
		require.NoError(t, err)
		again, err := b.decide(t, pol, units, "k-1")
		require.NoError(t, err)
		require.Equal(t, admission.Allow, again.Result)
		require.True(t, again.Replayed)
		require.False(t, first.Replayed)
		require.Equal(t, first.EventID, again.EventID)
		require.Equal(t, first.Period, again.Period)
		require.Len(t, b.outbox(t, b.org), 1, "one event")

		_, err = b.decide(t, pol, map[policy.Unit]int64{policy.Requests: 2}, "k-1")
		require.ErrorIs(t, err, admission.ErrIdempotencyKeyReused)
		_, err = b.adm.Decide(testenv.Context(t, 10*time.Second), admission.Request{
			EventID: b.adm.NewEventID(b.org), IdempotencyKey: "k-1", Units: units, Policy: pol, Tool: "web_search"})
		require.ErrorIs(t, err, admission.ErrIdempotencyKeyReused, "the same units for another tool")

		// Braces in a key do not move it to another Cluster slot.
		d, err := b.decide(t, pol, units, "{k-2}")
		require.NoError(t, err)
		require.Equal(t, admission.Allow, d.Result)
		// The bucket (burst 2) is now empty: a new key is denied and not remembered, so
		// once the bucket has room the same key is admitted as a new request.
		d, err = b.decide(t, pol, units, "k-3")
		require.NoError(t, err)
		require.Equal(t, admission.RateLimited, d.Result)
		require.NoError(t, b.rdb.HDel(testenv.Context(t, 10*time.Second), b.stateHash(), b.bucketFields(b.org)...).Err())
		d, err = b.decide(t, pol, units, "k-3")
		require.NoError(t, err)
		require.Equal(t, admission.Allow, d.Result)
		require.False(t, d.Replayed)

		usage, err := b.adm.Usage(testenv.Context(t, 10*time.Second), pol)
		require.NoError(t, err)
		require.Equal(t, int64(3), usage[policy.Requests].Used, "k-1 once, {k-2}, k-3")
	})
}

// stateHash is the hash of the test org's token buckets (lua/admit.lua).
func (b *testBundle) stateHash() string {
	return b.keys.Tag(b.keys.Shard(b.org)) + "s:" + b.org
}

// bucketFields lists the fields of the account's buckets in the state hash, requests
// first (deleting them refills the buckets).
func (b *testBundle) bucketFields(account string) []string {
	return []string{account + ":r", account + ":t", account + ":c", account + ":m"}
}

// An exact sliding window, "10 per 30 minutes": the 11th is denied until the first
// leaves the window; amounts add up.
func TestSlidingWindow(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: {Algorithm: policy.SlidingWindow, Limit: 10, WindowS: 1800},
			policy.Tokens:   {Algorithm: policy.SlidingWindow, Limit: 1000, WindowS: 60},
		}})
		for i := range 10 {
			d := b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 90})
			require.Equal(t, admission.Allow, d.Result, "request %d", i+1)
			for _, l := range d.Limits {
				if l.Unit == "requests" {
					require.Equal(t, int64(9-i), l.Remaining)
					// The window is whole again when the first entry leaves it.
					require.InDelta(t, 1800*time.Second, l.Reset, float64(10*time.Second), "request %d", i+1)
				}
			}
		}
		d := b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1})
		require.Equal(t, admission.RateLimited, d.Result)
		require.Equal(t, "requests", d.Blocked.Unit)
		require.InDelta(t, 1800*time.Second, d.RetryAfter, float64(10*time.Second), "until the first request leaves the window")

		other := tree(policy.Level{Account: b.org + "-w", Kind: policy.Org, Limits: pol.Path[0].Limits})
		require.Equal(t, admission.Allow, b.mustDecide(t, other, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 900}).Result)
		d = b.mustDecide(t, other, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 101})
		require.Equal(t, admission.RateLimited, d.Result, "900 + 101 > 1000")
		require.Equal(t, "tokens", d.Blocked.Unit)
		require.Equal(t, admission.Allow, b.mustDecide(t, other, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 100}).Result)
		d = b.mustDecide(t, other, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 1001})
		require.Equal(t, admission.RateLimited, d.Result)
		require.Negative(t, d.RetryAfter, "a request larger than the window never fits")
	})
}

// Concurrency caps: leases are released by an outcome, or expire after the lease TTL so a
// caller that died cannot leak a slot.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{leaseTTL: 500 * time.Millisecond}, func(t *testing.T, b *testBundle) {
		user := b.org + "-user"
		pol := tree(
			policy.Level{Account: b.org, Kind: policy.Org, Concurrency: 10, Limits: map[policy.Unit]policy.Limit{}},
			policy.Level{Account: user, Kind: policy.User, Concurrency: 2, Limits: map[policy.Unit]policy.Limit{}},
		)
		units := map[policy.Unit]int64{policy.Requests: 1}
		first := b.mustDecide(t, pol, units)
		require.Equal(t, admission.Allow, first.Result)
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, units).Result)
		d := b.mustDecide(t, pol, units)
		require.Equal(t, admission.RateLimited, d.Result)
		require.Equal(t, &admission.Blocker{Account: user, Level: policy.User, Unit: admission.ConcurrentRequests}, d.Blocked)
		require.Positive(t, d.RetryAfter)

		ctx := testenv.Context(t, 10*time.Second)
		require.NoError(t, b.adm.Outcome(ctx, admission.Outcome{EventID: first.EventID, Status: 200, Source: "test"}))
		third := b.mustDecide(t, pol, units)
		require.Equal(t, admission.Allow, third.Result, "the outcome released a slot")
		require.NoError(t, b.adm.Outcome(ctx, admission.Outcome{EventID: first.EventID, Status: 200, Source: "test"}))
		require.Equal(t, admission.RateLimited, b.mustDecide(t, pol, units).Result, "a second outcome releases nothing")

		// Nobody reports the other two: their leases expire.
		deadline := time.Now().Add(5 * time.Second)
		for b.mustDecide(t, pol, units).Result != admission.Allow {
			require.True(t, time.Now().Before(deadline), "leases never expired")
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// The usage event in the outbox is a CloudEvent stamped with Redis TIME; an outcome
// appends its own event.
func TestOutboxEvents(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		team, agent := b.org+"-team", b.org+"-agent"
		pol := tree(
			policy.Level{Account: b.org, Kind: policy.Org, Plan: "pro", Limits: map[policy.Unit]policy.Limit{policy.Requests: bucket(100, 300)}},
			policy.Level{Account: team, Kind: policy.Team},
			policy.Level{Account: agent, Kind: policy.Agent},
		)
		req := admission.Request{
			EventID: b.adm.NewEventID(b.org), IdempotencyKey: `idem"quoted"{x}\`, Policy: pol,
			Units:    map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500, policy.Credits: 3},
			APIKeyID: "key-1", Tool: "llm_call", Source: "node-7",
		}
		d, err := b.adm.Decide(testenv.Context(t, 10*time.Second), req)
		require.NoError(t, err)
		require.Equal(t, admission.Allow, d.Result)

		events := b.outbox(t, b.org)
		require.Len(t, events, 1)
		ev := events[0]
		require.Equal(t, "1.0", ev.SpecVersion)
		require.Equal(t, req.EventID, ev.ID)
		require.Equal(t, "node-7", ev.Source)
		require.Equal(t, event.TypeAdmitted, ev.Type)
		require.Equal(t, b.org+"/"+team+"/"+agent, ev.Subject)
		require.Equal(t, "application/json", ev.DataContentType)
		require.WithinDuration(t, d.Time, ev.Time, time.Millisecond, "stamped with the decision's Redis TIME")
		var data event.Admitted
		require.NoError(t, json.Unmarshal(ev.Data, &data))
		require.Equal(t, event.Admitted{
			Org: b.org, Account: agent, APIKeyID: "key-1", IdempotencyKey: req.IdempotencyKey, Plan: "pro", Tool: "llm_call",
			Path:   []event.PathNode{{Account: b.org, Kind: "org"}, {Account: team, Kind: "team"}, {Account: agent, Kind: "agent"}},
			Units:  map[string]int64{"requests": 1, "tokens": 2500, "credits": 3},
			Period: d.Period,
		}, data)

		ctx := testenv.Context(t, 10*time.Second)
		require.NoError(t, b.adm.Outcome(ctx, admission.Outcome{EventID: req.EventID, Status: 503,
			Units: map[policy.Unit]int64{policy.Tokens: 1800}, Source: "node-7"}))
		events = b.outbox(t, b.org)
		require.Len(t, events, 2)
		out := events[1]
		require.Equal(t, admission.OutcomeID(req.EventID), out.ID)
		require.Equal(t, event.TypeOutcome, out.Type)
		var o event.Outcome
		require.NoError(t, json.Unmarshal(out.Data, &o))
		require.Equal(t, event.Outcome{EventID: req.EventID, Status: 503, Units: map[string]int64{"tokens": 1800}}, o)

		for _, bad := range []string{"", "x", req.EventID + " ", req.EventID + "/x", strings.Replace(req.EventID, ".", ".99.", 1), "not-a-uuid-at-all-but-36-chars-long.1." + b.org} {
			require.ErrorIs(t, b.adm.Outcome(ctx, admission.Outcome{EventID: bad, Status: 200}), keyspace.ErrUnknownEvent, bad)
		}

		// Nothing goes to the legacy stream: relays of the earlier version read only that
		// one, and would send an entry of several events on as one malformed message (a
		// dead letter).
		shard := b.keys.Shard(b.org)
		n, err := b.rdb.XLen(ctx, b.keys.LegacyOutbox(shard)).Result()
		require.NoError(t, err)
		require.Zero(t, n, "entries in the legacy stream")
		n, err = b.rdb.XLen(ctx, b.keys.Outbox(shard)).Result()
		require.NoError(t, err)
		require.Equal(t, int64(2), n, "the admission and the outcome in the shard's stream")
		require.NotEqual(t, b.keys.Outbox(shard), b.keys.LegacyOutbox(shard))
	})
}

// Bad requests are refused before they reach Redis.
func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	adm := admission.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), admission.Options{})
	pol := tree(policy.Level{Account: "acme", Kind: policy.Org})
	for name, r := range map[string]admission.Request{
		"no policy":       {EventID: "e", Units: map[policy.Unit]int64{policy.Requests: 1}},
		"no event id":     {Policy: pol, Units: map[policy.Unit]int64{policy.Requests: 1}},
		"negative units":  {EventID: "e", Policy: pol, Units: map[policy.Unit]int64{policy.Tokens: -1}},
		"unknown unit":    {EventID: "e", Policy: pol, Units: map[policy.Unit]int64{"gpus": 1}},
		"spaced idem key": {EventID: "e", Policy: pol, IdempotencyKey: "a b"},
	} {
		_, err := adm.Decide(context.Background(), r)
		require.Error(t, err, name)
	}
}
