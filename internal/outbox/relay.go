package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/lua"
)

// Producer writes messages to Kafka synchronously: nil means every message was acked by
// every in-sync replica. Writer is one.
type Producer interface {
	Produce(ctx context.Context, msgs []kafka.Message) error
}

// The relay's defaults.
const (
	// DefaultRelayBatch is the most entries produced per Kafka write.
	DefaultRelayBatch = 500
	// DefaultClaimAfter is how long an entry read by another relay stays unacknowledged
	// before this one takes it over.
	DefaultClaimAfter = 30 * time.Second
)

// RelayOptions configure a Relay. Zero values take the defaults named.
type RelayOptions struct {
	// Keys names the outbox streams (one per shard).
	Keys keyspace.Keys
	// Group is the Redis consumer group of the relays ("relay").
	Group string
	// Consumer names this relay in the group (the admit node's name). A relay restarted
	// under the same name first sends what it had read and not yet acknowledged.
	Consumer string
	// WaitReplicas, when above 0, holds every batch back until that many replicas hold
	// what it was read from (keyspace.WaitReplicated, at most WaitTimeout each try):
	// nothing reaches Kafka that a failover could take back from Redis. admit sets them
	// from ADMIT_REDIS_WAIT_REPLICAS and ADMIT_REDIS_WAIT_TIMEOUT.
	WaitReplicas int
	WaitTimeout  time.Duration
	// Batch is the most entries produced per Kafka write (500).
	Batch int
	// Block is how long one read waits for new entries (1s).
	Block time.Duration
	// ClaimAfter is how long an entry may stay read and unacknowledged by another relay
	// before this one takes it over (30s): that relay is taken for dead.
	ClaimAfter time.Duration
	// MaxBackoff caps the wait between retries of a failed Kafka write (5s).
	MaxBackoff time.Duration
	// ForgetAfter is how long another consumer of the group may stay idle, holding no
	// entry, before this relay deletes it (1h): the consumers of pods that are gone would
	// otherwise pile up in the group with every deployment.
	ForgetAfter time.Duration
	Log         *slog.Logger
	Registerer  prometheus.Registerer
}

// Relay moves usage events from the Redis outbox streams to Kafka. Per shard it reads the
// stream through a consumer group, produces the events synchronously with acks from every
// in-sync replica, and only then acknowledges them and trims the stream below the oldest
// entry still pending for any relay (lua/relay_ack.lua). A crash between the two
// produces an event twice, which the meter deduplicates by event id; nothing is lost.
type Relay struct {
	rdb     redis.UniversalClient
	out     Producer
	opts    RelayOptions
	metrics *relayMetrics
}

// NewRelay returns a relay from the outbox streams in rdb to out. rdb should have a
// connection pool of its own, of at least 2 × Keys.Shards + 2 connections: every stream blocks
// one connection while it waits for entries.
func NewRelay(rdb redis.UniversalClient, out Producer, o RelayOptions) *Relay {
	if o.Group == "" {
		o.Group = "relay"
	}
	if o.Consumer == "" {
		o.Consumer = "relay"
	}
	if o.Batch <= 0 {
		o.Batch = DefaultRelayBatch
	}
	if o.Block <= 0 {
		o.Block = time.Second
	}
	if o.ForgetAfter <= 0 {
		o.ForgetAfter = time.Hour
	}
	if o.ClaimAfter <= 0 {
		o.ClaimAfter = DefaultClaimAfter
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 5 * time.Second
	}
	if o.WaitTimeout <= 0 {
		o.WaitTimeout = keyspace.DefaultWaitTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	r := &Relay{rdb: rdb, out: out, opts: o}
	r.metrics = newRelayMetrics(o.Registerer, r)
	return r
}

// Run relays every shard until ctx ends. It returns nil on cancellation: what was read and
// not yet produced stays pending in Redis and is sent again after a restart.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for shard := range r.opts.Keys.Shards {
		for _, stream := range r.opts.Keys.Outboxes(shard) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.runStream(ctx, stream)
			}()
		}
	}
	wg.Wait()
	return nil
}

func (r *Relay) runStream(ctx context.Context, stream string) {
	log := r.opts.Log.With("stream", stream)
	backoff := newBackoff(r.opts.MaxBackoff)
	r.createGroup(ctx, log, stream, backoff)
	pending := true // first what this consumer read before a restart and never acknowledged
	// trimmed: no acknowledgement since the last full trim. A batch trims below itself;
	// what other relays acknowledged above it goes at the next full trim, when idle.
	trimmed := false
	var lastClaim, lastForget time.Time
	for ctx.Err() == nil {
		if time.Since(lastForget) >= r.opts.ForgetAfter/4 {
			lastForget = time.Now()
			r.forgetConsumers(ctx, log, stream)
		}
		entries, recovered, err := r.next(ctx, stream, &pending, &lastClaim)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("read the outbox", "err", err)
			r.metrics.errors.WithLabelValues("redis").Inc()
			backoff.wait(ctx)
			if isNoGroup(err) {
				// Redis lost the group (restarted empty, or the stream was deleted) while
				// admissions go on writing to the stream: make it again from the stream's
				// start, so every entry written since is produced.
				r.createGroup(ctx, log, stream, backoff)
			}
			// Whatever failed, the server answering next may not be the one that failed:
			// a replica promoted in a failover holds as this consumer's pending entries
			// those it read before the failover but whose acknowledgement it never got.
			// Read them first rather than leave them to the claim, ClaimAfter later.
			pending = true
			continue
		}
		backoff.reset()
		switch {
		case len(entries) > 0:
			if !r.deliver(ctx, log, stream, entries, recovered) {
				pending = true // as after a failed read
			}
			trimmed = recovered
		case !trimmed:
			if err := r.ackAndTrim(ctx, stream, nil, true); err == nil {
				trimmed = true
			}
		}
	}
}

// createGroup makes the relay's consumer group on the stream (and the stream), reading from
// its first entry, retrying until it exists or ctx ends.
func (r *Relay) createGroup(ctx context.Context, log *slog.Logger, stream string, backoff *backoff) {
	for ctx.Err() == nil {
		err := r.rdb.XGroupCreateMkStream(ctx, stream, r.opts.Group, "0").Err()
		if err == nil || strings.HasPrefix(err.Error(), "BUSYGROUP") {
			return
		}
		log.Warn("create the relay's consumer group", "err", err)
		backoff.wait(ctx)
	}
}

// forgetConsumers deletes the group's other consumers that have been idle for ForgetAfter
// and hold no entry. The check of their pending entries and the delete are one script, so
// nothing they hold can be orphaned; what a dead relay still holds is claimed first
// (ClaimAfter), and its consumer goes on a later pass.
func (r *Relay) forgetConsumers(ctx context.Context, log *slog.Logger, stream string) {
	consumers, err := r.rdb.XInfoConsumers(ctx, stream, r.opts.Group).Result()
	if err != nil {
		return // the next read reports Redis' state
	}
	for _, c := range consumers {
		if c.Name == r.opts.Consumer || c.Pending > 0 || c.Idle < r.opts.ForgetAfter {
			continue
		}
		n, err := lua.ForgetConsumer.Run(ctx, r.rdb, []string{stream}, r.opts.Group, c.Name).Int()
		if err != nil {
			log.Warn("forget an idle relay consumer", "consumer", c.Name, "err", err)
			return
		}
		if n == 1 {
			r.metrics.forgotten.Inc()
			log.Info("forgot an idle relay consumer", "consumer", c.Name, "idle", c.Idle)
		}
	}
}

// isNoGroup reports whether err is Redis saying the stream or its consumer group is gone.
func isNoGroup(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "NOGROUP")
}

// next returns the next entries to produce: entries another relay left unacknowledged for
// ClaimAfter (checked every ClaimAfter/2), then this consumer's own pending entries, then
// new ones (waiting up to Block for them). recovered tells the first two.
func (r *Relay) next(ctx context.Context, stream string, pending *bool, lastClaim *time.Time) (
	msgs []redis.XMessage, recovered bool, err error) {
	if time.Since(*lastClaim) >= r.opts.ClaimAfter/2 {
		*lastClaim = time.Now()
		msgs, _, err := r.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: stream, Group: r.opts.Group, Consumer: r.opts.Consumer,
			MinIdle: r.opts.ClaimAfter, Start: "0-0", Count: int64(r.opts.Batch),
		}).Result()
		if err != nil {
			return nil, false, fmt.Errorf("claim idle entries: %w", err)
		}
		if len(msgs) > 0 {
			r.metrics.claimed.Add(float64(len(msgs)))
			return msgs, true, nil
		}
	}
	args := &redis.XReadGroupArgs{
		Group: r.opts.Group, Consumer: r.opts.Consumer, Streams: []string{stream, ">"},
		Count: int64(r.opts.Batch), Block: r.opts.Block,
	}
	if *pending {
		args.Streams[1], args.Block = "0", -1 // own pending entries, without waiting
	}
	res, err := r.rdb.XReadGroup(ctx, args).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("read new entries: %w", err)
	}
	for _, s := range res {
		msgs = append(msgs, s.Messages...)
	}
	recovered = *pending
	if *pending && len(msgs) == 0 {
		*pending = false
	}
	return msgs, recovered, nil
}

// deliver produces entries until Kafka acks them all (a timeout is an unknown outcome:
// produce again, the meter deduplicates), then acknowledges them and trims the stream.
// It reports false when Redis failed on the way: the replicas could not be asked, or an
// acknowledgement failed.
func (r *Relay) deliver(ctx context.Context, log *slog.Logger, stream string, entries []redis.XMessage, full bool) bool {
	msgs := make([]kafka.Message, 0, len(entries))
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		ids = append(ids, e.ID)
		if e.Values == nil { // deleted after it was read: nothing left to send
			continue
		}
		// A compact usage event is rendered as its CloudEvent JSON (an entry may hold the
		// events of one script call); other entries are sent as written. A malformed
		// entry is sent as it is: the meter keeps it in dead_letters.
		for _, m := range wire.OutboxMessages(e.Values) {
			if m.Err != nil {
				log.Warn("relay a malformed outbox entry as it is", "id", e.ID, "err", m.Err)
			}
			msgs = append(msgs, message(m.Key, m.Value))
		}
	}
	backoff := newBackoff(r.opts.MaxBackoff)
	for r.opts.WaitReplicas > 0 && len(msgs) > 0 {
		// A void relayed from a primary that then dies unreplicated would cancel a
		// decision the promoted replica still holds, and may replay to a caller as 200.
		err := keyspace.WaitReplicated(ctx, r.rdb, stream, r.opts.WaitReplicas, r.opts.WaitTimeout)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return true // still pending
		}
		r.metrics.errors.WithLabelValues("redis").Inc()
		log.Warn("relayed entries not on enough replicas yet; waiting", "events", len(msgs), "err", err)
		if !errors.Is(err, keyspace.ErrNotReplicated) {
			return false // Redis failed (a failover?): read again, own pending entries first
		}
		backoff.wait(ctx)
	}
	backoff.reset()
	for len(msgs) > 0 {
		start := time.Now()
		err := r.out.Produce(ctx, msgs)
		r.metrics.batch.Observe(time.Since(start).Seconds())
		if err == nil {
			r.metrics.produced.Add(float64(len(msgs)))
			break
		}
		if ctx.Err() != nil {
			return true // still pending: sent after a restart, or claimed by another relay
		}
		r.metrics.errors.WithLabelValues("kafka").Inc()
		log.Warn("produce to kafka; retrying", "events", len(msgs), "err", err)
		backoff.wait(ctx)
	}
	clean := true
	for ctx.Err() == nil {
		// Acknowledge, and trim the stream below what any relay still holds (never an
		// entry not produced): one call, far cheaper for Redis than XDEL of each id.
		err := r.ackAndTrim(ctx, stream, ids, full)
		if err == nil {
			return clean
		}
		clean = false
		if isNoGroup(err) {
			// Redis lost the group, and with it what the batch was read from (restarted
			// without persistence): nothing is left to acknowledge. The next read makes
			// the group again.
			r.metrics.errors.WithLabelValues("redis").Inc()
			log.Warn("acknowledge relayed entries: the consumer group is gone", "err", err)
			return false
		}
		// Produced but not acknowledged: produced again later, deduplicated by the meter.
		r.metrics.errors.WithLabelValues("redis").Inc()
		log.Warn("acknowledge relayed entries; retrying", "err", err)
		backoff.wait(ctx)
	}
	return clean
}

// ackAndTrim acknowledges ids and trims the stream below the oldest entry any relay of the
// group holds (lua/relay_ack.lua); full also trims what other relays acknowledged above
// ids when nothing is pending (no ids: trim only).
func (r *Relay) ackAndTrim(ctx context.Context, stream string, ids []string, full bool) error {
	args := make([]any, 0, 3+len(ids))
	flag := "0"
	if full {
		flag = "1"
	}
	args = append(args, r.opts.Group, nextID(ids), flag)
	for _, id := range ids {
		args = append(args, id)
	}
	if err := lua.RelayAck.Run(ctx, r.rdb, []string{stream}, args...).Err(); err != nil {
		return fmt.Errorf("acknowledge and trim: %w", err)
	}
	return nil
}

// nextID returns the stream id just after the highest of ids ("<ms>-<seq>"), "0-0" for
// none.
func nextID(ids []string) string {
	var hiMS, hiSeq uint64
	for _, id := range ids {
		m, s, _ := strings.Cut(id, "-")
		ms, err1 := strconv.ParseUint(m, 10, 64)
		seq, err2 := strconv.ParseUint(s, 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if ms > hiMS || ms == hiMS && seq >= hiSeq {
			hiMS, hiSeq = ms, seq
		}
	}
	if len(ids) == 0 {
		return "0-0"
	}
	return strconv.FormatUint(hiMS, 10) + "-" + strconv.FormatUint(hiSeq+1, 10)
}

// OldestAge returns how long the oldest entry of any outbox stream has waited (by Redis
// TIME; an entry id starts with its Redis time in milliseconds), 0 when all are empty.
func (r *Relay) OldestAge(ctx context.Context) (time.Duration, error) {
	now, err := r.rdb.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("read redis time: %w", err)
	}
	ages, err := r.ages(ctx, now)
	if err != nil {
		return 0, err
	}
	var oldest time.Duration
	for _, a := range ages {
		oldest = max(oldest, a)
	}
	return oldest, nil
}

func (r *Relay) ages(ctx context.Context, now time.Time) ([]time.Duration, error) {
	pipe := r.rdb.Pipeline()
	cmds := make([][]*redis.XMessageSliceCmd, r.opts.Keys.Shards) // per shard, per stream
	for s := range cmds {
		for _, stream := range r.opts.Keys.Outboxes(s) {
			cmds[s] = append(cmds[s], pipe.XRangeN(ctx, stream, "-", "+", 1))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read the oldest outbox entries: %w", err)
	}
	ages := make([]time.Duration, len(cmds)) // per shard: the oldest of its streams
	for s, cs := range cmds {
		for _, c := range cs {
			msgs := c.Val()
			if len(msgs) == 0 {
				continue
			}
			ms, _, _ := strings.Cut(msgs[0].ID, "-")
			t, err := strconv.ParseInt(ms, 10, 64)
			if err != nil {
				continue
			}
			ages[s] = max(ages[s], now.Sub(time.UnixMilli(t)))
		}
	}
	return ages, nil
}

// backoff doubles a wait from 50 ms up to a cap.
type backoff struct {
	next, limit time.Duration
}

func newBackoff(limit time.Duration) *backoff {
	return &backoff{next: 50 * time.Millisecond, limit: limit}
}

func (b *backoff) reset() { b.next = 50 * time.Millisecond }

func (b *backoff) wait(ctx context.Context) {
	t := time.NewTimer(b.next)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	b.next = min(2*b.next, b.limit)
}

type relayMetrics struct {
	produced  prometheus.Counter
	claimed   prometheus.Counter
	forgotten prometheus.Counter
	errors    *prometheus.CounterVec
	batch     prometheus.Histogram
}

var outboxAge = prometheus.NewDesc("metergate_outbox_oldest_age_seconds",
	"Age of the oldest entry of the shard's outbox stream (0 when empty): how far the relay is behind.",
	[]string{"shard"}, nil)

func newRelayMetrics(reg prometheus.Registerer, r *Relay) *relayMetrics {
	m := &relayMetrics{
		produced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_relay_produced_total",
			Help: "Usage events produced to Kafka and acked by every in-sync replica (redeliveries included).",
		}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_relay_claimed_total",
			Help: "Outbox entries taken over from a relay that left them unacknowledged past the claim bound.",
		}),
		forgotten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_relay_consumers_forgotten_total",
			Help: "Idle relay consumers holding no entry (pods that are gone) deleted from the outbox group.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metergate_relay_errors_total",
			Help: "Failed relay operations, by the service that failed (kafka, redis); each is retried.",
		}, []string{"service"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metergate_relay_produce_seconds",
			Help:    "Duration of one synchronous Kafka write of a batch of outbox entries.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.produced, m.claimed, m.forgotten, m.errors, m.batch, &ageCollector{r: r})
	}
	return m
}

type ageCollector struct{ r *Relay }

func (c *ageCollector) Describe(ch chan<- *prometheus.Desc) { ch <- outboxAge }

func (c *ageCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	now, err := c.r.rdb.Time(ctx).Result()
	if err != nil {
		return
	}
	ages, err := c.r.ages(ctx, now)
	if err != nil {
		return
	}
	for s, a := range ages {
		ch <- prometheus.MustNewConstMetric(outboxAge, prometheus.GaugeValue, a.Seconds(), strconv.Itoa(s))
	}
}
