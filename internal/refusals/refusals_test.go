package refusals_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/gate"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/refusals"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
)

// at is the time of the i-th refusal of a test: ms apart, as the log keeps them.
func at(i int) time.Time { return time.UnixMilli(1795430840294 + int64(i)).UTC() }

// rateLimited is a refusal of account of org with every field set.
func rateLimited(org, account, idem string, i int) gate.Refusal {
	return gate.Refusal{Time: at(i), Org: org, Account: account, APIKeyID: "key_" + account, IdempotencyKey: idem,
		Status: http.StatusTooManyRequests, Result: admission.RateLimited,
		Blocked:    admission.Blocker{Account: org, Level: policy.Org, Unit: "tokens"},
		RetryAfter: 1500 * time.Millisecond, Via: "check", Tool: "web_search",
		Units: map[policy.Unit]int64{policy.Tokens: 1200, policy.Requests: 1}}
}

// Each org's refusals come back whole, newest first, by org, account and idempotency key,
// on one Redis and on a Cluster, where one batch spans several slots.
func TestRecentAndFind(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb})
		// Orgs of three shards: their streams are in three slots.
		shards := map[int]string{}
		for i := 0; len(shards) < 3; i++ {
			org := fmt.Sprintf("%s-%d", b.org, i)
			shards[b.keys.Shard(org)] = org
		}
		var orgs []string
		for _, org := range shards {
			orgs = append(orgs, org)
		}
		quota := gate.Refusal{Time: at(100), Org: orgs[0], Account: orgs[0] + ".bob", Status: http.StatusPaymentRequired,
			Result: admission.QuotaExceeded, Blocked: admission.Blocker{Account: orgs[0] + ".bob", Level: policy.User, Unit: "requests"},
			Period: "2026-11", Via: "admit"}
		n := 0
		for _, org := range orgs {
			for _, idem := range []string{"k1", "k2", "k1"} {
				b.log.Refused(rateLimited(org, org+".alice", idem, n))
				n++
			}
		}
		b.log.Refused(quota)
		b.close(t)
		require.InDelta(t, float64(n+1), b.written(t), 0)
		require.Zero(t, b.dropped(t, ""))

		got, err := b.log.Recent(b.ctx, orgs[0], 2)
		require.NoError(t, err)
		require.Equal(t, []gate.Refusal{quota, rateLimited(orgs[0], orgs[0]+".alice", "k1", 2)}, got,
			"newest first, every field kept")
		for i, org := range orgs {
			all, err := b.log.Recent(b.ctx, org, 0)
			require.NoError(t, err)
			want := []gate.Refusal{rateLimited(org, org+".alice", "k1", 3*i+2), rateLimited(org, org+".alice", "k2", 3*i+1),
				rateLimited(org, org+".alice", "k1", 3*i)}
			if i == 0 {
				want = append([]gate.Refusal{quota}, want...)
			}
			require.Equal(t, want, all, org)

			found, err := b.log.Find(b.ctx, org, org+".alice", "k1")
			require.NoError(t, err)
			require.Equal(t, []gate.Refusal{want[len(want)-3], want[len(want)-1]}, found, "a key refused twice")
			found, err = b.log.Find(b.ctx, org, org+".carol", "k1")
			require.NoError(t, err)
			require.Empty(t, found, "keys are an account's")
			found, err = b.log.Find(b.ctx, org, "", "k2")
			require.NoError(t, err)
			require.Equal(t, []gate.Refusal{want[len(want)-2]}, found, "any account of the org")
		}
		found, err := b.log.Find(b.ctx, orgs[0], orgs[0]+".bob", "")
		require.NoError(t, err)
		require.Equal(t, []gate.Refusal{quota}, found, "an account's refusals")

		none, err := b.log.Recent(b.ctx, b.org+"-none", 10)
		require.NoError(t, err)
		require.Empty(t, none, "an org never refused")
	})
}

// The log's memory is bounded by construction: an org's stream keeps about PerOrg entries
// however many refusals it has, and expires TTL after its latest.
func TestTheLogIsBounded(t *testing.T) {
	t.Parallel()
	const perOrg = 100
	// XADD MAXLEN ~ trims whole nodes of a stream: it may keep up to a node more than
	// asked (stream-node-max-entries, 100 by default).
	const slack = 100
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb, opts: refusals.Options{PerOrg: perOrg, TTL: time.Hour}})
		for i := range 10 * perOrg {
			b.log.Refused(rateLimited(b.org, b.org+".alice", fmt.Sprintf("req-%d", i), i))
		}
		b.close(t)
		require.InDelta(t, float64(10*perOrg), b.written(t), 0)

		key := b.keys.Refusals(b.org)
		n, err := b.rdb.XLen(b.ctx, key).Result()
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, int64(perOrg), "at least PerOrg kept")
		require.LessOrEqual(t, n, int64(perOrg+slack), "about PerOrg kept")
		ttl, err := b.rdb.PTTL(b.ctx, key).Result()
		require.NoError(t, err)
		require.Positive(t, ttl, "the stream expires")
		require.LessOrEqual(t, ttl, time.Hour)
		mem, err := b.rdb.MemoryUsage(b.ctx, key).Result()
		require.NoError(t, err)
		t.Logf("%d entries in %d bytes: %d bytes each", n, mem, mem/n)

		latest, err := b.log.Recent(b.ctx, b.org, 1)
		require.NoError(t, err)
		require.Equal(t, []gate.Refusal{rateLimited(b.org, b.org+".alice", fmt.Sprintf("req-%d", 10*perOrg-1), 10*perOrg-1)},
			latest, "trimming drops the oldest")
	})
}

// A full queue drops a refusal and counts it, rather than wait; what was queued is written
// at Close, and what comes after Close is dropped.
func TestRefusedDropsWhenTheQueueIsFull(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{idle: true, opts: refusals.Options{Queue: 4}})
	for i := range 10 {
		b.log.Refused(rateLimited(b.org, b.org+".alice", fmt.Sprintf("req-%d", i), i))
	}
	require.InDelta(t, 6, b.dropped(t, "queue_full"), 0, "the queue holds 4")
	b.log.Start()
	b.close(t)
	require.InDelta(t, 4, b.written(t), 0)
	got, err := b.log.Recent(b.ctx, b.org, 0)
	require.NoError(t, err)
	require.Len(t, got, 4)
	require.Equal(t, "req-3", got[0].IdempotencyKey, "the first 4 were kept")

	b.log.Refused(rateLimited(b.org, b.org+".alice", "late", 10))
	require.InDelta(t, 1, b.dropped(t, "closed"), 0)
}

// Refused never waits for Redis: while Redis is stalled, refusals are queued or dropped at
// once, and every refusal is either written once Redis answers or counted as dropped.
func TestRefusedDoesNotWaitForAStalledRedis(t *testing.T) {
	t.Parallel()
	srv := private.StartRedis(t)
	opts, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	const queue, sent = 16, 2000
	b := setup(t, setupOpts{rdb: rdb, opts: refusals.Options{Queue: queue, PerOrg: 10 * sent, WriteTimeout: time.Minute}})
	b.log.Refused(rateLimited(b.org, b.org+".alice", "first", 0))
	require.Eventually(t, func() bool { return b.written(t) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the writer runs")

	stalled, err := private.StallRedis(b.ctx, opts, 2*time.Second)
	require.NoError(t, err)
	for i := range sent {
		b.log.Refused(rateLimited(b.org, b.org+".alice", fmt.Sprintf("req-%d", i), i+1))
	}
	select {
	case err := <-stalled:
		t.Fatalf("Refused waited for the stalled Redis (stall over: %v)", err)
	default:
	}
	require.GreaterOrEqual(t, b.dropped(t, "queue_full"), float64(sent-queue-refusals.MaxBatch),
		"the writer holds a batch at most, the queue the rest")
	require.NoError(t, <-stalled)
	b.close(t)
	written, dropped := b.written(t), b.dropped(t, "")
	require.InDelta(t, float64(sent+1), written+dropped, 0, "each refusal written or counted")
	n, err := rdb.XLen(b.ctx, b.keys.Refusals(b.org)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(written), n)
}

// Refused is on the decision path of every refusal: a channel send, no allocation. (Not
// parallel: AllocsPerRun counts the process's allocations.)
func TestRefusedDoesNotAllocate(t *testing.T) {
	b := setup(t, setupOpts{idle: true, opts: refusals.Options{Queue: 100}})
	r := rateLimited(b.org, b.org+".alice", "k", 0)
	// 100 runs fill the queue, the rest are dropped: both paths are measured.
	require.Zero(t, testing.AllocsPerRun(200, func() { b.log.Refused(r) }))
	require.Positive(t, b.dropped(t, "queue_full"))
	b.log.Start()
	b.close(t)
}

// policies is a fixed set of accounts, each its own org; no API keys.
type policies map[string]policy.Resolved

func (p policies) Resolve(account string) (policy.Resolved, error) {
	pol, ok := p[account]
	if !ok {
		return policy.Resolved{}, errors.New("no such account")
	}
	return pol, nil
}

func (p policies) Authenticate(string) (policy.APIKey, policy.Resolved, error) {
	return policy.APIKey{}, policy.Resolved{}, errors.New("no API keys")
}

// The console's "Why?" finds a 429 by its idempotency key: the gate tells the log of it,
// on one Redis and on a Cluster. An admission is in the billing log, not here.
func TestWhyFindsARefusalByItsIdempotencyKey(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb})
		adm := admission.New(rdb, admission.Options{KeyPrefix: b.keys.Prefix, Shards: b.keys.Shards})
		t.Cleanup(adm.Close)
		burst1 := policy.Limit{RatePerS: 0.001, Burst: 1}.Normalize()
		pols := policies{b.org: {Org: b.org, Plan: "pro", Path: []policy.Level{{Account: b.org, Kind: policy.Org,
			Limits: map[policy.Unit]policy.Limit{policy.Requests: burst1}}}}}
		g := gate.New(gate.Config{Policies: pols, Decider: adm, Source: "test", Refusals: b.log})
		one := map[policy.Unit]int64{policy.Requests: 1}
		for _, idem := range []string{"admitted", "refused"} {
			_, err := g.Admit(b.ctx, gate.Input{Account: b.org, IdempotencyKey: idem, Units: one, Via: "admit"})
			require.NoError(t, err)
		}
		require.NoError(t, g.Close(b.ctx))
		b.close(t)

		found, err := b.log.Find(b.ctx, b.org, b.org, "refused")
		require.NoError(t, err)
		require.Len(t, found, 1)
		r := found[0]
		require.Equal(t, http.StatusTooManyRequests, r.Status)
		require.Equal(t, admission.RateLimited, r.Result)
		require.Equal(t, admission.Blocker{Account: b.org, Level: policy.Org, Unit: "requests"}, r.Blocked)
		require.Equal(t, "admit", r.Via)
		require.Equal(t, one, r.Units)
		found, err = b.log.Find(b.ctx, b.org, b.org, "admitted")
		require.NoError(t, err)
		require.Empty(t, found, "an admission is not a refusal")
	})
}
