package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/estimate"
	"github.com/metergate/metergate/internal/gate"
)

type admitReply struct {
	Decision     admission.Result   `json:"decision"`
	EventID      string             `json:"event_id,omitempty"`
	Account      string             `json:"account"`
	Org          string             `json:"org"`
	Period       string             `json:"period,omitempty"`
	Replayed     bool               `json:"replayed,omitempty"`
	FailOpen     bool               `json:"fail_open,omitempty"`
	BlockedBy    *admission.Blocker `json:"blocked_by,omitempty"`
	RetryAfterMS *int64             `json:"retry_after_ms,omitempty"`
	// Estimated is the estimate charged as the request's tokens, when it sent one.
	Estimated *estimate.Estimate `json:"estimated,omitempty"`
	// WaitedMS is how long admit held a request that was allowed to wait (max_wait_ms > 0).
	WaitedMS *int64 `json:"waited_ms,omitempty"`
	// Balances are the credit balances an allowed request drew from, after the draw.
	Balances []balanceReply `json:"balances,omitempty"`
	// Balance is, for insufficient_balance, what the blocking account's grants hold.
	Balance *int64 `json:"balance,omitempty"`
	// Shadow is, for a request admitted in shadow mode, the refusal it would have had.
	Shadow *shadowReply `json:"shadow,omitempty"`
}

// shadowReply is a refusal shadow mode let pass.
type shadowReply struct {
	Decision     admission.Result   `json:"decision"`
	BlockedBy    *admission.Blocker `json:"blocked_by"`
	RetryAfterMS *int64             `json:"retry_after_ms,omitempty"`
}

type balanceReply struct {
	Account string `json:"account"`
	Unit    string `json:"unit"`
	Balance int64  `json:"balance"`
}

func (s *Server) admit(w http.ResponseWriter, r *http.Request) {
	if !s.estimating(w, r) {
		return
	}
	in, e := parseAdmit(r.Body, s.cfg.Tools, s.cfg.Estimate)
	s.estimated(r)
	var wait time.Duration
	if e == nil {
		wait, e = maxWait(in.MaxWaitMS, s.cfg.MaxWait)
	}
	if e != nil {
		s.gate.Rejected(e.Code)
		writeError(w, e)
		return
	}
	a, err := s.gate.Admit(r.Context(), in.gate(gate.Service, wait, "admit"))
	if err != nil {
		writeRefusal(w, err)
		return
	}
	status, reply := s.reply(w.Header(), a, in.Estimated)
	writeJSON(w, status, reply)
}

// gate is the input of the gate's decision, from door.
func (in admitInput) gate(door gate.Door, wait time.Duration, via string) gate.Input {
	return gate.Input{APIKey: in.APIKey, Account: in.Account, IdempotencyKey: in.IdempotencyKey, Units: in.Units,
		Tool: in.Tool, MaxWait: wait, Door: door, Via: via}
}

// reply renders a decision as POST /v1/admit answers it (200, 429, 402): its status, its
// body, and its RateLimit fields and Retry-After in h. Every door renders it; the check and
// the rate-limit service, which pass it on to the end client, render what shown leaves.
func (s *Server) reply(h http.Header, a gate.Answer, est *estimate.Estimate) (int, admitReply) {
	d, pol := a.Decision, a.Policy
	setRateLimitHeaders(h, d.Limits)
	reply := admitReply{Decision: d.Result, Account: pol.Account(), Org: pol.Org, Estimated: est, FailOpen: a.FailOpen}
	if a.Waited > 0 {
		waited := a.Waited.Milliseconds()
		reply.WaitedMS = &waited
	}
	switch d.Result {
	case admission.Allow:
		reply.EventID, reply.Period, reply.Replayed = d.EventID, d.Period, d.Replayed
		if d.Replayed {
			h.Set(ReplayedHeader, "true")
		}
		if sh := d.Shadow; sh != nil {
			reply.Shadow = &shadowReply{Decision: sh.Result, BlockedBy: sh.Blocked}
			if sh.Result == admission.RateLimited {
				ms := sh.RetryAfter.Milliseconds()
				reply.Shadow.RetryAfterMS = &ms
			}
		}
		if !d.Replayed {
			for _, b := range d.Balances {
				reply.Balances = append(reply.Balances, balanceReply(b))
			}
		}
		return http.StatusOK, reply
	case admission.RateLimited:
		reply.BlockedBy = d.Blocked
		ms := d.RetryAfter.Milliseconds()
		reply.RetryAfterMS = &ms
		if ms >= 0 {
			h.Set("Retry-After", retryAfterSeconds(d.RetryAfter))
		}
		return http.StatusTooManyRequests, reply
	case admission.InsufficientBalance:
		reply.BlockedBy = d.Blocked
		for _, b := range d.Balances {
			if b.Account == d.Blocked.Account && b.Unit == d.Blocked.Unit {
				reply.Balance = &b.Balance
			}
		}
		return http.StatusPaymentRequired, reply
	default:
		reply.BlockedBy, reply.Period = d.Blocked, d.Period
		return http.StatusPaymentRequired, reply
	}
}

// shown is what an end client behind a gateway may see of a: its own account's id, the
// others by their kind (gate.Answer.Redacted), unless Config.RevealAccounts.
func (s *Server) shown(a gate.Answer) gate.Answer {
	if s.cfg.RevealAccounts {
		return a
	}
	return a.Redacted()
}

// ReplayedHeader marks an answer given to a replayed idempotency key (Stripe's convention):
// a 200 of POST /v1/admit that charged nothing, or a gateway's 409 that passes nothing.
const ReplayedHeader = "Idempotent-Replayed"

// refusal is the error answer of a gate error, with its headers set in h: Retry-After on a
// 503, Idempotent-Replayed on a refused replay. The caller gone is not answered at all:
// ok is false.
func refusal(h http.Header, err error) (e *Error, ok bool) {
	var ge *gate.Error
	switch {
	case errors.Is(err, gate.ErrCallerGone):
		return nil, false
	case errors.As(err, &ge):
		if ge.RetryAfter > 0 {
			h.Set("Retry-After", retryAfterSeconds(ge.RetryAfter))
		}
		if ge.Code == "idempotency_key_replayed" {
			h.Set(ReplayedHeader, "true")
		}
		return ge, true
	}
	return &Error{Status: http.StatusInternalServerError, Code: "internal", Message: "internal error"}, true
}

// writeRefusal answers a gate error on w. The caller gone gets nothing: the handler is
// aborted (http.ErrAbortHandler), as returning would make net/http answer an implicit,
// empty 200.
func writeRefusal(w http.ResponseWriter, err error) {
	e, ok := refusal(w.Header(), err)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	writeError(w, e)
}

// setRateLimitHeaders writes the IETF draft-10 RateLimit-Policy and RateLimit fields for
// the rate limit and the quota closest to running out (rateLimitPicks). A token bucket's q
// is what it has for this request's traffic: its limit less its children's guarantees.
func setRateLimitHeaders(h http.Header, limits []admission.LimitState) {
	var buf [2]admission.LimitState
	picked := appendRateLimitPicks(buf[:0], limits)
	if len(picked) == 0 {
		return
	}
	// Built with strconv, not fmt, in buffers sized once: every decision writes them.
	pol, cur := make([]byte, 0, 160), make([]byte, 0, 160)
	item := func(b []byte, l admission.LimitState, k1 string, v1 int64, k2 string, v2 int64) []byte {
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = appendLimitName(b, l)
		b = strconv.AppendInt(append(b, k1...), v1, 10)
		return strconv.AppendInt(append(b, k2...), v2, 10)
	}
	for _, l := range picked {
		pol = item(pol, l, ";q=", l.Limit, ";w=", ceilSeconds(l.Window))
		if l.Ceiling > 0 {
			// What the limit may reach by borrowing its parent's spare (a parameter of ours:
			// the draft lets receivers ignore parameters they do not know).
			pol = strconv.AppendInt(append(pol, ";ceiling="...), l.Ceiling, 10)
		}
		cur = item(cur, l, ";r=", max(0, l.Remaining), ";t=", ceilSeconds(l.Reset))
	}
	h.Set("RateLimit-Policy", string(pol))
	h.Set("RateLimit", string(cur))
}

// rateLimitPicks are the limits the RateLimit fields name: the rate limit and the quota
// closest to running out, the rate limit first.
func rateLimitPicks(limits []admission.LimitState) []admission.LimitState {
	return appendRateLimitPicks(nil, limits)
}

// appendRateLimitPicks appends rateLimitPicks' limits to picked.
func appendRateLimitPicks(picked, limits []admission.LimitState) []admission.LimitState {
	for _, quota := range []bool{false, true} {
		best, found := admission.LimitState{}, false
		for _, l := range limits {
			if l.Quota != quota || l.Limit <= 0 {
				continue
			}
			if !found || remainingShare(l) < remainingShare(best) {
				best, found = l, true
			}
		}
		if found {
			picked = append(picked, best)
		}
	}
	return picked
}

// remainingShare is the share of a limit still left.
func remainingShare(l admission.LimitState) float64 {
	if l.Limit <= 0 {
		return 1
	}
	return float64(l.Remaining) / float64(l.Limit)
}

// limitName names a limit in the RateLimit fields: "<account>-<unit>", "-quota" added for
// a quota.
func limitName(l admission.LimitState) string {
	name := l.Account + "-" + l.Unit
	if l.Quota {
		name += "-quota"
	}
	return name
}

// appendLimitName appends limitName(l) as a quoted string (strconv.Quote): account ids and
// unit names need no escape, anything else goes through strconv.
func appendLimitName(b []byte, l admission.LimitState) []byte {
	start := len(b)
	b = append(b, '"')
	b = append(b, l.Account...)
	b = append(b, '-')
	b = append(b, l.Unit...)
	if l.Quota {
		b = append(b, "-quota"...)
	}
	for _, c := range b[start+1:] {
		if c < ' ' || c > '~' || c == '"' || c == '\\' {
			return strconv.AppendQuote(b[:start], limitName(l))
		}
	}
	return append(b, '"')
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// estimate answers POST /v1/estimate: the tokens of a model request, charged to nobody.
func (s *Server) estimate(w http.ResponseWriter, r *http.Request) {
	if !s.estimating(w, r) {
		return
	}
	defer s.estimated(r)
	est, e := parseEstimate(r.Body, s.cfg.Estimate)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, est)
}

// estimating takes one of the slots of Config.MaxEstimates for a request whose body may be
// a model request to estimate (POST /v1/estimate; POST /v1/admit with a body past
// MaxBodyBytes or of unknown length): estimating a large body costs CPU, so only so many run
// at once. A request that gets no slot within estimateQueueWait is answered 503 busy; false
// means it was. Release the slot with estimated.
func (s *Server) estimating(w http.ResponseWriter, r *http.Request) bool {
	if !estimates(r) {
		return true
	}
	t := time.NewTimer(estimateQueueWait)
	defer t.Stop()
	select {
	case s.estimates <- struct{}{}:
		return true
	case <-t.C:
	case <-r.Context().Done():
	}
	s.gate.Rejected("busy")
	w.Header().Set("Retry-After", "1")
	writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "busy",
		Message: fmt.Sprintf("%d estimates are running on this node; retry later", cap(s.estimates))})
	return false
}

// estimated releases the slot estimating took for r.
func (s *Server) estimated(r *http.Request) {
	if estimates(r) {
		<-s.estimates
	}
}

// estimates reports whether r takes an estimate slot.
func estimates(r *http.Request) bool {
	return r.URL.Path == "/v1/estimate" || r.ContentLength < 0 || r.ContentLength > MaxBodyBytes
}

// estimateQueueWait is how long a request waits for an estimate slot before a 503.
const estimateQueueWait = time.Second
