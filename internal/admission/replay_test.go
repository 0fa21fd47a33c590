package admission_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

// A request that refuses replays (a gateway's) gets a *ReplayError naming the first
// decision, charges nothing and is no attempt of the decision: the first request's void
// alone voids it.
func TestReplayRefused(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(bucket(100, 100), 1000, policy.Month)}})
		ctx := testenv.Context(t, 10*time.Second)
		first := b.request(pol, "gw-1")
		first.RefuseReplay = true
		d, err := b.adm.Decide(ctx, first)
		require.NoError(t, err)
		require.Equal(t, admission.Allow, d.Result)

		for range 3 {
			again := b.request(pol, "gw-1")
			again.RefuseReplay = true
			_, err = b.adm.Decide(ctx, again)
			var replay *admission.ReplayError
			require.ErrorAs(t, err, &replay)
			require.Equal(t, d.EventID, replay.EventID)
		}
		usage, err := b.adm.Usage(ctx, pol)
		require.NoError(t, err)
		require.Equal(t, int64(1), usage[policy.Requests].Used, "refused replays charge nothing")

		require.True(t, b.void(t, first, event.VoidCallerGone), "the refused replays are no attempts that keep the decision")
		require.Equal(t, []event.Voided{{EventID: d.EventID, Attempt: first.EventID, Reason: event.VoidCallerGone}}, b.voids(t))
	})
}

// A record holds at most MaxAttempts attempts: past them a replay is refused
// (ErrIdempotencyKeyExhausted) and the record stops growing, however often the key comes.
func TestReplaysBounded(t *testing.T) {
	t.Parallel()
	const w = time.Hour
	forEachRedis(t, options{idemTTL: w}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(bucket(1000, 1000), 1000, policy.Month)}})
		ctx := testenv.Context(t, 30*time.Second)
		first, err := b.adm.Decide(ctx, b.request(pol, "many"))
		require.NoError(t, err)
		bucketKey := b.keys.IdempotencyBucket(b.keys.Shard(b.org), first.Time, w)
		for i := 1; i < admission.MaxAttempts; i++ {
			d, err := b.adm.Decide(ctx, b.request(pol, "many"))
			require.NoError(t, err, "attempt %d", i+1)
			require.True(t, d.Replayed)
			require.Equal(t, first.EventID, d.EventID)
		}
		full, err := b.rdb.HGetAll(ctx, bucketKey).Result()
		require.NoError(t, err)
		for range 50 {
			_, err := b.adm.Decide(ctx, b.request(pol, "many"))
			require.ErrorIs(t, err, admission.ErrIdempotencyKeyExhausted)
		}
		after, err := b.rdb.HGetAll(ctx, bucketKey).Result()
		require.NoError(t, err)
		require.Equal(t, full, after, "a refused replay does not grow the record")
		for _, rec := range after {
			require.Less(t, len(rec), 1024, "a full record: %q", rec)
		}
		usage, err := b.adm.Usage(ctx, pol)
		require.NoError(t, err)
		require.Equal(t, int64(1), usage[policy.Requests].Used)
	})
}

// A quota counter never passes MaxCounter, capped or counting only, in shadow mode too:
// the request that would take it there is refused, so the counter stays an exact integer.
func TestCounterStaysExact(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		for _, shadow := range []bool{false, true} {
			org := b.org + "-" + strconv.FormatBool(shadow)
			pol := tree(policy.Level{Account: org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
				policy.Tokens: withQuota(policy.Limit{}, policy.Uncapped, policy.Month)}})
			units := map[policy.Unit]int64{policy.Tokens: policy.MaxAmount}
			ctx := testenv.Context(t, 10*time.Second)
			admitted := int64(0)
			var last admission.Decision
			for range 12 {
				d, err := b.adm.Decide(ctx, admission.Request{EventID: b.adm.NewEventID(org), Units: units, Policy: pol,
					Source: "test", Shadow: shadow})
				require.NoError(t, err)
				if d.Result == admission.Allow {
					require.Nil(t, d.Shadow, "shadow %v: the cap is no shadowed refusal", shadow)
					admitted++
				}
				last = d
			}
			require.Equal(t, int64(keyspace.MaxCounter/policy.MaxAmount), admitted, "shadow %v", shadow)
			require.Equal(t, admission.QuotaExceeded, last.Result)
			raw, err := b.rdb.Get(ctx, b.keys.Quota(org, org, policy.Tokens, last.Period)).Result()
			require.NoError(t, err)
			n, err := strconv.ParseInt(raw, 10, 64)
			require.NoError(t, err, "the counter is an integer: %q", raw)
			require.Equal(t, admitted*policy.MaxAmount, n)
		}
	})
}

// Units past policy.MaxAmount never reach the script.
func TestUnitsBounded(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Tokens: withQuota(policy.Limit{}, policy.Uncapped, policy.Month)}})
		_, err := b.decide(t, pol, map[policy.Unit]int64{policy.Tokens: policy.MaxAmount + 1}, "")
		require.Error(t, err)
		require.False(t, errors.Is(err, admission.ErrNotSent))
		usage, err := b.adm.Usage(testenv.Context(t, 10*time.Second), pol)
		require.NoError(t, err)
		require.Zero(t, usage[policy.Tokens].Used)
	})
}
