package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/sandbox"
	"github.com/metergate/metergate/internal/testenv"
)

// stamped returns pol as the policy cache hands it out: with a stamp, so that an Admitter
// derives its program once and, having sent it, sends only its version.
func stamped(pol policy.Resolved) policy.Resolved {
	pol.Stamp = policy.NewStamp()
	return pol
}

// node is a second Admitter on the same Redis and keys: another admit node.
func (b *testBundle) node() (*admission.Admitter, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	return admission.New(b.rdb, admission.Options{KeyPrefix: b.keys.Prefix, Registerer: reg}), reg
}

func misses(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "metergate_admit_mirror_misses_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no metergate_admit_mirror_misses_total")
	return 0
}

// mirrorKey is the org's policy mirror.
func (b *testBundle) mirrorKey() string {
	s := b.stateHash() // "<tag>s:<org>"
	return s[:len(s)-len("s:"+b.org)] + "p:" + b.org
}

func decideWith(t *testing.T, adm *admission.Admitter, pol policy.Resolved, units map[policy.Unit]int64) admission.Decision {
	t.Helper()
	d, err := adm.Decide(testenv.Context(t, 30*time.Second), admission.Request{
		EventID: adm.NewEventID(pol.Org), Units: units, Policy: pol, Source: "test"})
	require.NoError(t, err)
	return d
}

// A decision sends its program once; after that only its version, which the script finds
// in the mirror. A mirror that lost the program (Redis wiped, restarted without
// persistence, a replica promoted without it) is not guessed at: the decision is sent
// again with the program, and stays exact.
func TestMirrorLostIsRefilled(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		ctx := testenv.Context(t, 30*time.Second)
		pol := stamped(tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(bucket(1000, 1000), 3, policy.Month),
		}}))
		units := map[policy.Unit]int64{policy.Requests: 1}
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, units).Result)
		fields, err := b.rdb.HKeys(ctx, b.mirrorKey()).Result()
		require.NoError(t, err)
		require.Len(t, fields, 1, "the mirror holds the account's program")
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, units).Result)
		require.Zero(t, misses(t, b.reg), "the second decision found the program")

		// The mirror is gone: the next decision misses it, is sent again with the program,
		// and is taken exactly once.
		require.NoError(t, b.rdb.Del(ctx, b.mirrorKey()).Err())
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, units).Result)
		require.Equal(t, 1.0, misses(t, b.reg))
		usage, err := b.adm.Usage(ctx, pol)
		require.NoError(t, err)
		require.Equal(t, int64(3), usage[policy.Requests].Used, "every decision charged once, the missed one too")
		d := b.mustDecide(t, pol, units)
		require.Equal(t, admission.QuotaExceeded, d.Result, "the quota holds after the refill")
		require.Equal(t, 1.0, misses(t, b.reg), "the mirror holds the program again")

		// Everything wiped (a Redis restarted without persistence): still no guess.
		wipe := func(ctx context.Context, c *redis.Client) error {
			_, err := sandbox.DeleteKeys(ctx, c, b.keys.Prefix)
			return err
		}
		if cc, ok := b.rdb.(*redis.ClusterClient); ok {
			require.NoError(t, cc.ForEachMaster(ctx, wipe))
		} else {
			require.NoError(t, wipe(ctx, b.rdb.(*redis.Client)))
		}
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, units).Result)
		require.Equal(t, 2.0, misses(t, b.reg))
	})
}

// Nodes that hold different versions of a policy (one has seen a change the other has
// not yet: at most the policy cache's second) each enforce the one they hold: a version is
// a hash of the program, so a node never reads another's, and the newer one is enforced by
// every node as soon as it holds it.
func TestMirrorPolicyChangeAcrossNodes(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		ctx := testenv.Context(t, 30*time.Second)
		level := func(quota int64) policy.Resolved {
			return stamped(tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
				policy.Requests: withQuota(bucket(1000, 1000), quota, policy.Month),
			}}))
		}
		v1, v2 := level(100), level(2)
		units := map[policy.Unit]int64{policy.Requests: 1}
		other, otherReg := b.node()

		// Both nodes on v1.
		require.Equal(t, admission.Allow, decideWith(t, b.adm, v1, units).Result)
		require.Equal(t, admission.Allow, decideWith(t, other, v1, units).Result)
		// The policy changes to a quota of 2; node b sees it first: refused (2 used).
		require.Equal(t, admission.QuotaExceeded, decideWith(t, b.adm, v2, units).Result)
		// The other node has not seen it yet: it enforces v1, as without a mirror.
		require.Equal(t, admission.Allow, decideWith(t, other, v1, units).Result)
		fields, err := b.rdb.HKeys(ctx, b.mirrorKey()).Result()
		require.NoError(t, err)
		require.Len(t, fields, 2, "both versions in the mirror, side by side")
		// Once it sees v2 (a new Resolved, as the cache hands out after a change), it
		// enforces it at its first decision.
		v2b := level(2)
		require.Equal(t, admission.QuotaExceeded, decideWith(t, other, v2b, units).Result)
		require.Equal(t, admission.QuotaExceeded, decideWith(t, b.adm, v2, units).Result)
		require.Zero(t, misses(t, b.reg)+misses(t, otherReg), "each node sent each program inline at its first use")
		usage, err := b.adm.Usage(ctx, v2)
		require.NoError(t, err)
		require.Equal(t, int64(3), usage[policy.Requests].Used)
	})
}

// A program sent inline refreshes the mirror's expiry; the mirror of an org in use never
// expires (MIRROR_TTL is a day, a node sends each program again hourly).
func TestMirrorExpires(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		ctx := testenv.Context(t, 30*time.Second)
		pol := stamped(tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: bucket(1000, 1000)}}))
		b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1})
		ttl, err := b.rdb.PTTL(ctx, b.mirrorKey()).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, 23*time.Hour)
		require.LessOrEqual(t, ttl, 24*time.Hour)
	})
}
