// Package refusals is the refusal log: the latest requests refused by a limit (429, 402)
// of each org, kept in Redis for the console's "Why?" and account pages. Admissions are in
// the billing log; refusals are billed nowhere, so this is their only record.
//
// The gate tells a Log of each refusal on the decision path (gate.Refusals): Refused only
// queues it, and drops and counts it when the queue is full. One goroutine writes what is
// queued in batches, each refusal an entry of its org's stream (keyspace.Keys.Refusals),
// trimmed to about PerOrg entries and expiring TTL after the org's latest refusal, so the
// log's memory is bounded by construction (docs/admission.md, "The refusal log").
package refusals

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/gate"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/policy"
)

// The refusal log's defaults.
const (
	// DefaultQueue is how many refusals wait for Redis at most (about 2.5 MB of them).
	DefaultQueue = 10_000
	// DefaultPerOrg is about how many refusals an org's stream keeps.
	DefaultPerOrg = 100
	// DefaultTTL is how long an org's stream outlives its latest refusal.
	DefaultTTL = 24 * time.Hour
	// DefaultWriteTimeout bounds the write of one batch.
	DefaultWriteTimeout = 2 * time.Second
	// MaxBatch is the most refusals written in one pipeline.
	MaxBatch = 256
)

// Options configure a Log; the zero value takes the defaults.
type Options struct {
	Log        *slog.Logger
	Registerer prometheus.Registerer
	// Queue is how many refusals wait for Redis at most (DefaultQueue); past it, a refusal
	// is dropped and counted.
	Queue int
	// PerOrg is about how many refusals an org's stream keeps (DefaultPerOrg): XADD's
	// MAXLEN ~, which trims whole nodes of the stream, so it may hold up to a node more
	// (stream-node-max-entries, 100 by default).
	PerOrg int
	// TTL is how long an org's stream outlives its latest refusal (DefaultTTL).
	TTL time.Duration
	// WriteTimeout bounds the write of one batch (DefaultWriteTimeout).
	WriteTimeout time.Duration
}

// Log is the refusal log of a deployment: its writer (Refused, which implements
// gate.Refusals) and its readers (Recent, Find).
type Log struct {
	rdb   redis.UniversalClient
	keys  keyspace.Keys
	opts  Options
	queue chan gate.Refusal
	// closed makes Refused drop what comes after Close; stop ends the writer, which
	// closes done once it wrote what was queued. ctx ends the writer's calls when Close's
	// context ends first.
	closed atomic.Bool
	once   sync.Once
	stop   chan struct{}
	done   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc

	written    prometheus.Counter
	dropFull   prometheus.Counter
	dropRedis  prometheus.Counter
	dropClosed prometheus.Counter
	failing    bool // the writer's last batch failed (logged once per outage)
}

var _ gate.Refusals = (*Log)(nil)

// New returns a Log writing to rdb under keys' names, its writer started. Close it once
// the gate is closed.
func New(rdb redis.UniversalClient, keys keyspace.Keys, o Options) *Log {
	l := newLog(rdb, keys, o)
	go l.run()
	return l
}

// newLog is New without the writer (the tests start it when they want).
func newLog(rdb redis.UniversalClient, keys keyspace.Keys, o Options) *Log {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Queue <= 0 {
		o.Queue = DefaultQueue
	}
	if o.PerOrg <= 0 {
		o.PerOrg = DefaultPerOrg
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Log{rdb: rdb, keys: keys, opts: o, queue: make(chan gate.Refusal, o.Queue),
		stop: make(chan struct{}), done: make(chan struct{}), ctx: ctx, cancel: cancel,
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_refusal_log_written_total",
			Help: "Refusals by a limit written to the refusal log.",
		})}
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "metergate_refusal_log_dropped_total",
		Help: "Refusals by a limit the refusal log did not keep, by reason: queue_full (Redis could not keep up), redis (the write failed), closed (after admit began to stop).",
	}, []string{"reason"})
	// Resolved once: Refused counts a drop without a lookup or an allocation.
	l.dropFull, l.dropRedis, l.dropClosed = dropped.WithLabelValues("queue_full"),
		dropped.WithLabelValues("redis"), dropped.WithLabelValues("closed")
	o.Registerer.MustRegister(l.written, dropped)
	return l
}

// Refused queues r for the log, or drops and counts it when the queue is full or the Log
// is closed: it never blocks. Called by the gate for every refusal by a limit.
func (l *Log) Refused(r gate.Refusal) {
	if l.closed.Load() {
		l.dropClosed.Inc()
		return
	}
	select {
	case l.queue <- r:
	default:
		l.dropFull.Inc()
	}
}

// Close stops taking refusals and writes those queued; it returns when they are written,
// or with ctx's error when ctx ends first (what is left is dropped and counted).
func (l *Log) Close(ctx context.Context) error {
	l.once.Do(func() {
		l.closed.Store(true)
		close(l.stop)
	})
	select {
	case <-l.done:
		l.cancel()
		return nil
	case <-ctx.Done():
		l.cancel()
		return fmt.Errorf("close the refusal log: %w", ctx.Err())
	}
}

// run writes what is queued, in batches of up to MaxBatch, until Close; then what is left.
func (l *Log) run() {
	defer close(l.done)
	batch := make([]gate.Refusal, 0, MaxBatch)
	for {
		select {
		case r := <-l.queue:
			batch = l.fill(append(batch, r))
			l.write(batch)
			clear(batch) // let go of what the refusals hold
			batch = batch[:0]
		case <-l.stop:
			for batch = l.fill(batch); len(batch) > 0; batch = l.fill(batch[:0]) {
				l.write(batch)
				clear(batch)
			}
			return
		}
	}
}

// fill adds what is queued to batch, up to MaxBatch, without waiting.
func (l *Log) fill(batch []gate.Refusal) []gate.Refusal {
	for len(batch) < MaxBatch {
		select {
		case r := <-l.queue:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// write appends each refusal to its org's stream, trimmed to about PerOrg, and sets the
// stream's TTL once per batch: one pipeline (on a Cluster, one per node).
func (l *Log) write(batch []gate.Refusal) {
	ctx, cancel := context.WithTimeout(l.ctx, l.opts.WriteTimeout)
	defer cancel()
	pipe := l.rdb.Pipeline()
	adds := make([]*redis.StringCmd, len(batch))
	expiring := make(map[string]bool, 4)
	for i := range batch {
		key := l.keys.Refusals(batch[i].Org)
		adds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, MaxLen: int64(l.opts.PerOrg), Approx: true,
			Values: values(&batch[i])})
		expiring[key] = true
	}
	for key := range expiring {
		pipe.Expire(ctx, key, l.opts.TTL)
	}
	_, err := pipe.Exec(ctx)
	lost := 0
	for _, c := range adds {
		if c.Err() != nil {
			lost++
		}
	}
	l.written.Add(float64(len(batch) - lost))
	l.dropRedis.Add(float64(lost))
	switch {
	case err != nil && !l.failing:
		l.failing = true
		l.opts.Log.Warn("refusal log: writes to redis fail; refusals are dropped until they succeed",
			"lost", lost, "err", err)
	case err == nil && l.failing:
		l.failing = false
		l.opts.Log.Info("refusal log: writes to redis succeed again")
	}
}

// The fields of an entry, always all of them in this order: a stream stores the names
// of entries with the same fields once per node, so they cost next to nothing.
const (
	fTime       = "t"     // the decision's time, ms since the epoch
	fAccount    = "acct"  // the account charged (the org is the stream's)
	fAPIKey     = "key"   // the API key's id
	fIdem       = "idem"  // the idempotency key
	fStatus     = "st"    // 429 or 402
	fResult     = "res"   // rate_limited, quota_exceeded, insufficient_balance
	fBlockedBy  = "by"    // the blocking limit's account
	fLevel      = "lvl"   // its level
	fUnit       = "unit"  // its unit
	fRetryAfter = "retry" // ms; negative: never
	fPeriod     = "per"   // quota_exceeded: the spent quota's period
	fVia        = "via"   // the door
	fTool       = "tool"
	fUnits      = "units" // JSON: {"tokens": 1200}
)

// values is r as an entry's fields.
func values(r *gate.Refusal) []any {
	units, _ := json.Marshal(r.Units) // a map of strings to integers: cannot fail
	return []any{
		fTime, r.Time.UnixMilli(), fAccount, r.Account, fAPIKey, r.APIKeyID, fIdem, r.IdempotencyKey,
		fStatus, r.Status, fResult, string(r.Result), fBlockedBy, r.Blocked.Account, fLevel, string(r.Blocked.Level),
		fUnit, r.Blocked.Unit, fRetryAfter, r.RetryAfter.Milliseconds(), fPeriod, r.Period, fVia, r.Via,
		fTool, r.Tool, fUnits, units,
	}
}

// refusal reads an entry of org's stream. It takes what it can: a field missing or
// malformed (an entry of a later version) is left zero.
func refusal(org string, m redis.XMessage) gate.Refusal {
	str := func(f string) string { s, _ := m.Values[f].(string); return s }
	num := func(f string) int64 { n, _ := strconv.ParseInt(str(f), 10, 64); return n }
	r := gate.Refusal{
		Time: time.UnixMilli(num(fTime)).UTC(), Org: org, Account: str(fAccount), APIKeyID: str(fAPIKey),
		IdempotencyKey: str(fIdem), Status: int(num(fStatus)), Result: admission.Result(str(fResult)),
		Blocked:    admission.Blocker{Account: str(fBlockedBy), Level: policy.Kind(str(fLevel)), Unit: str(fUnit)},
		RetryAfter: time.Duration(num(fRetryAfter)) * time.Millisecond, Period: str(fPeriod), Via: str(fVia),
		Tool: str(fTool),
	}
	if u := str(fUnits); u != "" && u != "null" {
		_ = json.Unmarshal([]byte(u), &r.Units)
	}
	return r
}

// Recent returns up to limit of org's latest refusals, newest first (limit ≤ 0: every one
// the log holds).
func (l *Log) Recent(ctx context.Context, org string, limit int) ([]gate.Refusal, error) {
	key := l.keys.Refusals(org)
	var msgs []redis.XMessage
	var err error
	if limit > 0 {
		msgs, err = l.rdb.XRevRangeN(ctx, key, "+", "-", int64(limit)).Result()
	} else {
		msgs, err = l.rdb.XRevRange(ctx, key, "+", "-").Result()
	}
	if err != nil {
		return nil, fmt.Errorf("read the refusal log of %s: %w", org, err)
	}
	out := make([]gate.Refusal, len(msgs))
	for i, m := range msgs {
		out[i] = refusal(org, m)
	}
	return out, nil
}

// Find returns org's refusals of account with idempotencyKey, newest first: what "Why?"
// shows for a key (a key may be refused more than once). An empty account or key matches
// every one: Find(ctx, org, account, "") is an account's refusals. It reads the org's
// whole stream, which holds about PerOrg entries.
func (l *Log) Find(ctx context.Context, org, account, idempotencyKey string) ([]gate.Refusal, error) {
	all, err := l.Recent(ctx, org, 0)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, r := range all {
		if (account == "" || r.Account == account) && (idempotencyKey == "" || r.IdempotencyKey == idempotencyKey) {
			out = append(out, r)
		}
	}
	return out, nil
}
