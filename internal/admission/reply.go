package admission

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/period"
)

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
	codeMirrorMiss        = 8 // MIRROR_MISS: the mirror does not hold the decision's program; nothing was done
	codeCheckLog          = 9 // CHECK_LOG: the key may be in the billing log; nothing was done

	replyHeaderLen    = 3 // status, sec, usec
	decisionHeaderLen = 6 // code, a, b, replayed, queued, shadowed; the limits' state follows
)

// replyCodes names the reply codes as the script does (TestScriptLayout).
var replyCodes = map[string]int64{
	"CLOCK_OFF": statusClockOff, "DECIDED": statusDecided,
	"ALLOWED": codeAllowed, "RATE_LIMITED": codeRateLimited, "OVER_QUOTA": codeOverQuota,
	"IDEMPOTENCY_REUSED": codeIdempotencyReused, "INSUFFICIENT_BALANCE": codeInsufficient,
	"REPLAY_REFUSED": codeReplayRefused, "IDEMPOTENCY_EXHAUSTED": codeExhausted,
	"MIRROR_MISS": codeMirrorMiss, "CHECK_LOG": codeCheckLog,
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
	case codeMirrorMiss:
		return Decision{}, errMirrorMiss
	case codeCheckLog:
		return Decision{}, errCheckLog
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

var (
	// errMirrorMiss is a decision the script did not take: the mirror lacks its program.
	errMirrorMiss = errors.New("admission script: the policy mirror does not hold the program")
	// errCheckLog is a decision the script did not take: its idempotency key may be in the
	// billing log (Admitter.fromLog).
	errCheckLog = errors.New("admission script: the idempotency key may be in the billing log")
)
