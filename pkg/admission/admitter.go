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

	"github.com/metergate/metergate/pkg/period"
	"github.com/metergate/metergate/pkg/policy"
)

// A deployment's defaults, shared by admit's and reconcile's configuration: they must
// agree on the keys.
const (
	// DefaultKeyPrefix starts every Redis key of a deployment.
	DefaultKeyPrefix = "mg"
	// DefaultShards is the number of hash-tag shards.
	DefaultShards = 16
	// DefaultIdempotencyTTL is the idempotency window W: a retry within W of the first
	// request is charged once (between W and 2W it may or may not be).
	DefaultIdempotencyTTL = 24 * time.Hour
	// MinIdempotencyTTL is the shortest idempotency window a deployment may configure.
	MinIdempotencyTTL = time.Minute
	// DefaultLeaseTTL is how long a concurrency slot is held when no outcome releases it.
	DefaultLeaseTTL = time.Minute
	// DefaultQuotaRetention is how long a quota counter outlives its period, so that
	// reconcile can still correct it before the period is closed.
	DefaultQuotaRetention = 35 * 24 * time.Hour
	// DefaultPipeline is the most script calls in flight per shard. Two form larger
	// batches under load than four: measured with make bench (docs/bench.md), 8 decisions
	// per call against 5, about a fifth less Redis CPU per decision and a fifth more
	// decisions per second, for a longer p99 close to saturation.
	DefaultPipeline = 2
)

// Options configure an Admitter. Zero values take the defaults named.
type Options struct {
	// KeyPrefix starts every Redis key ("mg").
	KeyPrefix string
	// Shards is the number of hash-tag shards (16); fixed for the life of a deployment.
	Shards int
	// IdempotencyTTL is the idempotency window W (24h): records are kept in time-bucket
	// hashes W wide, looked up in the current and the previous one, so a retry within W is
	// charged once and one between W and 2W may or may not be (docs/admission.md).
	IdempotencyTTL time.Duration
	// IdempotencyLegacy also looks up, after the buckets, the record of a key kept in the
	// one-key-per-record layout of earlier versions: on for the 24 h after an upgrade.
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
	// idemW, markTTL and leaseTTL are the options' durations as the scripts take them
	// (ms): the idempotency window, how long a void mark lives, the lease TTL.
	idemW, markTTL, leaseTTL string
	rdb                      redis.UniversalClient
	opts                     Options
	keys                     Keys
	queues                   []queue
	metrics                  *scriptMetrics
	waiters                  waiters
}

// queue holds one shard's decisions waiting for a script call.
type queue struct {
	mu      sync.Mutex
	pending []*call
	running int
}

type call struct {
	req  Request
	wait *waiting    // nil when the request may not wait
	done chan result // buffered: delivery never blocks
	sent atomic.Bool
}

type result struct {
	d   Decision
	err error
}

// New returns an Admitter deciding in rdb (a server or a Redis Cluster).
func New(rdb redis.UniversalClient, o Options) *Admitter {
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	if o.Shards <= 0 {
		o.Shards = DefaultShards
	}
	if o.IdempotencyTTL <= 0 {
		o.IdempotencyTTL = DefaultIdempotencyTTL
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.QuotaRetention <= 0 {
		o.QuotaRetention = DefaultQuotaRetention
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 16
	}
	if o.Pipeline <= 0 {
		o.Pipeline = DefaultPipeline
	}
	if o.WaitTimeout <= 0 {
		o.WaitTimeout = 100 * time.Millisecond
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 5 * time.Second
	}
	a := &Admitter{
		rdb: rdb, opts: o, keys: Keys{Prefix: o.KeyPrefix, Shards: o.Shards}.withTags(),
		queues: make([]queue, o.Shards),
	}
	a.idemW = strconv.FormatInt(max(1, o.IdempotencyTTL.Milliseconds()), 10)
	mark := 2 * o.IdempotencyTTL // a record may be found for up to 2W
	if o.IdempotencyLegacy {
		mark = max(mark, legacyIdempotencyTTL)
	}
	a.markTTL = strconv.FormatInt(mark.Milliseconds(), 10)
	a.leaseTTL = strconv.FormatInt(o.LeaseTTL.Milliseconds(), 10)
	a.metrics = newScriptMetrics(o.Registerer, a)
	return a
}

// Keys returns the key names the Admitter uses.
func (a *Admitter) Keys() Keys { return a.keys }

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
	c := a.submit(r, nil)
	select {
	case res := <-c.done:
		return res.d, res.err
	case <-ctx.Done():
		return Decision{}, fmt.Errorf("decide: %w", ctx.Err())
	}
}

// submit queues r's decision for its shard's next script call.
func (a *Admitter) submit(r Request, w *waiting) *call {
	c := &call{req: r, wait: w, done: make(chan result, 1)}
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
// decide r alone, now. It decides nothing: it is for tools that drive the script without
// the Admitter, such as make bench's redis-benchmark baseline (EVALSHA with admit's own
// keys and arguments).
func (a *Admitter) ScriptCall(r Request) (keys []string, args []any, err error) {
	if err := r.validate(); err != nil {
		return nil, nil, err
	}
	enc := a.encode(a.keys.Shard(r.Policy.Org), []*call{{req: r}}, a.opts.Clock.Now())
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
