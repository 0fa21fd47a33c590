package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/outbox"
	"github.com/metergate/metergate/internal/testenv"
)

// markBundle is a deployment's marks and hot buckets in Redis, its topic, and the meters'
// group, played by a consumer whose commits the test controls.
type markBundle struct {
	ctx     context.Context
	rdb     redis.UniversalClient
	keys    keyspace.Keys
	brokers []string
	topic   string
	group   string
	reader  *kafka.Reader
	writer  *kafka.Writer
	reg     *prometheus.Registry
}

const markHot, markTTL = time.Minute, 30 * time.Minute

func markSetup(t *testing.T, rdb redis.UniversalClient) *markBundle {
	t.Helper()
	b := &markBundle{
		ctx: testenv.Context(t, 2*time.Minute), rdb: rdb, keys: keyspace.Keys{Prefix: testenv.Prefix(t) + "mg", Shards: 2},
		brokers: testenv.KafkaBrokers(t), topic: testenv.Topic(t, 1), group: "g-" + testenv.Name(t), reg: prometheus.NewRegistry(),
	}
	b.writer = &kafka.Writer{Addr: kafka.TCP(b.brokers...), Topic: b.topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	b.reader = kafka.NewReader(kafka.ReaderConfig{Brokers: b.brokers, Topic: b.topic, GroupID: b.group, StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { _ = b.writer.Close(); _ = b.reader.Close() })
	return b
}

func (b *markBundle) marker(brokers []string, reg prometheus.Registerer) *outbox.Marker {
	return outbox.NewMarker(b.rdb, outbox.MarkOptions{Keys: b.keys, Hot: markHot, TTL: markTTL,
		Brokers: brokers, Topic: b.topic, Group: b.group, Registerer: reg})
}

// produce writes n events to the topic, acked by every in-sync replica.
func (b *markBundle) produce(t *testing.T, n int) {
	t.Helper()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte("org"), Value: []byte(strconv.Itoa(i))}
	}
	require.NoError(t, b.writer.WriteMessages(b.ctx, msgs...))
}

// consume reads n events as a meter and commits them.
func (b *markBundle) consume(t *testing.T, n int) {
	t.Helper()
	for range n {
		m, err := b.reader.FetchMessage(b.ctx)
		require.NoError(t, err)
		require.NoError(t, b.reader.CommitMessages(b.ctx, m))
	}
}

// redisNow is Redis TIME, ms.
func (b *markBundle) redisNow(t *testing.T) int64 {
	t.Helper()
	now, err := b.rdb.Time(b.ctx).Result()
	require.NoError(t, err)
	return now.UnixMilli()
}

// mark is the shard's mark, -1 for none.
func (b *markBundle) mark(t *testing.T, shard int) int64 {
	t.Helper()
	v, err := b.rdb.Get(b.ctx, b.keys.IdempotencyMark(shard)).Int64()
	if errors.Is(err, redis.Nil) {
		return -1
	}
	require.NoError(t, err)
	return v
}

// waiting adds an outbox entry of shard stamped at ms: an event not produced yet.
func (b *markBundle) waiting(t *testing.T, shard int, ms int64) string {
	t.Helper()
	id, err := b.rdb.XAdd(b.ctx, &redis.XAddArgs{Stream: b.keys.Outbox(shard), ID: fmt.Sprintf("%d-0", ms), Values: []any{"e", "x"}}).Result()
	require.NoError(t, err)
	return id
}

// buckets writes a record in each hot bucket of shard from lo to hi.
func (b *markBundle) buckets(t *testing.T, shard int, lo, hi int64) {
	t.Helper()
	for i := lo; i <= hi; i++ {
		require.NoError(t, b.rdb.HSet(b.ctx, b.keys.IdempotencyHotBucket(shard, i), "k", "r").Err())
		require.NoError(t, b.rdb.Expire(b.ctx, b.keys.IdempotencyHotBucket(shard, i), time.Hour).Err())
	}
}

func (b *markBundle) exists(t *testing.T, shard int, bucket int64) bool {
	t.Helper()
	n, err := b.rdb.Exists(b.ctx, b.keys.IdempotencyHotBucket(shard, bucket)).Result()
	require.NoError(t, err)
	return n == 1
}

// A mark moves once the meters' group has committed what was produced by the time it was
// read: to the oldest event still in the outbox (less the margin) or to Redis time; hot
// buckets wholly before it and before the previous bucket go, the others stay. While Kafka
// cannot be asked, nothing moves; a mark never moves back.
func TestMarkerMovesMarksOnceTheMeterCommitted(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := markSetup(t, rdb)
		hot := markHot.Milliseconds()
		start := b.redisNow(t)
		cur := start / hot
		entry := start - 5*60*1000 // waiting in shard 0's outbox for 5 minutes
		b.waiting(t, 0, entry)
		b.buckets(t, 0, cur-12, cur)
		b.buckets(t, 1, cur-12, cur)
		b.produce(t, 3)

		m := b.marker(b.brokers, b.reg)
		require.NoError(t, m.Pass(b.ctx))
		require.Equal(t, [2]int64{-1, -1}, [2]int64{b.mark(t, 0), b.mark(t, 1)}, "the meters have committed nothing: no mark")
		require.True(t, b.exists(t, 0, cur-12) && b.exists(t, 1, cur-12))

		b.consume(t, 3)
		down := b.marker([]string{testenv.FreeAddr(t)}, nil)
		require.Error(t, down.Pass(b.ctx), "Kafka cannot be asked")
		require.Equal(t, [2]int64{-1, -1}, [2]int64{b.mark(t, 0), b.mark(t, 1)}, "nothing moves while Kafka cannot be asked")

		require.NoError(t, m.Pass(b.ctx))
		end := b.redisNow(t)
		require.Equal(t, entry-1000, b.mark(t, 0), "shard 0: the oldest event not produced, less the margin")
		mark1 := b.mark(t, 1)
		require.GreaterOrEqual(t, mark1, start-1000, "shard 1: Redis time read by the pass, less the margin")
		require.LessOrEqual(t, mark1, end-1000)
		for shard, mark := range []int64{entry - 1000, mark1} {
			for i := cur - 12; i <= cur; i++ {
				switch {
				case i < min(mark/hot, cur-1):
					require.False(t, b.exists(t, shard, i), "shard %d bucket %d before the mark's: deleted", shard, i-cur)
				case i >= min(mark/hot, cur):
					require.True(t, b.exists(t, shard, i), "shard %d bucket %d: kept", shard, i-cur)
				}
			}
		}
		n, err := testutil.GatherAndCount(b.reg, "metergate_idempotency_buckets_swept_total")
		require.NoError(t, err)
		require.Equal(t, 1, n)
		families, err := b.reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "metergate_idempotency_buckets_swept_total" {
				require.Positive(t, f.GetMetric()[0].GetCounter().GetValue())
			}
		}

		// Another marker's mark further on stays.
		later := end + time.Hour.Milliseconds()
		require.NoError(t, b.rdb.Set(b.ctx, b.keys.IdempotencyMark(1), later, 0).Err())
		require.NoError(t, m.Pass(b.ctx))
		require.Equal(t, later, b.mark(t, 1), "never back")
		ttl, err := b.rdb.PTTL(b.ctx, b.keys.IdempotencyMark(0)).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, markTTL-6*time.Minute, "a mark expires once older than the TTL")
		require.LessOrEqual(t, ttl, markTTL)
	})
}

// A meter that lags: the marks move to the newest observation whose end offsets the group
// has committed, not further.
func TestMarkerWaitsForTheMeter(t *testing.T) {
	t.Parallel()
	b := markSetup(t, testenv.Redis(t))
	first := b.redisNow(t) - 60_000
	id := b.waiting(t, 0, first)
	b.produce(t, 2)
	m := b.marker(b.brokers, b.reg)
	require.NoError(t, m.Pass(b.ctx)) // observes: shard 0 at first, ends at 2
	require.Equal(t, int64(-1), b.mark(t, 0))

	require.NoError(t, b.rdb.XDel(b.ctx, b.keys.Outbox(0), id).Err()) // produced and trimmed
	b.produce(t, 2)
	b.consume(t, 2)
	require.NoError(t, m.Pass(b.ctx)) // observes shard 0 at Redis time, ends at 4; 2 committed
	require.Equal(t, first-1000, b.mark(t, 0), "the first observation's mark: the meter has what was produced before it")

	b.consume(t, 2)
	before := b.redisNow(t)
	require.NoError(t, m.Pass(b.ctx))
	require.GreaterOrEqual(t, b.mark(t, 0), before-1000, "caught up: Redis time")
}
