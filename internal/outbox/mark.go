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
	"github.com/metergate/metergate/lua"
)

// DefaultMarkEvery is the time between two passes of a Marker.
const DefaultMarkEvery = 10 * time.Second

// MarkOptions configure a Marker. Zero values take the defaults named.
type MarkOptions struct {
	// Keys names the marks, hot buckets and outbox streams (admit's).
	Keys keyspace.Keys
	// Hot is the hot window H and TTL the idempotency TTL: admit's IdempotencyHot and
	// IdempotencyTTL (keyspace's defaults).
	Hot, TTL time.Duration
	// Brokers, Topic and Group are the Kafka cluster, the usage events' topic and the
	// meters' consumer group, whose committed offsets tell what is in PostgreSQL.
	Brokers []string
	Topic   string
	Group   string
	// Every is the time between two passes (10s).
	Every time.Duration
	// Timeout bounds one pass (10s).
	Timeout    time.Duration
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// markMargin is taken off each mark: Redis stamps an outbox entry's id from its clock when
// the admission script runs, the event time from TIME in the same script; the margin covers
// the script's own run and a small step of Redis' clock between the two.
const markMargin = time.Second

// maxSweep bounds the hot buckets one pass deletes per shard: the newest of those passed.
// Older ones (a first pass with H far below the TTL) expire at their end plus the TTL.
const maxSweep = 4096

// maxCandidates bounds the observations waiting for the meter to catch up: when it lags
// further, the oldest are kept (each one it passes moves the marks) and no new one is made.
const maxCandidates = 64

// Marker is the idempotency janitor: it moves each shard's mark (keyspace.Keys.
// IdempotencyMark) forward to a time T before which every event the shard admitted is in
// the billing log, and deletes the hot buckets the mark passed (docs/admission.md,
// "Idempotency"). A pass reads, per shard and in one snapshot, Redis TIME and the oldest
// entry of its outbox streams: T is the earlier of the two (less markMargin), so every
// event admitted before T has left the outbox, produced to Kafka with acks from every
// in-sync replica. It then takes the topic's end offsets. Once the meters' group has
// committed offsets at or past them (the meter commits after PostgreSQL commits), every
// such event is in usage_events, and the marks move to T: at once when the meter keeps up,
// at a later pass when it lags. While Kafka is down nothing moves, so the hot window
// stretches over the outage. Several markers (one per relay) may run: a mark never moves
// back (lua/mark_move.lua).
type Marker struct {
	rdb     redis.UniversalClient
	kafka   *kafka.Client
	opts    MarkOptions
	metrics *markMetrics

	mu         sync.Mutex
	candidates []candidate // oldest first
}

// candidate is one pass's observation: the marks it allows once the group has committed
// the end offsets taken after them.
type candidate struct {
	shards []shardMark
	ends   map[int]int64 // partition -> end offset
}

// shardMark is what a pass read of one shard and the mark it computed.
type shardMark struct {
	now, old, mark int64 // ms: Redis TIME, the mark then (-1: none), the mark allowed
}

// NewMarker returns a janitor of the marks in rdb.
func NewMarker(rdb redis.UniversalClient, o MarkOptions) *Marker {
	if o.Hot <= 0 {
		o.Hot = keyspace.DefaultIdempotencyHot
	}
	if o.TTL <= 0 {
		o.TTL = keyspace.DefaultIdempotencyTTL
	}
	if o.Every <= 0 {
		o.Every = DefaultMarkEvery
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	m := &Marker{rdb: rdb, opts: o, kafka: &kafka.Client{Addr: kafka.TCP(o.Brokers...), Timeout: o.Timeout}}
	m.metrics = newMarkMetrics(o.Registerer)
	return m
}

// Run makes a pass every Every until ctx ends; a failed pass is logged and the next one
// tries again. It returns nil on cancellation.
func (m *Marker) Run(ctx context.Context) error {
	t := time.NewTicker(m.opts.Every)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
		err := m.Pass(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			m.opts.Log.Warn("move the idempotency marks", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Pass observes every shard, then moves the marks of the newest observation the meters
// have caught up with, and deletes the hot buckets they passed.
func (m *Marker) Pass(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.observe(ctx)
	if err != nil {
		return err
	}
	if len(m.candidates) < maxCandidates {
		m.candidates = append(m.candidates, c)
	}
	committed, err := m.committed(ctx, c.ends)
	if err != nil {
		m.metrics.errors.WithLabelValues("kafka").Inc()
		return err
	}
	for shard, s := range c.shards {
		m.metrics.markAge(shard, s.now, s.old)
	}
	i := newestCaughtUp(m.candidates, committed)
	if i < 0 {
		return nil
	}
	ready := m.candidates[i]
	m.candidates = append(m.candidates[:0], m.candidates[i+1:]...)
	var errs []error
	for shard, s := range ready.shards {
		mark, err := m.move(ctx, shard, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.metrics.markAge(shard, c.shards[shard].now, mark)
	}
	if err := errors.Join(errs...); err != nil {
		m.metrics.errors.WithLabelValues("redis").Inc()
		return err
	}
	return nil
}

// observe reads every shard (lua/mark_read.lua), then the topic's end offsets: an event
// admitted before a shard's mark was produced before they were taken.
func (m *Marker) observe(ctx context.Context) (candidate, error) {
	k := m.opts.Keys
	c := candidate{shards: make([]shardMark, k.Shards)}
	for shard := range k.Shards {
		keys := append([]string{k.IdempotencyMark(shard)}, k.Outboxes(shard)...)
		res, err := lua.MarkRead.Run(ctx, m.rdb, keys).StringSlice()
		if err != nil {
			m.metrics.errors.WithLabelValues("redis").Inc()
			return candidate{}, fmt.Errorf("read the idempotency mark of shard %d: %w", shard, err)
		}
		s, err := readShard(res)
		if err != nil {
			return candidate{}, fmt.Errorf("read the idempotency mark of shard %d: %w", shard, err)
		}
		c.shards[shard] = s
	}
	ends, err := m.ends(ctx)
	if err != nil {
		m.metrics.errors.WithLabelValues("kafka").Inc()
		return candidate{}, err
	}
	c.ends = ends
	return c, nil
}

// readShard computes a shard's mark from mark_read.lua's reply: the earlier of Redis TIME
// and each outbox stream's oldest entry, less markMargin.
func readShard(res []string) (shardMark, error) {
	if len(res) < 3 {
		return shardMark{}, fmt.Errorf("mark_read.lua replied %q", res)
	}
	sec, err1 := strconv.ParseInt(res[0], 10, 64)
	usec, err2 := strconv.ParseInt(res[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return shardMark{}, fmt.Errorf("redis time %q: %w", res[:2], err)
	}
	s := shardMark{now: sec*1000 + usec/1000, old: -1}
	if res[2] != "" {
		if s.old, err1 = strconv.ParseInt(res[2], 10, 64); err1 != nil {
			return shardMark{}, fmt.Errorf("mark %q: %w", res[2], err1)
		}
	}
	s.mark = s.now
	for _, id := range res[3:] {
		if id == "" {
			continue
		}
		ms, _, _ := strings.Cut(id, "-")
		t, err := strconv.ParseInt(ms, 10, 64)
		if err != nil {
			return shardMark{}, fmt.Errorf("outbox entry id %q: %w", id, err)
		}
		s.mark = min(s.mark, t)
	}
	s.mark -= markMargin.Milliseconds()
	return s, nil
}

// ends returns the end offset of every partition of the topic (the next offset to be
// written: every message acked by the in-sync replicas is below it).
func (m *Marker) ends(ctx context.Context) (map[int]int64, error) {
	meta, err := m.kafka.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{m.opts.Topic}})
	if err != nil {
		return nil, fmt.Errorf("kafka metadata of %s: %w", m.opts.Topic, err)
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil || len(meta.Topics[0].Partitions) == 0 {
		var cause error
		if len(meta.Topics) == 1 {
			cause = meta.Topics[0].Error
		}
		return nil, fmt.Errorf("kafka metadata of %s: no partitions: %w", m.opts.Topic, cause)
	}
	reqs := make([]kafka.OffsetRequest, 0, len(meta.Topics[0].Partitions))
	for _, p := range meta.Topics[0].Partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p.ID))
	}
	res, err := m.kafka.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{m.opts.Topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", m.opts.Topic, err)
	}
	ends := make(map[int]int64, len(reqs))
	for _, p := range res.Topics[m.opts.Topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("end offset of %s/%d: %w", m.opts.Topic, p.Partition, p.Error)
		}
		ends[p.Partition] = p.LastOffset
	}
	if len(ends) != len(reqs) {
		return nil, fmt.Errorf("end offsets of %s: %d of %d partitions", m.opts.Topic, len(ends), len(reqs))
	}
	return ends, nil
}

// committed returns the meters' group's committed offset of the partitions of ends (-1:
// none yet).
func (m *Marker) committed(ctx context.Context, ends map[int]int64) (map[int]int64, error) {
	parts := make([]int, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	res, err := m.kafka.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: m.opts.Group, Topics: map[string][]int{m.opts.Topic: parts}})
	if err != nil {
		return nil, fmt.Errorf("committed offsets of group %s: %w", m.opts.Group, err)
	}
	if res.Error != nil {
		return nil, fmt.Errorf("committed offsets of group %s: %w", m.opts.Group, res.Error)
	}
	out := make(map[int]int64, len(parts))
	for _, p := range res.Topics[m.opts.Topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("committed offset of group %s on %s/%d: %w", m.opts.Group, m.opts.Topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out, nil
}

// newestCaughtUp returns the index of the newest candidate whose end offsets the group has
// committed on every partition, -1 for none. Committed offsets are the next to read: an
// offset below one is in PostgreSQL.
func newestCaughtUp(cs []candidate, committed map[int]int64) int {
	for i := len(cs) - 1; i >= 0; i-- {
		if caughtUp(cs[i].ends, committed) {
			return i
		}
	}
	return -1
}

func caughtUp(ends, committed map[int]int64) bool {
	for p, end := range ends {
		c, ok := committed[p]
		if !ok || max(c, 0) < end {
			return false
		}
	}
	return true
}

// move sets the shard's mark to s.mark unless it is further already, and deletes the hot
// buckets the mark passed. It returns the mark now.
func (m *Marker) move(ctx context.Context, shard int, s shardMark) (int64, error) {
	k := m.opts.Keys
	lo, hi := sweep(s, m.opts.Hot.Milliseconds(), m.opts.TTL.Milliseconds())
	keys := make([]string, 0, 1+max(0, hi-lo))
	keys = append(keys, k.IdempotencyMark(shard))
	for b := lo; b < hi; b++ {
		keys = append(keys, k.IdempotencyHotBucket(shard, b))
	}
	res, err := lua.MarkMove.Run(ctx, m.rdb, keys, s.mark, m.opts.TTL.Milliseconds()).Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("move the idempotency mark of shard %d: %w", shard, err)
	}
	if len(res) != 2 {
		return 0, fmt.Errorf("move the idempotency mark of shard %d: mark_move.lua replied %v", shard, res)
	}
	m.metrics.swept.Add(float64(res[1]))
	return res[0], nil
}

// sweep returns the hot buckets [lo, hi) to delete once the shard's mark is s.mark: those
// wholly before both the mark's bucket and the bucket before the current one (admit.lua
// looks in those two at least). lo is where the previous mark left off (its own rule kept
// the bucket before its own at most), else the oldest a record may be in (a bucket expires
// at its end plus the TTL); at most maxSweep of the newest are deleted.
func sweep(s shardMark, hot, ttl int64) (lo, hi int64) {
	hi = min(floorDiv(s.mark, hot), floorDiv(s.now, hot)-1)
	if s.old >= 0 {
		lo = floorDiv(s.old, hot) - 1
	} else {
		lo = floorDiv(s.now-ttl, hot) - 1
	}
	lo = max(lo, hi-maxSweep)
	if lo > hi {
		lo = hi
	}
	return lo, hi
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

type markMetrics struct {
	swept  prometheus.Counter
	errors *prometheus.CounterVec
	age    *prometheus.GaugeVec
}

func newMarkMetrics(reg prometheus.Registerer) *markMetrics {
	m := &markMetrics{
		swept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_idempotency_buckets_swept_total",
			Help: "Hot idempotency buckets deleted once their shard's mark passed them (their events are in the billing log).",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metergate_idempotency_mark_errors_total",
			Help: "Failed passes of the idempotency janitor, by the service that failed (kafka, redis); the next pass retries.",
		}, []string{"service"}),
		age: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "metergate_idempotency_mark_age_seconds",
			Help: "How far the shard's idempotency mark is behind Redis time at the last pass (-1: no mark): Redis holds its records exactly over this age plus the hot window.",
		}, []string{"shard"}),
	}
	if reg != nil {
		reg.MustRegister(m.swept, m.errors, m.age)
	}
	return m
}

// markAge sets the shard's mark age at Redis time now (mark -1: none).
func (m *markMetrics) markAge(shard int, now, mark int64) {
	age := -1.0
	if mark >= 0 {
		age = float64(now-mark) / 1000
	}
	m.age.WithLabelValues(strconv.Itoa(shard)).Set(age)
}
