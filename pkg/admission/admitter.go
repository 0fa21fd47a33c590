package admission

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/lua"
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

// drain sends the shard's waiting decisions in batches until none waits. Once own is
// decided, the rest is left to a new goroutine, so that a caller's latency is its own
// batch's, not the whole backlog's.
func (a *Admitter) drain(shard int, own *call) {
	q := &a.queues[shard]
	for {
		q.mu.Lock()
		if len(q.pending) == 0 {
			q.running--
			q.mu.Unlock()
			return
		}
		if own != nil && own.sent.Load() {
			q.mu.Unlock()
			go a.drain(shard, nil)
			return
		}
		n := min(len(q.pending), a.opts.MaxBatch)
		batch := make([]*call, n)
		copy(batch, q.pending)
		q.pending = append(q.pending[:0], q.pending[n:]...)
		q.mu.Unlock()
		a.run(shard, batch)
	}
}

func deliver(c *call, d Decision, err error) {
	c.sent.Store(true)
	c.done <- result{d, err}
}

// run takes a batch of one shard's decisions in one script call.
func (a *Admitter) run(shard int, batch []*call) {
	ctx, cancel := context.WithTimeout(context.Background(), a.opts.CallTimeout)
	defer cancel()
	now := a.opts.Clock.Now()
	for attempt := 0; ; attempt++ {
		enc := a.encode(shard, batch, now)
		start := time.Now()
		raw, err := a.runScript(ctx, lua.Admit, enc.keys, enc.args...).Slice()
		a.metrics.observe(len(batch), time.Since(start))
		if err != nil {
			if notSent(err) {
				err = fmt.Errorf("%w: %w", ErrNotSent, err)
			}
			for _, c := range batch {
				deliver(c, Decision{}, fmt.Errorf("admission script: %w", err))
			}
			return
		}
		ok, redisNow, err := replyHeader(raw)
		if err == nil && !ok && attempt == 0 {
			now = redisNow // this node's clock is off: take the bounds from Redis TIME
			continue
		}
		if err == nil && !ok {
			err = fmt.Errorf("redis time %s outside the period bounds given twice", redisNow)
		}
		if err == nil && len(raw) != replyHeaderLen+len(batch) {
			err = fmt.Errorf("admission script: %d replies for %d decisions", len(raw)-replyHeaderLen, len(batch))
		}
		for i, c := range batch {
			if err != nil {
				deliver(c, Decision{}, err)
				continue
			}
			d, derr := enc.plans[i].decision(raw[replyHeaderLen+i], redisNow)
			deliver(c, d, derr)
		}
		return
	}
}

// notSent reports an error that leaves the command unsent: a refused or failed dial, no
// free connection in the pool, a closed client.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed)
}

// The admission script's reply (lua/admit.lua, "-- layout: reply"): {status, sec, usec},
// then when decided one {code, a, b, replayed, state...} per decision.
const (
	statusClockOff = 0 // CLOCK_OFF: Redis TIME is outside the bounds given
	statusDecided  = 1 // DECIDED

	codeAllowed           = 1 // ALLOWED: a = event id, b = period charged
	codeRateLimited       = 2 // RATE_LIMITED: a = blocking limit (buckets, windows, concurrency), b = retry after (ms)
	codeOverQuota         = 3 // OVER_QUOTA: a = blocking quota, b = its period
	codeIdempotencyReused = 4 // IDEMPOTENCY_REUSED
	codeInsufficient      = 5 // INSUFFICIENT_BALANCE: a = the credit record, b = its balance
	codeReplayRefused     = 6 // REPLAY_REFUSED: a = the first decision's event id
	codeExhausted         = 7 // IDEMPOTENCY_EXHAUSTED

	replyHeaderLen    = 3 // status, sec, usec
	decisionHeaderLen = 6 // code, a, b, replayed, queued, shadowed; the limits' state follows
)

// replyCodes names the reply codes as the script does (TestScriptLayout).
var replyCodes = map[string]int64{
	"CLOCK_OFF": statusClockOff, "DECIDED": statusDecided,
	"ALLOWED": codeAllowed, "RATE_LIMITED": codeRateLimited, "OVER_QUOTA": codeOverQuota,
	"IDEMPOTENCY_REUSED": codeIdempotencyReused, "INSUFFICIENT_BALANCE": codeInsufficient,
	"REPLAY_REFUSED": codeReplayRefused, "IDEMPOTENCY_EXHAUSTED": codeExhausted,
}

func replyHeader(raw []any) (ok bool, now time.Time, err error) {
	if len(raw) < replyHeaderLen {
		return false, time.Time{}, fmt.Errorf("admission script: short reply %v", raw)
	}
	status, _ := raw[0].(int64)
	sec, _ := raw[1].(int64)
	usec, _ := raw[2].(int64)
	return status == statusDecided, time.Unix(sec, usec*1000).UTC(), nil
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

// encoded is one script call: its keys and arguments, and how to read each decision's
// reply.
type encoded struct {
	keys  []string
	args  []any
	plans []*plan
}

// plan is what one decision checks, in the order the script reports it.
type plan struct {
	req Request
	// rates are the token buckets (the first buckets of them), then the sliding windows.
	rates   []check
	buckets int
	order   []int // the place of each bucket's state in Decision.Limits
	quotas  []check
	concs   []policy.Level
	credits []creditCheck
	alerts  []alertRecord
}

// alertRecord is one alert rule's thresholds a decision may fire: the script's alert record.
type alertRecord struct {
	*alertArgs
	ref  int   // i > 0: the decision's quota i; i < 0: its credit record -i
	next int64 // the script looks at the thresholds when the counter reaches it, or the balance falls below it
}

type creditCheck struct {
	*creditArgs
	amount int64
}

// creditArgs is one unit's credit balance at one level: the keys of its grants.
type creditArgs struct {
	level        policy.Level
	unit         policy.Unit
	grants, term string
	label        string // "<account>:<unit>"
}

type check struct {
	*limitArgs // the level, unit and limit, with their keys and constant arguments
	amount     int64
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// The admission script's arguments (lua/admit.lua): a call header, then per decision a
// header and one record per token bucket, sliding window, quota and concurrency limit.
// Each block's constants are its fields' positions; the names beside them are the
// script's locals for the fields, and TestScriptLayout requires the script to read the
// same names in the same order ("-- layout: call", "decision", "bucket", "window",
// "quota", "conc").
const (
	argDecisions = iota
	argLo
	argHi
	argMonthNext
	argMonthLabel
	argMonthNextLabel
	argMonthExpiry
	argMonthNextExpiry
	argDayNext
	argDayLabel
	argDayNextLabel
	argDayExpiry
	argDayNextExpiry
	argTag
	argLeaseTTL
	argIdemW
	argQueueChannel
	callLen
)

const (
	decEventID = iota
	decIdem
	decLegacy
	decLegacyFP
	decFingerprint
	decIDTail
	decBuckets
	decWindows
	decQuotas
	decConcs
	decEvent
	decPriority
	decTiers
	decWait
	decCredits
	decAlerts
	decShadow // "1": shadow mode (Request.Shadow)
	decReplay // "1": a replay is answered; "0": refused (Request.RefuseReplay)
	decisionLen
)

const (
	bucketField = iota
	bucketInc   // amount × emission interval, µs
	bucketWin   // burst × emission interval, µs
	bucketLen
)

const (
	tierUp           = iota // 0 the chain's last, 1 the level above follows, 2 and reserves for this one
	tierCeilingField        // "" when the level has no ceiling
	tierCeilingInc
	tierCeilingWin
	tierBorrow // "<account>:<unit>=<amount>"
	tierLen
)

const (
	waitMS     = iota // ms the request may still wait
	waitTicket        // the request's ticket
	waitMember        // its member in the queue tq, "" when in none
	waitQueue
	waitLen
)

const (
	creditGrants = iota // Keys.Grants
	creditTerms         // Keys.GrantTerms
	creditAmount
	creditLabel // "<account>:<unit>"
	creditLen
)

const (
	alertRef   = iota // i > 0: the decision's quota record i; i < 0: its credit record -i
	alertNext         // units: a quota counter reaching it, a balance falling below it
	alertList         // the thresholds: "<units>:<spec>,…" ascending (spec: policy.Alert.Spec)
	alertLabel        // "<account>:<unit>"
	alertLen
)

const (
	windowKey = iota
	windowAmount
	windowWidth // ms
	windowLimit
	windowLen
)

const (
	quotaPrefix = iota
	quotaAmount
	quotaCap
	quotaKind
	quotaLen
)

const (
	concKey = iota
	concCap
	concLen
)

// argNames are the script's names of each block's fields, by position.
var argNames = map[string][]string{
	"call": (&[callLen]string{
		argDecisions: "decisions", argLo: "lo", argHi: "hi", argMonthNext: "m_next",
		argMonthLabel: "m_label", argMonthNextLabel: "m_next_label",
		argMonthExpiry: "m_expiry", argMonthNextExpiry: "m_next_expiry",
		argDayNext: "d_next", argDayLabel: "d_label", argDayNextLabel: "d_next_label",
		argDayExpiry: "d_expiry", argDayNextExpiry: "d_next_expiry", argTag: "tag",
		argLeaseTTL: "lease_ttl", argIdemW: "idem_w", argQueueChannel: "qchan",
	})[:],
	"decision": (&[decisionLen]string{
		decEventID: "event_id", decIdem: "idem", decLegacy: "legacy", decLegacyFP: "legacy_fp",
		decFingerprint: "fingerprint", decIDTail: "id_tail", decBuckets: "n_bucket", decWindows: "n_window", decQuotas: "n_quota", decConcs: "n_conc", decEvent: "ev",
		decPriority: "prio", decTiers: "n_tier", decWait: "n_wait", decCredits: "n_credit", decAlerts: "n_alert", decShadow: "shadow", decReplay: "replay",
	})[:],
	"credit": (&[creditLen]string{creditGrants: "gkey", creditTerms: "tkey", creditAmount: "amount", creditLabel: "label"})[:],
	"alert":  (&[alertLen]string{alertRef: "ref", alertNext: "next", alertList: "list", alertLabel: "label"})[:],
	"bucket": (&[bucketLen]string{bucketField: "field", bucketInc: "inc", bucketWin: "win"})[:],
	"tier":   (&[tierLen]string{tierUp: "up", tierCeilingField: "cfield", tierCeilingInc: "cinc", tierCeilingWin: "cwin", tierBorrow: "borrow"})[:],
	"wait":   (&[waitLen]string{waitMS: "w", waitTicket: "t", waitMember: "m", waitQueue: "q"})[:],
	"window": (&[windowLen]string{windowKey: "key", windowAmount: "amount", windowWidth: "width", windowLimit: "limit"})[:],
	"quota":  (&[quotaLen]string{quotaPrefix: "prefix", quotaAmount: "amount", quotaCap: "quota", quotaKind: "kind"})[:],
	"conc":   (&[concLen]string{concKey: "key", concCap: "cap"})[:],
}

func (a *Admitter) encode(shard int, batch []*call, now time.Time) encoded {
	ref := now.Add(-skew)
	mCur := period.MonthStart(ref)
	mNext, mEnd := mCur.AddDate(0, 1, 0), mCur.AddDate(0, 2, 0)
	dCur := period.DayStart(ref)
	dNext, dEnd := dCur.AddDate(0, 0, 1), dCur.AddDate(0, 0, 2)
	keep := a.opts.QuotaRetention
	levels := 0
	for _, c := range batch {
		levels += len(c.req.Policy.Path)
	}
	// Room for two units' buckets and quotas per level, so appends rarely grow.
	args := make([]any, 0, callLen+decisionLen*len(batch)+14*levels)
	var h [callLen]any
	h[argDecisions] = strconv.Itoa(len(batch))
	// The day's bounds lie within the month's: TIME within them is within both.
	h[argLo], h[argHi] = ms(dCur), ms(dEnd)
	h[argMonthNext] = ms(mNext)
	h[argMonthLabel], h[argMonthNextLabel] = period.MonthLabel(mCur), period.MonthLabel(mNext)
	h[argMonthExpiry], h[argMonthNextExpiry] = ms(mNext.Add(keep)), ms(mEnd.Add(keep))
	h[argDayNext] = ms(dNext)
	h[argDayLabel], h[argDayNextLabel] = period.DayLabel(dCur), period.DayLabel(dNext)
	h[argDayExpiry], h[argDayNextExpiry] = ms(dNext.Add(keep)), ms(dEnd.Add(keep))
	h[argTag], h[argLeaseTTL], h[argIdemW] = a.keys.tag(shard), a.leaseTTL, a.idemW
	h[argQueueChannel] = a.keys.QueueChannel()
	e := encoded{
		keys:  make([]string, 1, 1+len(batch)),
		args:  append(args, h[:]...),
		plans: make([]*plan, len(batch)),
	}
	e.keys[0] = a.keys.Outbox(shard)
	var per periods
	if late := now.Add(skew); period.MonthLabel(ref) == period.MonthLabel(late) {
		per.month = period.MonthLabel(late)
		if period.DayLabel(ref) == period.DayLabel(late) {
			per.day = period.DayLabel(late)
		}
	}
	for i, c := range batch {
		e.plans[i] = a.encodeOne(&e, shard, c.req, c.wait, per)
	}
	return e
}

// maxMicros bounds a bucket's inc and win (about 31 years), so that a TAT stays an exact
// integer in Lua's doubles.
const maxMicros = 1e15

// periods are the labels of the month and the day of an encoding, each "" when the script
// may charge another one (Redis TIME may be up to skew away).
type periods struct{ month, day string }

func (a *Admitter) encodeOne(e *encoded, shard int, r Request, w *waiting, per periods) *plan {
	pol := r.Policy
	lim := a.limitsOf(shard, pol)
	p := &plan{req: r, rates: make([]check, 0, len(lim.checks))}
	windows, tiered := 0, false
	for i := range lim.buckets {
		c := &lim.buckets[i]
		if amount := r.Units[c.unit]; amount != 0 {
			p.rates = append(p.rates, check{limitArgs: c, amount: amount})
			tiered = tiered || lim.tiered[c.unit]
		}
	}
	p.buckets = len(p.rates)
	p.order = make([]int, p.buckets)
	for i := range p.order {
		for _, c := range p.rates[:p.buckets] {
			if c.index < p.rates[i].index {
				p.order[i]++
			}
		}
	}
	for i := range lim.checks {
		c := &lim.checks[i]
		amount := r.Units[c.unit]
		if amount == 0 {
			continue // nothing to consume, nothing that could deny
		}
		if c.windowKey != "" {
			p.rates = append(p.rates, check{limitArgs: c, amount: amount})
			windows++
		}
		if c.quotaKey != "" {
			p.quotas = append(p.quotas, check{limitArgs: c, amount: amount})
		}
	}
	p.concs = lim.concs
	for i := range lim.credits {
		c := &lim.credits[i]
		if amount := r.Units[c.unit]; amount > 0 {
			p.credits = append(p.credits, creditCheck{creditArgs: c, amount: amount})
		}
	}
	for _, al := range lim.alerts {
		if rec, ok := al.record(p, per); ok {
			p.alerts = append(p.alerts, rec)
		}
	}

	e.keys = append(e.keys, lim.state)
	var d [decisionLen]any
	d[decEventID], d[decIdem], d[decLegacy], d[decLegacyFP], d[decFingerprint] = r.EventID, "", "", "", ""
	if r.IdempotencyKey != "" {
		fp := fingerprint(r.Units, r.Tool)
		d[decIdem], d[decFingerprint] = idempotencyField(pol.Account(), r.IdempotencyKey), shortFingerprint(fp)
		if a.opts.IdempotencyLegacy {
			d[decLegacy], d[decLegacyFP] = a.keys.idempotency(shard, pol.Account(), r.IdempotencyKey), fp
		}
	}
	d[decIDTail] = lim.idTail
	d[decBuckets], d[decWindows] = strconv.Itoa(p.buckets), strconv.Itoa(windows)
	d[decQuotas], d[decConcs] = strconv.Itoa(len(p.quotas)), strconv.Itoa(len(p.concs))
	d[decEvent] = compactEvent(r, &lim.event)
	d[decPriority], d[decTiers], d[decWait] = strconv.Itoa(pol.Priority), "0", "0"
	if tiered {
		d[decTiers] = strconv.Itoa(p.buckets)
	}
	if w != nil {
		d[decWait] = "1"
	}
	d[decCredits], d[decAlerts] = strconv.Itoa(len(p.credits)), strconv.Itoa(len(p.alerts))
	d[decShadow], d[decReplay] = "0", "1"
	if r.Shadow {
		d[decShadow] = "1"
	}
	if r.RefuseReplay {
		d[decReplay] = "0"
	}
	e.args = append(e.args, d[:]...)
	for _, c := range p.rates[:p.buckets] {
		var rec [bucketLen]any
		rec[bucketField], rec[bucketWin] = c.field, c.win
		rec[bucketInc] = micros(c.amount, c.emission)
		e.args = append(e.args, rec[:]...)
	}
	if tiered {
		for _, c := range p.rates[:p.buckets] {
			var rec [tierLen]any
			rec[tierUp], rec[tierCeilingField], rec[tierCeilingInc], rec[tierCeilingWin], rec[tierBorrow] = c.up, "", "0", "0", ""
			if c.ceilingField != "" {
				amount := strconv.FormatInt(c.amount, 10)
				rec[tierCeilingField], rec[tierCeilingWin] = c.ceilingField, c.ceilingWin
				rec[tierCeilingInc] = micros(c.amount, c.ceilingEmission)
				rec[tierBorrow] = c.level.Account + ":" + string(c.unit) + "=" + amount
			}
			e.args = append(e.args, rec[:]...)
		}
	}
	for _, c := range p.rates[p.buckets:] {
		var rec [windowLen]any
		rec[windowKey], rec[windowWidth], rec[windowLimit] = c.windowKey, c.width, c.limitN
		rec[windowAmount] = strconv.FormatInt(c.amount, 10)
		e.args = append(e.args, rec[:]...)
	}
	for _, c := range p.quotas {
		var rec [quotaLen]any
		rec[quotaPrefix], rec[quotaAmount] = c.quotaKey, strconv.FormatInt(c.amount, 10)
		rec[quotaCap], rec[quotaKind] = c.quota, c.quotaKind
		e.args = append(e.args, rec[:]...)
	}
	for i, lv := range p.concs {
		var rec [concLen]any
		rec[concKey], rec[concCap] = lim.concKeys[i], strconv.Itoa(lv.Concurrency)
		e.args = append(e.args, rec[:]...)
	}
	for _, c := range p.credits {
		var rec [creditLen]any
		rec[creditGrants], rec[creditTerms], rec[creditLabel] = c.grants, c.term, c.label
		rec[creditAmount] = strconv.FormatInt(c.amount, 10)
		e.args = append(e.args, rec[:]...)
	}
	for _, al := range p.alerts {
		var rec [alertLen]any
		rec[alertRef], rec[alertNext] = strconv.Itoa(al.ref), strconv.FormatInt(al.next, 10)
		rec[alertList], rec[alertLabel] = al.list, al.label
		e.args = append(e.args, rec[:]...)
	}
	if w != nil {
		var rec [waitLen]any
		rec[waitMS], rec[waitTicket], rec[waitMember], rec[waitQueue] = strconv.FormatInt(w.left(), 10), w.ticket, w.member, w.queue
		e.args = append(e.args, rec[:]...)
	}
	return p
}

// micros is amount × emission µs, rounded up and bounded, as the script takes a bucket's
// inc.
func micros(amount int64, emission float64) string {
	return strconv.FormatInt(int64(min(math.Ceil(float64(amount)*emission), maxMicros)), 10)
}

// limits is what the script call of a decision needs from its policy, apart from the
// amounts: each limit's keys and constant arguments, and the event's constant parts. It is
// derived once per policy and Admitter and kept in the policy's Memo.
type limits struct {
	a      *Admitter
	state  string      // the org's state hash
	idTail string      // ".<shard>.<org>", how the org's event ids end
	checks []limitArgs // by level, org first, then in policy.Units order
	// buckets are the token buckets, unit by unit (policy.Units order), each unit's from
	// the account up to the org: the chains the script walks (lua/admit.lua).
	buckets []limitArgs
	// tiered marks the units whose chain has a ceiling: their decisions send tier records.
	tiered   map[policy.Unit]bool
	concs    []policy.Level
	concKeys []string
	credits  []creditArgs // by level, org first, then in the level's order of units
	alerts   []*alertArgs // the levels' alert rules
	event    eventStatic
}

// alertArgs is one alert rule of a level with what it watches (a quota of limits.checks, or
// a balance of limits.credits) and its thresholds in units, ascending.
type alertArgs struct {
	check  *limitArgs  // the quota watched, nil for a balance
	credit *creditArgs // the balance watched, nil for a quota
	at     []int64     // the thresholds in units, ascending
	list   string      // the script's list: "<at>:<spec>,…"
	label  string
	// seen is the highest quota counter this node was told of in a period: thresholds at or
	// below it have fired (the decision that reached them had them), so decisions leave
	// them out. A new policy (any change of the policies) starts again from nothing.
	seen atomic.Pointer[seenCounter]
}

type seenCounter struct {
	period string
	used   int64
}

// record is the script's alert record of a for the decision p, if p charges what a watches
// and, for a quota, a threshold is left above the counter seen in the current period.
func (a *alertArgs) record(p *plan, per periods) (alertRecord, bool) {
	if a.check != nil {
		for i, c := range p.quotas {
			if c.limitArgs != a.check {
				continue
			}
			label := per.month
			if a.check.limit.QuotaPeriod == policy.Day {
				label = per.day
			}
			next := a.at[0]
			if s := a.seen.Load(); s != nil && label != "" && s.period == label {
				j := sort.Search(len(a.at), func(j int) bool { return a.at[j] > s.used })
				if j == len(a.at) {
					return alertRecord{}, false // every threshold fired this period
				}
				next = a.at[j]
			}
			return alertRecord{alertArgs: a, ref: i + 1, next: next}, true
		}
		return alertRecord{}, false
	}
	for i, c := range p.credits {
		if c.creditArgs == a.credit {
			// A balance goes up again (a top-up re-arms its thresholds): the script looks
			// whenever it is below the highest.
			return alertRecord{alertArgs: a, ref: -(i + 1), next: a.at[len(a.at)-1]}, true
		}
	}
	return alertRecord{}, false
}

// saw records that the quota counter a watches was used in period.
func (a *alertArgs) saw(period string, used int64) {
	for {
		old := a.seen.Load()
		if old != nil && old.period == period && old.used >= used {
			return
		}
		if a.seen.CompareAndSwap(old, &seenCounter{period: period, used: used}) {
			return
		}
	}
}

// alertsOf derives the alert rules of pol that l can watch: a quota_percent rule needs a
// quota of its unit and period at its level, a balance rule credit grants of its unit (and,
// for balance_percent, units granted). Thresholds below one unit are left out.
func (l *limits) alertsOf(pol policy.Resolved) {
	for _, lv := range pol.Path {
		for _, al := range lv.Alerts {
			arg := alertArgs{label: lv.Account + ":" + string(al.Unit)}
			var of int64 // what percentages are of
			switch al.Kind {
			case policy.QuotaPercent:
				for i := range l.checks {
					c := &l.checks[i]
					if c.level.Account == lv.Account && c.unit == al.Unit && c.limit.HasQuota() && c.limit.QuotaPeriod == al.Period {
						arg.check, of = c, *c.limit.Quota
					}
				}
			default:
				for i := range l.credits {
					c := &l.credits[i]
					if c.level.Account == lv.Account && c.unit == al.Unit {
						arg.credit, of = c, lv.Granted[al.Unit]
					}
				}
			}
			if arg.check == nil && arg.credit == nil {
				continue
			}
			var list []string
			for _, t := range al.Thresholds { // ascending (policy.AlertRule)
				at := t
				if al.Kind != policy.BalanceBelow {
					at = ceilDiv(of*t, 100)
				}
				if at > 0 && (len(arg.at) == 0 || at > arg.at[len(arg.at)-1]) {
					arg.at = append(arg.at, at)
					list = append(list, strconv.FormatInt(at, 10)+":"+al.Spec(t))
				}
			}
			if len(arg.at) > 0 {
				arg.list = strings.Join(list, ",")
				l.alerts = append(l.alerts, &arg)
			}
		}
	}
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// limitArgs is one unit's limit at one level.
type limitArgs struct {
	level policy.Level
	unit  policy.Unit
	limit policy.Limit
	// field names a token bucket in the org's state hash; emission is its emission
	// interval (µs per unit) and win its burst × emission interval (µs), as the script
	// takes it. Empty: no token bucket. The bucket is the level's spare: its limit less its
	// children's guarantees (Level.Reserved), spareRate per second up to spareBurst.
	field           string
	emission        float64
	win             string
	spareRate       float64
	spareBurst      int64
	up              string // the tier record's up (lua/admit.lua)
	index           int    // the place in limits.checks
	ceilingField    string // the ceiling's bucket, "" when the limit has none
	ceilingEmission float64
	ceilingWin      string
	// windowKey is a sliding window's sorted set, width its width (ms) and limitN its
	// limit. Empty: no sliding window.
	windowKey, width, limitN string
	// quotaKey starts the counters' keys (the period's label ends them); quota and
	// quotaKind are the script's arguments. Empty: no quota.
	quotaKey, quota, quotaKind string
}

// unitLetter shortens a unit in a bucket's field name.
var unitLetter = map[policy.Unit]string{policy.Requests: "r", policy.Tokens: "t", policy.Credits: "c", policy.CostMicros: "m"}

// limitsOf returns pol's limits in shard, derived at the first decision of the policy.
func (a *Admitter) limitsOf(shard int, pol policy.Resolved) *limits {
	if pol.Memo != nil {
		if l, ok := pol.Memo.Load().(*limits); ok && l.a == a {
			return l
		}
	}
	l := &limits{a: a, state: a.keys.state(shard, pol.Org), idTail: a.keys.eventIDTail(shard, pol.Org),
		event: newEventStatic(pol)}
	for _, lv := range pol.Path {
		for _, u := range policy.Units {
			lim, ok := lv.Limits[u]
			if !ok || (!lim.HasRate() && lim.Quota == nil) {
				continue
			}
			c := limitArgs{level: lv, unit: u, limit: lim}
			switch {
			case lim.HasRate() && lim.Algorithm == policy.SlidingWindow:
				c.windowKey = a.keys.window(shard, lv.Account, u)
				c.width, c.limitN = strconv.FormatInt(lim.WindowS*1000, 10), strconv.FormatInt(lim.Limit, 10)
			case lim.HasRate():
				a.bucketArgs(&c, lv)
			}
			c.index = len(l.checks)
			if lim.Quota != nil {
				c.quotaKey = a.keys.quota(shard, lv.Account, u, "")
				c.quota, c.quotaKind = strconv.FormatInt(*lim.Quota, 10), "m"
				if lim.QuotaPeriod == policy.Day {
					c.quotaKind = "d"
				}
			}
			l.checks = append(l.checks, c)
		}
		if lv.Concurrency > 0 {
			l.concs = append(l.concs, lv)
			l.concKeys = append(l.concKeys, a.keys.leases(shard, lv.Account))
		}
		for _, u := range lv.Credits {
			l.credits = append(l.credits, creditArgs{level: lv, unit: u, grants: a.keys.grants(shard, lv.Account, u),
				term: a.keys.grantTerms(shard, lv.Account, u), label: lv.Account + ":" + string(u)})
		}
	}
	l.buckets, l.tiered = bucketChains(pol, l.checks)
	l.alertsOf(pol)
	if pol.Memo != nil {
		pol.Memo.Store(l)
	}
	return l
}

// bucketArgs fills in c's token bucket: the spare of the level's limit (its limit less its
// children's guarantees) and the ceiling's bucket if the limit has one.
func (a *Admitter) bucketArgs(c *limitArgs, lv policy.Level) {
	lim := c.limit
	letter := unitLetter[c.unit]
	if letter == "" {
		letter = string(c.unit)
	}
	c.field = lv.Account + ":" + letter
	c.spareRate, c.spareBurst = lim.RatePerS, lim.Burst
	if r, ok := lv.Reserved[c.unit]; ok {
		c.spareRate, c.spareBurst = lim.RatePerS-r.RatePerS, lim.Burst-r.Burst
	}
	if c.spareRate <= 0 || c.spareBurst <= 0 {
		// Guarantees take all of it: nothing else passes, ever (the script's "never").
		c.spareRate, c.spareBurst = 0, 0
		c.emission, c.win = maxMicros, "0"
	} else {
		c.emission = 1e6 / c.spareRate
		c.win = strconv.FormatInt(int64(min(math.Floor(float64(c.spareBurst)*c.emission), maxMicros)), 10)
	}
	if lim.Guaranteed() {
		c.ceilingField = c.field + "^"
		c.ceilingEmission = 1e6 / lim.CeilingRate()
		c.ceilingWin = strconv.FormatInt(int64(min(math.Floor(float64(lim.Ceiling)*c.ceilingEmission), maxMicros)), 10)
	}
}

// bucketChains orders the token buckets of checks unit by unit, each unit's from the
// account up to the org, and sets each one's up: whether the next is the level above in
// the same unit's chain, and whether that level reserves this one's guarantee (it is the
// direct parent). It reports the units whose chain has a ceiling.
func bucketChains(pol policy.Resolved, checks []limitArgs) ([]limitArgs, map[policy.Unit]bool) {
	depth := make(map[string]int, len(pol.Path))
	for i, lv := range pol.Path {
		depth[lv.Account] = i
	}
	var out []limitArgs
	var tiered map[policy.Unit]bool
	for _, u := range policy.Units {
		start := len(out)
		for i := len(checks) - 1; i >= 0; i-- {
			if c := checks[i]; c.unit == u && c.field != "" {
				out = append(out, c)
			}
		}
		chain := out[start:]
		for i := range chain {
			c := &chain[i]
			c.up = "0"
			if i+1 < len(chain) {
				c.up = "1"
				if c.limit.Guaranteed() && depth[chain[i+1].level.Account] == depth[c.level.Account]-1 {
					c.up = "2"
				}
			}
			if c.ceilingField != "" {
				if tiered == nil {
					tiered = make(map[policy.Unit]bool)
				}
				tiered[u] = true
			}
		}
	}
	return out, tiered
}

// fingerprint identifies a request's units and tool, to tell a retry from a reuse of its
// idempotency key: "requests=1,tokens=2500;llm_call".
func fingerprint(units map[policy.Unit]int64, tool string) string {
	parts := make([]string, 0, len(units))
	for u, v := range units {
		parts = append(parts, string(u)+"="+strconv.FormatInt(v, 10))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",") + ";" + tool
}

// shortFingerprint is what an idempotency record keeps of a fingerprint: 72 bits of its
// SHA-256, 12 characters (a retry with other units or tool is told apart but for a chance
// of 2^-72).
func shortFingerprint(fp string) string {
	h := sha256.Sum256([]byte(fp))
	return base64.RawURLEncoding.EncodeToString(h[:9])
}

// decision reads one decision's reply.
func (p *plan) decision(raw any, now time.Time) (Decision, error) {
	d, ok := raw.([]any)
	if !ok || len(d) < decisionHeaderLen {
		return Decision{}, fmt.Errorf("admission script: bad decision reply %v", raw)
	}
	code, _ := d[0].(int64)
	out := Decision{Time: now}
	if q, _ := d[4].(string); q != "" {
		place, err := parsePlace(q)
		if err != nil {
			return Decision{}, err
		}
		out.place = place
	}
	switch code {
	case codeAllowed:
		out.Result = Allow
		out.EventID, _ = d[1].(string)
		out.Period, _ = d[2].(string)
		replayed, _ := d[3].(int64)
		out.Replayed = replayed == 1
		if sh, _ := d[5].(string); sh != "" {
			f := strings.Fields(sh)
			if len(f) != 3 {
				return Decision{}, fmt.Errorf("admission script: bad shadowed refusal %q", sh)
			}
			c, err1 := strconv.ParseInt(f[0], 10, 64)
			a, err2 := strconv.ParseInt(f[1], 10, 64)
			if err1 != nil || err2 != nil {
				return Decision{}, fmt.Errorf("admission script: bad shadowed refusal %q", sh)
			}
			var b any = f[2]
			if n, err := strconv.ParseInt(f[2], 10, 64); err == nil {
				b = n
			}
			var refusal Decision
			if err := p.refusal(&refusal, c, a, b, now); err != nil {
				return Decision{}, err
			}
			out.Shadow = &Shadow{Result: refusal.Result, Blocked: refusal.Blocked, RetryAfter: refusal.RetryAfter}
		}
	case codeIdempotencyReused:
		return Decision{}, ErrIdempotencyKeyReused
	case codeReplayRefused:
		id, _ := d[1].(string)
		return Decision{}, &ReplayError{EventID: id}
	case codeExhausted:
		return Decision{}, ErrIdempotencyKeyExhausted
	default:
		if err := p.refusal(&out, code, d[1], d[2], now); err != nil {
			return Decision{}, err
		}
	}

	state := d[decisionHeaderLen:]
	windows := len(p.rates) - p.buckets
	if len(state) != p.buckets+2*windows+len(p.quotas)+len(p.credits) {
		return Decision{}, fmt.Errorf("admission script: %d state values for %d buckets, %d windows, %d quotas and %d credits",
			len(state), p.buckets, windows, len(p.quotas), len(p.credits))
	}
	out.Limits = make([]LimitState, p.buckets, len(p.rates)+len(p.quotas))
	// The script has the buckets unit by unit from the account up; the state lists them
	// as the policy does, level by level from the org down.
	for i, c := range p.rates[:p.buckets] {
		full, _ := state[i].(int64) // µs until the bucket is full
		out.Limits[p.order[i]] = bucketState(c.limitArgs, full)
	}
	for i, c := range p.rates[p.buckets:] {
		remaining, _ := state[p.buckets+2*i].(int64)
		reset, _ := state[p.buckets+2*i+1].(int64)
		out.Limits = append(out.Limits, LimitState{Account: c.level.Account, Unit: string(c.unit), Remaining: remaining,
			Reset: time.Duration(reset) * time.Millisecond, Limit: c.limit.Limit, Window: time.Duration(c.limit.WindowS) * time.Second})
	}
	for i, c := range p.quotas {
		used, _ := state[p.buckets+2*windows+i].(int64)
		quota := *c.limit.Quota
		start, end := c.limit.QuotaPeriod.Start(now), c.limit.QuotaPeriod.End(now)
		remaining := int64(-1)
		if quota >= 0 {
			remaining = max(0, quota-used)
		}
		for _, al := range p.alerts {
			if al.ref == i+1 {
				al.saw(c.limit.QuotaPeriod.Label(now), used)
			}
		}
		out.Limits = append(out.Limits, LimitState{Account: c.level.Account, Unit: string(c.unit), Quota: true,
			Limit: quota, Window: end.Sub(start), Remaining: remaining, Reset: end.Sub(now)})
	}
	for i, c := range p.credits {
		bal, _ := state[p.buckets+2*windows+len(p.quotas)+i].(int64)
		out.Balances = append(out.Balances, Balance{Account: c.level.Account, Unit: string(c.unit), Balance: bal})
	}
	return out, nil
}

// refusal fills in out from a refusal's code and the script's a and b (see the reply's
// layout).
func (p *plan) refusal(out *Decision, code int64, a, b any, now time.Time) error {
	idx, _ := a.(int64)
	i := int(idx) - 1
	switch code {
	case codeRateLimited:
		retry, _ := b.(int64)
		out.Result, out.Period = RateLimited, period.MonthLabel(now)
		out.RetryAfter = time.Duration(retry) * time.Millisecond
		switch {
		case i >= 0 && i < len(p.rates):
			c := p.rates[i]
			out.Blocked = &Blocker{Account: c.level.Account, Level: c.level.Kind, Unit: string(c.unit)}
		case i >= len(p.rates) && i < len(p.rates)+len(p.concs):
			lv := p.concs[i-len(p.rates)]
			out.Blocked = &Blocker{Account: lv.Account, Level: lv.Kind, Unit: ConcurrentRequests}
		default:
			return fmt.Errorf("admission script: blocking limit %d of %d", idx, len(p.rates)+len(p.concs))
		}
	case codeOverQuota:
		if i < 0 || i >= len(p.quotas) {
			return fmt.Errorf("admission script: blocking quota %d of %d", idx, len(p.quotas))
		}
		c := p.quotas[i]
		out.Result = QuotaExceeded
		out.Period = c.limit.QuotaPeriod.Label(now)
		out.Blocked = &Blocker{Account: c.level.Account, Level: c.level.Kind, Unit: string(c.unit)}
	case codeInsufficient:
		if i < 0 || i >= len(p.credits) {
			return fmt.Errorf("admission script: blocking credit %d of %d", idx, len(p.credits))
		}
		c := p.credits[i]
		out.Result = InsufficientBalance
		out.Blocked = &Blocker{Account: c.level.Account, Level: c.level.Kind, Unit: string(c.unit)}
	default:
		return fmt.Errorf("admission script: unknown decision code %v", code)
	}
	return nil
}

// bucketState is a token bucket's RateLimit state from the µs until it is full (GCRA: the
// theoretical arrival time less now): the tokens owed are that time over the emission
// interval.
//
// The bucket is the level's spare (its limit less its children's guarantees), and so are
// the limit and window reported; a limit with a ceiling reports it too.
func bucketState(c *limitArgs, fullUS int64) LimitState {
	burst := c.spareBurst
	owed := float64(max(0, fullUS)) / c.emission
	// The 1e-3 absorbs the rounding up of inc to whole µs, at most 1 µs per charge.
	remaining := int64(math.Floor(float64(burst) - owed + 1e-3))
	window := c.limit.Window()
	if c.spareRate > 0 {
		window = time.Duration(float64(burst) / c.spareRate * float64(time.Second))
	}
	return LimitState{Account: c.level.Account, Unit: string(c.unit), Limit: burst,
		Window:    window,
		Remaining: min(burst, max(0, remaining)),
		Reset:     time.Duration((fullUS+999)/1000) * time.Millisecond,
		Ceiling:   c.limit.Ceiling}
}
