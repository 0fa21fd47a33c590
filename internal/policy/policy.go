// Package policy holds who may use how much: plans, the account tree (org → team → user →
// agent), per-node limit overrides and API keys, with PostgreSQL as the source of truth and
// an in-memory cache that admit decides from.
//
// Store writes and reads the tables; Cache loads all of them into memory, resolves every
// account's effective policy (Resolved) once per load, and reloads when PostgreSQL notifies
// a change (LISTEN/NOTIFY on Channel) or every reload period.
//
// # Resolution
//
// An account's Resolved holds one Level per node of its path, from its org (the root) down
// to the account itself. Admission checks every level.
//
//   - Plans. The org's plan is the one it names if that plan exists; otherwise (unknown or
//     missing) the smallest plan, the one of lowest rank, never the largest. Resolved.Plan
//     is that plan. A node below the org gets plan limits only if it names a plan itself
//     (an unknown one again meaning the smallest); otherwise it has only its own overrides:
//     the org's plan is enforced once, at the org, not again at every level. Level.Plan
//     names the plan a level's limits start from, empty when none.
//   - Limits. Per unit, a node's limit is its plan's limit overlaid by its override, field
//     group by field group: the rate part (algorithm, rate_per_s, burst, limit, window_s) is
//     replaced as a whole when the override sets any of rate_per_s, burst, limit or
//     window_s; the quota part (quota, quota_period) when the override sets a quota (-1
//     lifts the plan's quota at that node). An override cannot remove a plan's rate limit.
//     Every Limit in a Resolved is normalized.
//   - Concurrency. A node's own cap if set, else its plan's if it has a plan, else 0 (no
//     cap).
//   - Guarantees. A token bucket with a ceiling, below the org, is a guarantee: its rate
//     and burst are added to the parent's Level.Reserved for that unit (an org's ceilings
//     are dropped: it has no parent). Admission gives a guarantee's traffic the parent's
//     reserved capacity and everything else the rest (docs/admission.md).
//   - Priority. The account's own if set, else the plan's it names, else its parent's; an
//     org without one takes its plan's.
//
// Unknown plans are refused when written through the Store; they reach the cache only if
// a plan is deleted or a row is written by hand, and then clamp as above. A node whose
// ancestry cannot be resolved (possible only through hand-written rows: a cycle, a kind not
// deeper than its parent's) is left out of the cache and logged: its requests are refused
// rather than admitted with fewer limits than intended. With no plans at all, a load fails
// and the previous policies stay.
//
// Resolved values share their maps and slices with other accounts of the same snapshot
// (levels with equal plans and overrides share one limits map): they are read-only.
package policy

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/metergate/metergate/internal/period"
)

// Unit is what a limit counts.
type Unit string

// The units a request may carry.
const (
	Requests   Unit = "requests"
	Tokens     Unit = "tokens"
	Credits    Unit = "credits"     // tool-weighted cost (see ToolCredits)
	CostMicros Unit = "cost_micros" // money, in millionths of the currency unit
)

// Units lists every unit in a fixed order.
var Units = []Unit{Requests, Tokens, Credits, CostMicros}

// Valid reports whether u is a known unit.
func (u Unit) Valid() bool {
	for _, k := range Units {
		if u == k {
			return true
		}
	}
	return false
}

// Algorithm is how a rate limit is enforced.
type Algorithm string

// Rate-limit algorithms.
const (
	// TokenBucket refills RatePerS units per second up to Burst.
	TokenBucket Algorithm = "token_bucket"
	// SlidingWindow allows at most Limit units in any WindowS seconds, exactly: for small
	// limits such as "10 per 30 minutes".
	SlidingWindow Algorithm = "sliding_window"
)

// QuotaPeriod is the calendar period of a quota, in UTC.
type QuotaPeriod string

// Quota periods.
const (
	Month QuotaPeriod = "month"
	Day   QuotaPeriod = "day"
)

// Label is the label of the period of kind q containing t ("YYYY-MM" or "YYYY-MM-DD").
func (q QuotaPeriod) Label(t time.Time) string {
	if q == Day {
		return period.DayLabel(t)
	}
	return period.MonthLabel(t)
}

// Start is the first instant of the period of kind q containing t.
func (q QuotaPeriod) Start(t time.Time) time.Time {
	if q == Day {
		return period.DayStart(t)
	}
	return period.MonthStart(t)
}

// End is the first instant after the period of kind q containing t.
func (q QuotaPeriod) End(t time.Time) time.Time {
	if q == Day {
		return period.DayStart(t).AddDate(0, 0, 1)
	}
	return period.MonthStart(t).AddDate(0, 1, 0)
}

// KindOf is the kind of period a label names.
func KindOf(label string) QuotaPeriod {
	if period.IsDay(label) {
		return Day
	}
	return Month
}

// Uncapped is the quota that never runs out.
const Uncapped int64 = -1

// Limit is what one account node allows of one unit. A zero rate part means no rate limit
// at this node; a nil Quota means no quota at this node.
//
// A token bucket is written either as RatePerS and Burst, or as Limit per WindowS (meaning
// Burst = Limit and RatePerS = Limit / WindowS); Normalize turns the second form into the
// first.
type Limit struct {
	Algorithm   Algorithm   `json:"algorithm,omitempty"`
	RatePerS    float64     `json:"rate_per_s,omitempty"`
	Burst       int64       `json:"burst,omitempty"`
	Limit       int64       `json:"limit,omitempty"`
	WindowS     int64       `json:"window_s,omitempty"`
	Quota       *int64      `json:"quota,omitempty"`
	QuotaPeriod QuotaPeriod `json:"quota_period,omitempty"`
	// Ceiling, on a token bucket below the org, makes RatePerS and Burst a guarantee:
	// capacity of the parent reserved for this node, which its siblings cannot borrow.
	// Beyond its guarantee the node may borrow the parent's spare capacity up to Ceiling
	// per the same window (a second bucket of Ceiling at RatePerS × Ceiling / Burst).
	// 0: no ceiling (the limit is a cap, not a guarantee). Part of the rate group.
	Ceiling int64 `json:"ceiling,omitempty"`
}

// HasRate reports whether the limit has a rate part.
func (l Limit) HasRate() bool {
	if l.Algorithm == SlidingWindow {
		return l.Limit > 0
	}
	return l.Burst > 0
}

// Window is the time a token bucket takes to fill from empty, Burst / RatePerS (0 without
// a rate).
func (l Limit) Window() time.Duration {
	if l.RatePerS <= 0 {
		return 0
	}
	return time.Duration(float64(l.Burst) / l.RatePerS * float64(time.Second))
}

// Guaranteed reports whether the limit is a guarantee: a token bucket with a ceiling.
func (l Limit) Guaranteed() bool {
	return l.Ceiling > 0 && l.Algorithm == TokenBucket && l.Burst > 0
}

// CeilingRate is the rate of the ceiling's bucket: the guarantee's rate scaled to the
// ceiling, so that both buckets refill over the same window.
func (l Limit) CeilingRate() float64 {
	if !l.Guaranteed() {
		return 0
	}
	return l.RatePerS * float64(l.Ceiling) / float64(l.Burst)
}

// HasQuota reports whether the limit has a quota that can run out.
func (l Limit) HasQuota() bool { return l.Quota != nil && *l.Quota != Uncapped }

// Normalize fills defaults: the token-bucket algorithm, Burst and RatePerS from Limit per
// WindowS, and the monthly quota period.
func (l Limit) Normalize() Limit {
	if l.Algorithm == "" {
		l.Algorithm = TokenBucket
	}
	if l.Algorithm == TokenBucket && l.Limit > 0 && l.WindowS > 0 && l.Burst == 0 && l.RatePerS == 0 {
		l.Burst = l.Limit
		l.RatePerS = float64(l.Limit) / float64(l.WindowS)
	}
	if l.Quota != nil && l.QuotaPeriod == "" {
		l.QuotaPeriod = Month
	}
	return l
}

// Validate reports every inconsistency of a normalized limit.
func (l Limit) Validate() error {
	var errs []error
	switch l.Algorithm {
	case TokenBucket:
		if l.RatePerS < 0 || l.Burst < 0 {
			errs = append(errs, errors.New("rate_per_s and burst must not be negative"))
		}
		if (l.RatePerS > 0) != (l.Burst > 0) {
			errs = append(errs, errors.New("a token bucket needs both rate_per_s and burst (or limit and window_s)"))
		}
	case SlidingWindow:
		if l.Limit <= 0 || l.WindowS <= 0 {
			errs = append(errs, errors.New("a sliding window needs limit > 0 and window_s > 0"))
		}
		if l.WindowS > 31*24*3600 {
			errs = append(errs, errors.New("window_s must be at most 31 days"))
		}
	default:
		errs = append(errs, fmt.Errorf("unknown algorithm %q (want token_bucket or sliding_window)", l.Algorithm))
	}
	if l.Ceiling != 0 {
		switch {
		case l.Ceiling < 0:
			errs = append(errs, errors.New("ceiling must not be negative"))
		case l.Algorithm != TokenBucket || l.Burst <= 0:
			errs = append(errs, errors.New("a ceiling needs a token bucket (rate_per_s and burst, or limit and window_s)"))
		case l.Ceiling < l.Burst:
			errs = append(errs, errors.New("ceiling must be at least the burst (the guarantee)"))
		}
	}
	if l.Quota != nil && *l.Quota < Uncapped {
		errs = append(errs, errors.New("quota must be -1 (uncapped) or at least 0"))
	}
	errs = append(errs, l.checkBounds()...)
	if l.Quota != nil && l.QuotaPeriod != Month && l.QuotaPeriod != Day {
		errs = append(errs, fmt.Errorf("unknown quota_period %q (want month or day)", l.QuotaPeriod))
	}
	return errors.Join(errs...)
}

// checkBounds reports every number of l past its maximum (MaxAmount, MaxBucketWindow),
// each error naming its field.
func (l Limit) checkBounds() []error {
	var errs []error
	if l.Quota != nil && *l.Quota > MaxAmount {
		errs = append(errs, fmt.Errorf("quota must be at most %d", int64(MaxAmount)))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"burst", l.Burst}, {"limit", l.Limit}, {"ceiling", l.Ceiling}} {
		if f.v > MaxAmount {
			errs = append(errs, fmt.Errorf("%s must be at most %d", f.name, int64(MaxAmount)))
		}
	}
	switch {
	case math.IsNaN(l.RatePerS) || math.IsInf(l.RatePerS, 0):
		errs = append(errs, errors.New("rate_per_s must be a finite number"))
	case l.RatePerS > MaxAmount:
		errs = append(errs, fmt.Errorf("rate_per_s must be at most %d", int64(MaxAmount)))
	}
	maxS := int64(MaxBucketWindow / time.Second)
	switch {
	case l.Algorithm != TokenBucket:
	case l.WindowS > 0: // written as limit per window_s: the window itself, exactly
		if l.WindowS > maxS {
			errs = append(errs, fmt.Errorf("window_s of a token bucket must be at most %d (about 31 years)", maxS))
		}
	case l.RatePerS > 0 && l.Burst > 0 && float64(l.Burst)/l.RatePerS > float64(maxS):
		errs = append(errs, fmt.Errorf("burst / rate_per_s (the time the bucket takes to fill) must be at most %d s (about 31 years): raise rate_per_s", maxS))
	}
	return errs
}

// Kind is the place of a node in the account tree.
type Kind string

// Node kinds, from the root down. A path may skip levels (org → agent).
const (
	Org   Kind = "org"
	Team  Kind = "team"
	User  Kind = "user"
	Agent Kind = "agent"
)

// Depth orders kinds: a child's kind is deeper than its parent's.
func (k Kind) Depth() int {
	switch k {
	case Org:
		return 0
	case Team:
		return 1
	case User:
		return 2
	case Agent:
		return 3
	}
	return -1
}

// ValidID reports whether s may be an account id, an API key id or another identifier
// that becomes part of a Redis key: 1-64 of [A-Za-z0-9._-], starting with a letter or digit
// (the accounts table checks the same pattern). A loop, not a regexp: admit and the meter
// check ids on every request and event.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case (c == '.' || c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// Level is one node of a resolved path with the limits that apply at that node.
type Level struct {
	Account     string         `json:"account"`
	Kind        Kind           `json:"kind"`
	Plan        string         `json:"plan,omitempty"`
	Limits      map[Unit]Limit `json:"limits"`
	Concurrency int            `json:"concurrency"`
	// Reserved is, per unit, the guarantees of this node's children (their limits with a
	// ceiling): capacity of this node that only those children use. What is left of the
	// node's own token bucket, its spare, is what its other traffic and borrowing children
	// share. nil when no child has a guarantee.
	Reserved map[Unit]Reservation `json:"reserved,omitempty"`
	// Credits are the units this node has credit grants of: a request carrying one draws
	// it from the node's balance, all-or-nothing with every limit (docs/credits.md).
	Credits []Unit `json:"credits,omitempty"`
	// Alerts are the node's alert rules: its own, and its plan's of every kind, unit and
	// period it has none of (docs/alerts.md).
	Alerts []Alert `json:"alerts,omitempty"`
	// Granted is, per unit, the units of the node's grants neither voided nor expired when
	// the policies were loaded: what a BalancePercent rule's percentages are of.
	Granted map[Unit]int64 `json:"granted,omitempty"`
}

// Reservation is the sum of some guarantees: a token bucket's rate and burst.
type Reservation struct {
	RatePerS float64 `json:"rate_per_s"`
	Burst    int64   `json:"burst"`
}

// Resolved is the effective policy of one account: the path from its org down to it, each
// level with its effective limits. It is what admission decides against.
type Resolved struct {
	Org  string  `json:"org"`
	Plan string  `json:"plan"`
	Path []Level `json:"path"` // org first, the account itself last
	// Priority orders requests waiting for the same limit (max_wait_ms): higher first. It
	// is the account's own priority, else its nearest ancestor's, else its org's plan's.
	Priority int `json:"priority"`
	// Shadow: the account's requests are decided and recorded but never refused, because it,
	// an account above it, or the plan of one of them is in shadow mode.
	Shadow bool `json:"shadow,omitempty"`
	// Stamp names this policy: one account in one snapshot of a Cache (0 when the policy was
	// not made by a Cache). A consumer keys what it derives from the policy by it.
	Stamp Stamp `json:"-"`
}

// Stamp names one account's policy in one snapshot of a Cache, so that a consumer derives
// what it needs from the policy once per snapshot and not once per request (admission
// compiles the limits into the script's program). A reload stamps every policy anew:
// nothing derived outlives its policy.
type Stamp uint64

// stamps counts the snapshots resolved, and (in snapshot 0) the stamps NewStamp gave.
var stamps, looseStamps atomic.Uint64

// Snapshot is the number of the snapshot the stamp's policy belongs to, increasing with
// each resolution in the process; 0 for NewStamp's.
func (s Stamp) Snapshot() uint64 { return uint64(s) >> 32 }

// NewStamp returns a stamp of snapshot 0, unique in the process, for a policy made
// outside a Cache (tests, benchmarks).
func NewStamp() Stamp { return Stamp(looseStamps.Add(1) & math.MaxUint32) }

// snapshotStamps starts a new snapshot and returns what stamps its accounts, one after
// the other (2^32 of them at most).
func snapshotStamps() func() Stamp {
	last := stamps.Add(1) << 32
	return func() Stamp {
		last++
		return Stamp(last)
	}
}

// Account is the node the policy was resolved for.
func (r Resolved) Account() string { return r.Path[len(r.Path)-1].Account }

// HasQuota reports whether any level caps any unit with a quota: such accounts fail closed
// when Redis is unavailable.
func (r Resolved) HasQuota() bool {
	for _, lv := range r.Path {
		for _, l := range lv.Limits {
			if l.HasQuota() {
				return true
			}
		}
	}
	return false
}

// HasCredits reports whether any level has credit grants: such accounts fail closed when
// Redis is unavailable too (nothing may be admitted without drawing its balance).
func (r Resolved) HasCredits() bool {
	for _, lv := range r.Path {
		if len(lv.Credits) > 0 {
			return true
		}
	}
	return false
}

// ToolCredits is the default credit cost of the tools named in a request's "tool" field;
// admit's configuration may replace it.
var ToolCredits = map[string]int64{
	"web_search":     1,
	"llm_call":       3,
	"code_execute":   5,
	"image_generate": 10,
}
