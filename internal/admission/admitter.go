package admission

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
)

// The engine's own defaults.
const (
	// DefaultLeaseTTL is how long a concurrency slot is held when no outcome releases it.
	DefaultLeaseTTL = time.Minute
	// DefaultIdempotencyFilterBits sizes an idempotency filter (1 MiB): about 870,000 keys
	// per shard and half TTL at 1 % false positives (docs/deploy.md sizes it for a load).
	DefaultIdempotencyFilterBits = 1 << 23
	// DefaultPipeline is the most script calls in flight per shard. Two form larger
	// batches under load than four: measured with make bench (docs/bench.md), 8 decisions
	// per call against 5, about a fifth less Redis CPU per decision and a fifth more
	// decisions per second, for a longer p99 close to saturation.
	DefaultPipeline = 2
	// DefaultMaxBatch is the most decisions of one shard per script call.
	DefaultMaxBatch = 16
)

// Options configure an Admitter. Zero values take the defaults named.
type Options struct {
	// KeyPrefix starts every Redis key ("mg").
	KeyPrefix string
	// Shards is the number of hash-tag shards (16); fixed for the life of a deployment.
	Shards int
	// IdempotencyTTL is how long a retry is charged once (24h) (docs/admission.md,
	// "Idempotency"). Without an IdempotencyLog, records are kept in Redis in time-bucket
	// hashes TTL wide, looked up in the current and the previous one, so a retry within
	// the TTL is charged once and one between TTL and 2 TTL may or may not be.
	IdempotencyTTL time.Duration
	// IdempotencyLog answers for keys older than the hot window: with it, Redis keeps
	// records exactly for IdempotencyHot (and until the shard's mark says their events are
	// in the log) and each key's bits in a Bloom filter for the TTL (idemlog.go).
	IdempotencyLog IdempotencyLog
	// IdempotencyHot is the hot window H (DefaultIdempotencyHot), with an IdempotencyLog.
	IdempotencyHot time.Duration
	// IdempotencyFilterBits is the size of one idempotency filter, in bits
	// (DefaultIdempotencyFilterBits): a shard has one per half TTL, and a filter holds
	// about IdempotencyFilterBits / 9.6 keys at 1 % false positives (each one a lookup in
	// the log).
	IdempotencyFilterBits uint64
	// IdempotencyLegacy also looks up the records of the layout before hot buckets (time
	// buckets TTL wide): on for 2 TTL after an upgrade.
	IdempotencyLegacy bool
	// LeaseTTL is how long a concurrency slot is held when no outcome releases it (1m).
	LeaseTTL time.Duration
	// QuotaRetention is how long a quota counter outlives its period (35 days), so that
	// reconcile can still correct it before the period is closed.
	QuotaRetention time.Duration
	// MaxBatch is the most decisions of one shard sent in one script call (16). Decisions
	// are grouped only when they arrive while earlier calls are in flight, so a lone
	// decision is never delayed.
	MaxBatch int
	// Pipeline is the most script calls in flight per shard (DefaultPipeline).
	Pipeline int
	// CallTimeout bounds one script call (5s); the Redis client's own timeouts apply too.
	CallTimeout time.Duration
	// WaitReplicas, when above 0, makes every script call that writes the outbox (a
	// decision, a void, an outcome) wait until that many replicas acknowledged its writes,
	// at most WaitTimeout (100ms), before its result is used; short of it the call fails
	// with ErrNotReplicated. With Sentinel or a Cluster with replicas, 1 keeps a failover
	// from losing an event whose caller was told 200 (docs/deploy.md).
	WaitReplicas int
	WaitTimeout  time.Duration
	// Clock picks the period bounds passed to the script (nil: the system clock). It does
	// not decide: Redis TIME does, and a clock too far off is corrected from it.
	Clock period.Clock
	// Registerer receives the script's metrics (none when nil).
	Registerer prometheus.Registerer
}

// skew is how far behind Redis an admit node's clock may be without a second script call
// at a period boundary: the bounds passed start this long before the node's now.
const skew = 5 * time.Minute

// Admitter takes decisions in Redis with the admission script.
type Admitter struct {
	// idemHot, idemTTL, idemLegacy, markTTL and leaseTTL are the options' durations as the
	// scripts take them (ms): the hot window, the idempotency TTL, the width of the
	// previous layout's buckets ("" when not looked up), how long a void mark lives, the
	// lease TTL.
	idemHot, idemTTL, idemLegacy, markTTL, leaseTTL string
	filterBits                                      uint64
	rdb                                             redis.UniversalClient
	opts                                            Options
	keys                                            keyspace.Keys
	queues                                          []queue
	metrics                                         *scriptMetrics
	waiters                                         waiters
	derived                                         limitCache
}

// queue holds one shard's decisions waiting for a script call.
type queue struct {
	mu      sync.Mutex
	pending []*call
	running int
}

type call struct {
	req      Request
	wait     *waiting    // nil when the request may not wait
	logged   bool        // the billing log has no admission of its idempotency key
	inline   bool        // send the program inline: the mirror did not hold it
	noInline bool        // never send it (ScriptCall)
	done     chan result // buffered: delivery never blocks
	sent     atomic.Bool
}

type result struct {
	d   Decision
	err error
}

// New returns an Admitter deciding in rdb (a server or a Redis Cluster).
func New(rdb redis.UniversalClient, o Options) *Admitter {
	if o.KeyPrefix == "" {
		o.KeyPrefix = keyspace.DefaultKeyPrefix
	}
	if o.Shards <= 0 {
		o.Shards = keyspace.DefaultShards
	}
	if o.IdempotencyTTL <= 0 {
		o.IdempotencyTTL = keyspace.DefaultIdempotencyTTL
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.QuotaRetention <= 0 {
		o.QuotaRetention = keyspace.DefaultQuotaRetention
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.Pipeline <= 0 {
		o.Pipeline = DefaultPipeline
	}
	if o.WaitTimeout <= 0 {
		o.WaitTimeout = keyspace.DefaultWaitTimeout
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 5 * time.Second
	}
	a := &Admitter{
		rdb: rdb, opts: o, keys: keyspace.Keys{Prefix: o.KeyPrefix, Shards: o.Shards}.WithTags(),
		queues: make([]queue, o.Shards),
	}
	ttl := max(1, o.IdempotencyTTL.Milliseconds())
	a.idemTTL, a.idemHot = strconv.FormatInt(ttl, 10), strconv.FormatInt(ttl, 10)
	if o.IdempotencyLog != nil {
		if o.IdempotencyHot <= 0 {
			o.IdempotencyHot = keyspace.DefaultIdempotencyHot
		}
		if o.IdempotencyFilterBits == 0 {
			o.IdempotencyFilterBits = DefaultIdempotencyFilterBits
		}
		a.idemHot = strconv.FormatInt(max(1, min(o.IdempotencyHot.Milliseconds(), ttl)), 10)
		a.filterBits = o.IdempotencyFilterBits
		a.opts = o
	}
	if o.IdempotencyLegacy {
		a.idemLegacy = a.idemTTL
	}
	// A record may be found for up to 2 TTL (the hot buckets' backstop, the previous layout).
	a.markTTL = strconv.FormatInt(2*ttl, 10)
	a.leaseTTL = strconv.FormatInt(o.LeaseTTL.Milliseconds(), 10)
	a.metrics = newScriptMetrics(o.Registerer, a)
	return a
}

// Keys returns the key names the Admitter uses.
func (a *Admitter) Keys() keyspace.Keys { return a.keys }

// NewEventID returns a new event id for a request of org (see Keys.NewEventID).
func (a *Admitter) NewEventID(org string) string { return a.keys.NewEventID(org) }

// Decide takes one decision. Concurrent decisions of one shard share script calls; each
// stays atomic. An error means no decision was taken that the caller can know of (Redis
// unavailable or too slow): the request follows the Redis-down policy.
//
// A request with a MaxWait that a rate or concurrency limit refuses waits in that limit's
// queue for up to MaxWait (see wait.go): Decide returns when it is admitted, with the
// refusal of its last attempt when the wait runs out, or with ctx's error.
func (a *Admitter) Decide(ctx context.Context, r Request) (Decision, error) {
	if err := r.validate(); err != nil {
		return Decision{}, err
	}
	if r.MaxWait > 0 && !r.Shadow { // a shadow request is never refused: nothing to wait for
		return a.decideWaiting(ctx, r)
	}
	logged := false
	for {
		c := a.submit(r, nil, logged)
		var res result
		select {
		case res = <-c.done:
		case <-ctx.Done():
			return Decision{}, fmt.Errorf("decide: %w", ctx.Err())
		}
		if !errors.Is(res.err, errCheckLog) || logged {
			return res.d, res.err
		}
		d, decided, err := a.fromLog(ctx, r)
		if decided {
			return d, err
		}
		logged = true
	}
}

// fromLog answers from the billing log a request whose key no hot bucket holds and an
// idempotency filter may: with the first admission, replayed (or refused as a replay, or
// as a reuse with other units), when the log has it. decided is false when it has not, or
// when the admission it has was voided and its void is not in the log yet (its void mark
// is in Redis): the request is decided afresh.
func (a *Admitter) fromLog(ctx context.Context, r Request) (d Decision, decided bool, err error) {
	now := a.opts.Clock.Now()
	first, ok, err := a.opts.IdempotencyLog.First(ctx, r.Policy.Account(), r.IdempotencyKey, now.Add(-a.opts.IdempotencyTTL))
	a.metrics.logLookup(ok, err)
	if ok && err == nil {
		var n int64
		n, err = a.rdb.Exists(ctx, a.keys.VoidMark(a.keys.Shard(r.Policy.Org), first.EventID)).Result()
		ok = n == 0
	}
	switch {
	case err != nil:
		return Decision{}, true, fmt.Errorf("%w: %w", ErrIdempotencyUnverifiable, err)
	case !ok:
		return Decision{}, false, nil
	case fingerprint(nonZero(first.Units), first.Tool) != fingerprint(nonZero(r.Units), r.Tool):
		return Decision{}, true, ErrIdempotencyKeyReused
	case r.RefuseReplay:
		return Decision{}, true, &ReplayError{EventID: first.EventID}
	}
	return Decision{Result: Allow, EventID: first.EventID, Period: first.Period, Replayed: true, Time: now}, true, nil
}

// nonZero is units without the units of amount 0: the billing log does not tell them from
// units not sent.
func nonZero(units map[policy.Unit]int64) map[policy.Unit]int64 {
	out := make(map[policy.Unit]int64, len(units))
	for u, n := range units {
		if n != 0 {
			out[u] = n
		}
	}
	return out
}

// submit queues r's decision for its shard's next script call; logged: the billing log
// was looked up for its key and has no admission of it.
func (a *Admitter) submit(r Request, w *waiting, logged bool) *call {
	c := &call{req: r, wait: w, logged: logged, done: make(chan result, 1)}
	shard := a.keys.Shard(r.Policy.Org)
	q := &a.queues[shard]
	q.mu.Lock()
	q.pending = append(q.pending, c)
	run := q.running < a.opts.Pipeline
	if run {
		q.running++
	}
	q.mu.Unlock()
	if run {
		a.drain(shard, c)
	}
	return c
}

// ScriptCall returns the keys and arguments of the script call (lua.Admit) that would
// decide r alone, now, once the mirror holds r's program (a decision of the policy by
// this Admitter writes it). It decides nothing: it is for tools that drive the script
// without the Admitter, such as make bench's redis-benchmark baseline (EVALSHA with
// admit's own keys and arguments).
func (a *Admitter) ScriptCall(r Request) (keys []string, args []any, err error) {
	if err := r.validate(); err != nil {
		return nil, nil, err
	}
	enc := a.encode(a.keys.Shard(r.Policy.Org), []*call{{req: r, noInline: true}}, a.opts.Clock.Now())
	return enc.keys, enc.args, nil
}

// Request validation: what the HTTP layer already refuses, refused again here so that no
// caller can put a bad value into a key or the script.
func (r Request) validate() error {
	if len(r.Policy.Path) == 0 || r.Policy.Org == "" {
		return errors.New("decide: request without a resolved policy")
	}
	if strings.ContainsAny(r.EventID, " ") || r.EventID == "" {
		return errors.New("decide: request without a valid event id")
	}
	if strings.ContainsAny(r.IdempotencyKey, " \t\r\n") {
		return errors.New("decide: idempotency key with white space")
	}
	for u, v := range r.Units {
		if !u.Valid() || v < 0 || v > policy.MaxAmount {
			return fmt.Errorf("decide: bad units %s=%d", u, v)
		}
	}
	return nil
}
