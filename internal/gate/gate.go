// Package gate takes admit's decisions for every front door: POST /v1/admit, the
// forward-auth check of nginx, Traefik and Caddy, and Envoy's rate-limit service. Each door
// decodes its input into an Input and renders the Answer; the rules of what a door may pass
// on (credentials, replays, fail-open, voids of answers nobody was told) live here once.
package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/pkg/event"
)

// Policies answers who a caller is and what its limits are (policy.Cache).
type Policies interface {
	Resolve(account string) (policy.Resolved, error)
	Authenticate(secret string) (policy.APIKey, policy.Resolved, error)
}

// Decider takes decisions in Redis (admission.Admitter).
type Decider interface {
	NewEventID(org string) string
	Decide(ctx context.Context, r admission.Request) (admission.Decision, error)
	// Void voids a request whose decision its caller was not told (admission.Admitter.Void).
	Void(ctx context.Context, v admission.Void) (bool, error)
}

// Recorder writes an event straight to Kafka, synchronously: the record of an admission
// decided without Redis, and the last resort of a void.
type Recorder interface {
	Record(ctx context.Context, key string, ev event.CloudEvent) error
}

// FailPolicy says what happens to a kind of account while Redis is unavailable.
type FailPolicy string

// Fail policies.
const (
	FailOpen   FailPolicy = "open"
	FailClosed FailPolicy = "closed"
)

// The fail policies while Redis is unavailable unless configured otherwise: rate-only
// accounts are admitted, quota-bearing accounts refused.
const (
	DefaultRedisDownRateOnly = FailOpen
	DefaultRedisDownQuota    = FailClosed
)

// Config assembles a Gate.
type Config struct {
	Log      *slog.Logger
	Policies Policies
	Decider  Decider
	Recorder Recorder // for fail-open admissions and voids; nil means fail closed for everyone
	Source   string   // this node's name, the CloudEvents source
	// While Redis is unavailable: rate-only accounts (default open) and quota-bearing
	// accounts (default closed).
	RedisDownRateOnly FailPolicy
	RedisDownQuota    FailPolicy
	// RedisDownRetryAfter is the retry time of a 503 while Redis is unavailable (1 s when 0).
	RedisDownRetryAfter time.Duration
	// Clock gives the period of a fail-open decision and a void (nil: the system clock).
	Clock period.Clock
	// Shadow puts every request in shadow mode (ADMIT_SHADOW).
	Shadow     bool
	Registerer prometheus.Registerer
	// Refusals is told every refusal by a limit (refusals.Log); nil: none is recorded.
	Refusals Refusals
}

// Refusals takes the refusals by a limit, for the console's "Why?" and account pages.
// Refused is called on the decision path, before the caller is answered: it must neither
// block nor take long (refusals.Log queues it, or drops and counts it).
type Refusals interface {
	Refused(Refusal)
}

// Refusal is a request refused by a limit (429 or 402), as the refusal log keeps it. It is
// not told of shadow-mode admissions, of requests refused before a decision (*Error), nor
// of 503s.
type Refusal struct {
	// Time is the decision's (Redis time).
	Time time.Time
	// Org and Account: the account charged and its org.
	Org, Account string
	// APIKeyID is the API key's id; empty when the caller named the account.
	APIKeyID string
	// IdempotencyKey is the request's; it may be empty.
	IdempotencyKey string
	// Status is the HTTP status answered: 429 or 402 (Status).
	Status int
	// Result is rate_limited, quota_exceeded or insufficient_balance.
	Result admission.Result
	// Blocked is the limit that refused: its account, level and unit.
	Blocked admission.Blocker
	// RetryAfter is a rate limit's retry time (negative: never, the request is larger than
	// the limit); 0 for the others.
	RetryAfter time.Duration
	// Period is, for quota_exceeded, the spent quota's period.
	Period string
	// Via is the door the request came through (Input.Via).
	Via string
	// Tool and Units are what the request asked for. Units is the caller's map: read it,
	// never change it.
	Tool  string
	Units map[policy.Unit]int64
}

// Status is the HTTP status of a refusal's result: 429 for rate_limited, 402 for the others
// (quota_exceeded, insufficient_balance).
func Status(r admission.Result) int {
	if r == admission.RateLimited {
		return http.StatusTooManyRequests
	}
	return http.StatusPaymentRequired
}

// Door is the kind of front door a request came through: it decides what a replayed
// idempotency key gets.
type Door int

const (
	// Service is a calling service's door (POST /v1/admit): the service holds the service
	// token and serves the request itself, so a replay is answered with the first decision
	// (Answer.Decision.Replayed) and the service must not serve it twice.
	Service Door = iota
	// Gateway is a gateway's door (forward-auth, Envoy's rate-limit service): whatever is
	// allowed is served, so a replay is refused (409 idempotency_key_replayed), never passed.
	Gateway
)

// String is the door's name: "service" or "gateway".
func (d Door) String() string {
	if d == Gateway {
		return "gateway"
	}
	return "service"
}

// Input is a decoded, validated request for a decision.
type Input struct {
	// APIKey (the end customer's secret) or Account names who is charged.
	APIKey, Account string
	IdempotencyKey  string
	Units           map[policy.Unit]int64
	Tool            string
	// MaxWait lets a refused request wait for capacity (0: not at all).
	MaxWait time.Duration
	Door    Door
	// Via names the door in the refusal log: "admit", "check", "rls" (empty: Door's name,
	// "service" or "gateway").
	Via string
}

// Answer is a decision taken: an admission (Decision.Result Allow) or a refusal by a limit
// (429, 402). Refusals before a decision are *Error.
type Answer struct {
	Decision admission.Decision
	Policy   policy.Resolved
	// FailOpen: admitted without Redis, recorded straight to Kafka.
	FailOpen bool
	// Waited is how long a request that may wait was held (Input.MaxWait > 0).
	Waited time.Duration
}

// Error is a request refused before or instead of a decision: Status is its HTTP status
// (doors that speak another protocol map it), Code the JSON error code.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// RetryAfter is set on a 503 that may be retried.
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// ErrCallerGone is returned when the caller went away before the answer: the decision, if
// one was taken, is voided, and nobody is to be answered.
var ErrCallerGone = errors.New("the caller went away before the answer: the decision was voided")

// Gate takes decisions.
type Gate struct {
	cfg     Config
	metrics *metrics
	voids   voids
}

// New returns a Gate; Close it after the doors have stopped.
func New(cfg Config) *Gate {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.RedisDownRateOnly == "" {
		cfg.RedisDownRateOnly = DefaultRedisDownRateOnly
	}
	if cfg.RedisDownQuota == "" {
		cfg.RedisDownQuota = DefaultRedisDownQuota
	}
	if cfg.RedisDownRetryAfter <= 0 {
		cfg.RedisDownRetryAfter = time.Second
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	return &Gate{cfg: cfg, metrics: newMetrics(cfg.Registerer), voids: voids{stop: make(chan struct{})}}
}

// Rejected counts a request a door refused before it reached the gate (bad input), by code.
func (g *Gate) Rejected(code string) { g.metrics.rejected(code) }

// Admit authenticates in, decides it in Redis and returns the answer. Its errors are an
// *Error (credentials, a reused or replayed idempotency key, Redis unavailable) or
// ErrCallerGone.
func (g *Gate) Admit(ctx context.Context, in Input) (Answer, error) {
	start := time.Now()
	pol, keyID, e := g.authenticate(in)
	if e != nil {
		g.metrics.rejected(e.Code)
		return Answer{}, e
	}
	req := admission.Request{
		EventID:        g.cfg.Decider.NewEventID(pol.Org),
		IdempotencyKey: in.IdempotencyKey,
		Units:          in.Units,
		Policy:         pol,
		APIKeyID:       keyID,
		Tool:           in.Tool,
		Source:         g.cfg.Source,
		MaxWait:        in.MaxWait,
		Shadow:         g.cfg.Shadow || pol.Shadow,
		RefuseReplay:   in.Door == Gateway,
	}
	d, err := g.cfg.Decider.Decide(ctx, req)
	if ctx.Err() != nil {
		// The caller hung up: nobody will be told, so nothing may be billed. Not a Redis
		// outage, whatever Decide returned. A waiting request that left its queue was not
		// charged, but its last script call may have admitted it as the caller went: it is
		// voided all the same (a void of nothing bills nothing).
		return Answer{}, g.callerGone(req, d, err)
	}
	var replay *admission.ReplayError
	switch {
	case errors.Is(err, admission.ErrIdempotencyKeyReused):
		g.metrics.rejected("idempotency_key_reused")
		return Answer{}, &Error{Status: http.StatusUnprocessableEntity, Code: "idempotency_key_reused",
			Message: "this idempotency key was used with different units or another tool"}
	case errors.As(err, &replay):
		g.metrics.rejected("idempotency_key_replayed")
		return Answer{}, &Error{Status: http.StatusConflict, Code: "idempotency_key_replayed",
			Message: "a request with this idempotency key was admitted and served already; a gateway does not serve it twice"}
	case errors.Is(err, admission.ErrIdempotencyKeyExhausted):
		g.metrics.rejected("idempotency_key_exhausted")
		return Answer{}, &Error{Status: http.StatusConflict, Code: "idempotency_key_exhausted",
			Message: fmt.Sprintf("this idempotency key's decision was answered %d times already; send a new key", admission.MaxAttempts)}
	case errors.Is(err, admission.ErrIdempotencyUnverifiable):
		// Nothing was charged: the key may be older than Redis' hot window, and the billing
		// log could not say. Never fail open: that would charge a retry twice.
		g.metrics.rejected("idempotency_unverifiable")
		return Answer{}, &Error{Status: http.StatusServiceUnavailable, Code: "idempotency_unverifiable",
			Message:    "this idempotency key may have been used before and the billing log cannot be read right now; retry later",
			RetryAfter: time.Second}
	case err != nil:
		return g.redisDown(ctx, req, err)
	}
	a := Answer{Decision: d, Policy: pol}
	if in.MaxWait > 0 {
		a.Waited = time.Since(start)
	}
	g.metrics.decided(d, time.Since(start), in.MaxWait > 0)
	if d.Result != admission.Allow && g.cfg.Refusals != nil {
		g.cfg.Refusals.Refused(g.refusal(in, req, d))
	}
	return a, nil
}

// refusal is what the refusal log keeps of a request d refused.
func (g *Gate) refusal(in Input, req admission.Request, d admission.Decision) Refusal {
	r := Refusal{Time: d.Time, Org: req.Policy.Org, Account: req.Policy.Account(), APIKeyID: req.APIKeyID,
		IdempotencyKey: req.IdempotencyKey, Status: Status(d.Result), Result: d.Result, RetryAfter: d.RetryAfter,
		Via: in.Via, Tool: req.Tool, Units: req.Units}
	if r.Time.IsZero() {
		r.Time = g.cfg.Clock.Now()
	}
	if d.Blocked != nil {
		r.Blocked = *d.Blocked
	}
	if d.Result == admission.QuotaExceeded {
		r.Period = d.Period
	}
	if r.Via == "" {
		r.Via = in.Door.String()
	}
	return r
}

// authenticate resolves the policy of in's API key or account.
func (g *Gate) authenticate(in Input) (policy.Resolved, string, *Error) {
	if in.APIKey == "" {
		pol, err := g.cfg.Policies.Resolve(in.Account)
		if err != nil {
			return pol, "", &Error{Status: http.StatusUnauthorized, Code: "unknown_account", Message: fmt.Sprintf("account %q does not exist", in.Account)}
		}
		return pol, "", nil
	}
	key, pol, err := g.cfg.Policies.Authenticate(in.APIKey)
	switch {
	case errors.Is(err, policy.ErrRevoked):
		return pol, "", &Error{Status: http.StatusForbidden, Code: "revoked_api_key", Message: "the API key was revoked"}
	case err != nil:
		return pol, "", &Error{Status: http.StatusUnauthorized, Code: "unknown_api_key", Message: "the API key is not known"}
	}
	return pol, key.ID, nil
}

// redisDown answers a decision Redis could not take: rate-only accounts fail open (their
// event goes straight to Kafka, synchronously; if that fails too, deny), quota-bearing
// accounts fail closed; both as configured.
func (g *Gate) redisDown(ctx context.Context, req admission.Request, cause error) (Answer, error) {
	pol := req.Policy
	policyFor := g.cfg.RedisDownRateOnly
	if pol.HasQuota() {
		policyFor = g.cfg.RedisDownQuota
	}
	if pol.HasCredits() {
		policyFor = FailClosed // a balance is never drawn without Redis: no overdraft
	}
	log := g.cfg.Log.With("org", pol.Org, "account", pol.Account(), "err", cause)
	if policyFor == FailOpen && g.cfg.Recorder != nil {
		now := g.cfg.Clock.Now().UTC()
		data := req.Admitted(period.MonthLabel(now))
		data.FailOpen = true
		ev, err := event.New(req.EventID, g.cfg.Source, event.TypeAdmitted, event.Subject(data.Path), now, data)
		if err == nil {
			err = g.cfg.Recorder.Record(ctx, pol.Org, ev)
		}
		if ctx.Err() != nil { // nobody is told: void what may be billed
			charged, callErr := admission.Decision{}, cause
			if err == nil { // the fail-open event is in Kafka, whatever Redis did
				charged, callErr = admission.Decision{Result: admission.Allow}, nil
			}
			return Answer{}, g.callerGone(req, charged, callErr)
		}
		if err == nil {
			log.Warn("redis unavailable: admitted fail-open, event written to kafka", "event_id", req.EventID)
			g.metrics.failOpen.Inc()
			return Answer{Policy: pol, FailOpen: true,
				Decision: admission.Decision{Result: admission.Allow, EventID: req.EventID, Period: data.Period, Time: now}}, nil
		}
		log.Error("redis unavailable and the fail-open event could not be recorded: denying", "record_err", err)
	} else {
		log.Warn("redis unavailable: failing closed")
	}
	g.metrics.failClosed.Inc()
	// The script call may have run (it timed out after it was sent) or may still run (queued
	// behind a stall): void it. A retry with the same idempotency key that is answered with
	// its decision before the void lands makes it bill again (void.lua): that caller was
	// told 200. A call that never reached Redis decided nothing.
	if mayHaveCharged(admission.Decision{}, cause) {
		g.void(req, event.VoidUnavailable)
	}
	return Answer{}, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
		Message: "the decision cannot be taken right now; retry later", RetryAfter: g.cfg.RedisDownRetryAfter}
}

// callerGone handles a request whose caller hung up while it was decided: it is counted as
// abandoned (not as a Redis outage) and voided unless nothing was charged.
func (g *Gate) callerGone(req admission.Request, d admission.Decision, err error) error {
	g.metrics.abandoned.Inc()
	if mayHaveCharged(d, err) {
		g.void(req, event.VoidCallerGone)
	}
	return ErrCallerGone
}

// mayHaveCharged reports whether Decide's answer leaves a charge possible: an admission, or
// an error after the script call was sent (a denial, a refused idempotency key and a call
// that never reached Redis charged nothing).
func mayHaveCharged(d admission.Decision, err error) bool {
	var replay *admission.ReplayError
	if err != nil {
		return !errors.Is(err, admission.ErrIdempotencyKeyReused) && !errors.Is(err, admission.ErrNotSent) &&
			!errors.Is(err, admission.ErrIdempotencyKeyExhausted) && !errors.As(err, &replay)
	}
	return d.Result == admission.Allow
}

// Redacted is a with every account id but the caller's own replaced by its kind ("org",
// "team", …): what an end client behind a gateway may see of the account tree.
func (a Answer) Redacted() Answer {
	own := a.Policy.Account()
	name := func(account string) string {
		if account == own || account == "" {
			return account
		}
		for _, lv := range a.Policy.Path {
			if lv.Account == account {
				return string(lv.Kind)
			}
		}
		return "account"
	}
	blocker := func(b *admission.Blocker) *admission.Blocker {
		if b == nil {
			return nil
		}
		c := *b
		c.Account = name(c.Account)
		return &c
	}
	d := a.Decision
	d.Blocked = blocker(d.Blocked)
	if d.Shadow != nil {
		sh := *d.Shadow
		sh.Blocked = blocker(sh.Blocked)
		d.Shadow = &sh
	}
	d.Limits = append([]admission.LimitState(nil), d.Limits...)
	for i := range d.Limits {
		d.Limits[i].Account = name(d.Limits[i].Account)
	}
	d.Balances = append([]admission.Balance(nil), d.Balances...)
	for i := range d.Balances {
		d.Balances[i].Account = name(d.Balances[i].Account)
	}
	a.Decision = d
	path := make([]policy.Level, len(a.Policy.Path))
	for i, lv := range a.Policy.Path {
		path[i] = policy.Level{Account: name(lv.Account), Kind: lv.Kind}
	}
	a.Policy = policy.Resolved{Org: name(a.Policy.Org), Plan: a.Policy.Plan, Path: path}
	return a
}
