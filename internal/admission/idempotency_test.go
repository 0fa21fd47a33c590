package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// redisTime waits until Redis TIME is in the window (of width w) after the one of
// since, and returns it.
func (b *testBundle) nextWindow(t *testing.T, since time.Time, w time.Duration) time.Time {
	t.Helper()
	ctx := testenv.Context(t, 3*w+10*time.Second)
	for {
		now, err := b.rdb.Time(ctx).Result()
		require.NoError(t, err)
		if now.UnixMilli()/w.Milliseconds() > since.UnixMilli()/w.Milliseconds() {
			return now
		}
		time.Sleep(w / 50)
	}
}

// Records live in time buckets W wide, looked up in the current and the previous one: a
// retry in the bucket after the first request's is replayed (charged once), one two
// buckets later (at least W, at most 2W after) is decided afresh.
func TestIdempotencyAcrossBuckets(t *testing.T) {
	t.Parallel()
	const w = time.Second
	forEachRedis(t, options{idemTTL: w}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(bucket(1000, 1000), 100, policy.Month),
		}})
		units := map[policy.Unit]int64{policy.Requests: 1}
		first, err := b.decide(t, pol, units, "k-1")
		require.NoError(t, err)
		require.False(t, first.Replayed)
		shard := b.keys.Shard(b.org)
		ctx := testenv.Context(t, 10*time.Second)
		n, err := b.rdb.HLen(ctx, b.keys.IdempotencyBucket(shard, first.Time, w)).Result()
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "the record is in the bucket of the decision's Redis time")
		records, err := b.rdb.HGetAll(ctx, b.keys.IdempotencyBucket(shard, first.Time, w)).Result()
		require.NoError(t, err)
		for field, record := range records {
			require.Len(t, field, 16, "16 bytes of SHA-256 of the account and key")
			require.Regexp(t, `^~[0-9a-f-]{36} \d{4}-\d{2} [A-Za-z0-9_-]{12}$`, record,
				"compact: the event id less its org's tail, the period, a short fingerprint")
		}
		ttl, err := b.rdb.PTTL(ctx, b.keys.IdempotencyBucket(shard, first.Time, w)).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, w, "the bucket outlives the next one's start")
		require.LessOrEqual(t, ttl, 2*w)

		b.nextWindow(t, first.Time, w)
		again, err := b.decide(t, pol, units, "k-1")
		require.NoError(t, err)
		require.True(t, again.Replayed, "found in the previous bucket")
		require.Equal(t, first.EventID, again.EventID)
		require.Greater(t, again.Time.UnixMilli()/w.Milliseconds(), first.Time.UnixMilli()/w.Milliseconds())

		b.nextWindow(t, again.Time, w)
		late, err := b.decide(t, pol, units, "k-1")
		require.NoError(t, err)
		require.False(t, late.Replayed, "two buckets later the record is gone")
		require.NotEqual(t, first.EventID, late.EventID)

		usage, err := b.adm.Usage(testenv.Context(t, 10*time.Second), pol)
		require.NoError(t, err)
		require.Equal(t, int64(2), usage[policy.Requests].Used, "the first and the late one")
	})
}

// During an upgrade, a record of the layout before hot buckets (a bucket "<tag>i:<b>" as
// wide as the TTL) is honoured when the legacy lookup is on: the retry is replayed,
// charges nothing and becomes an attempt of that decision; a void of the replay releases
// only that attempt. With the lookup off, it is not seen.
func TestIdempotencyLegacyRecord(t *testing.T) {
	t.Parallel()
	for _, legacy := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[legacy], func(t *testing.T) {
			t.Parallel()
			forEachRedis(t, options{legacy: legacy}, func(t *testing.T, b *testBundle) {
				pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
					policy.Requests: withQuota(bucket(1000, 1000), 100, policy.Month),
				}})
				units := map[policy.Unit]int64{policy.Requests: 1}
				ctx := testenv.Context(t, 10*time.Second)
				now, err := b.rdb.Time(ctx).Result()
				require.NoError(t, err)
				old := b.adm.NewEventID(b.org)
				req := b.request(pol, "k-old")
				req.Units = units
				field, head := admission.IdempotencyRecord(req, old, "2026-10")
				key := b.keys.LegacyIdempotencyBucket(b.keys.Shard(b.org), now, keyspace.DefaultIdempotencyTTL)
				record := head + "\n" + old
				require.NoError(t, b.rdb.HSet(ctx, key, field, record).Err())
				require.NoError(t, b.rdb.Expire(ctx, key, time.Hour).Err())

				d, err := b.adm.Decide(ctx, req)
				require.NoError(t, err)
				usage, err := b.adm.Usage(ctx, pol)
				require.NoError(t, err)
				if !legacy {
					require.False(t, d.Replayed)
					require.NotEqual(t, old, d.EventID)
					require.Equal(t, int64(1), usage[policy.Requests].Used)
					return
				}
				require.True(t, d.Replayed)
				require.Equal(t, old, d.EventID)
				require.Equal(t, "2026-10", d.Period)
				require.Equal(t, int64(0), usage[policy.Requests].Used, "a replay charges nothing")
				got, err := b.rdb.HGet(ctx, key, field).Result()
				require.NoError(t, err)
				require.Equal(t, record+" ~"+req.EventID[:36], got, "the replay is an attempt of the old decision (its id short)")

				require.False(t, b.void(t, req, "unavailable"), "the first attempt may have been told 200")
				got, err = b.rdb.HGet(ctx, key, field).Result()
				require.NoError(t, err)
				require.Equal(t, record, got)

				_, err = b.decide(t, pol, map[policy.Unit]int64{policy.Requests: 2}, "k-old")
				require.ErrorIs(t, err, admission.ErrIdempotencyKeyReused)
			})
		})
	}
}
