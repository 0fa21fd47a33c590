package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/metergate/metergate/pkg/admission"
	"github.com/metergate/metergate/pkg/estimate"
	"github.com/metergate/metergate/pkg/event"
	"github.com/metergate/metergate/pkg/period"
	"github.com/metergate/metergate/pkg/policy"
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
	start := time.Now()
	in, e := parseAdmit(r.Body, s.cfg.Tools, s.cfg.Estimate)
	var wait time.Duration
	if e == nil {
		wait, e = maxWait(in.MaxWaitMS, s.cfg.MaxWait)
	}
	if e != nil {
		s.metrics.rejected(e.Code)
		writeError(w, e)
		return
	}
	s.decide(r.Context(), w, in, wait, start)
}

// decide takes the decision of a validated request and answers it on w: the reply of POST
// /v1/admit (200, 429, 402, 401, 403, 422, 503) with its RateLimit fields and Retry-After.
// Every front door answers through it (POST /v1/admit, the forward-auth check, Envoy's
// rate-limit service), so they take the same decision with the same headers and the same
// fail policy; they translate the reply. ctx is the caller's: when it is gone before the
// answer, the decision is voided and decide panics with http.ErrAbortHandler.
func (s *Server) decide(ctx context.Context, w http.ResponseWriter, in admitInput, wait time.Duration, start time.Time) {
	var (
		pol   policy.Resolved
		keyID string
		err   error
	)
	if in.APIKey != "" {
		var key policy.APIKey
		key, pol, err = s.cfg.Policies.Authenticate(in.APIKey)
		keyID = key.ID
		switch {
		case errors.Is(err, policy.ErrRevoked):
			s.metrics.rejected("revoked_api_key")
			writeError(w, &Error{Status: 403, Code: "revoked_api_key", Message: "the API key was revoked"})
			return
		case err != nil:
			s.metrics.rejected("unknown_api_key")
			writeError(w, &Error{Status: 401, Code: "unknown_api_key", Message: "the API key is not known"})
			return
		}
	} else if pol, err = s.cfg.Policies.Resolve(in.Account); err != nil {
		s.metrics.rejected("unknown_account")
		writeError(w, &Error{Status: 401, Code: "unknown_account", Message: fmt.Sprintf("account %q does not exist", in.Account)})
		return
	}

	req := admission.Request{
		EventID:        s.cfg.Decider.NewEventID(pol.Org),
		IdempotencyKey: in.IdempotencyKey,
		Units:          in.Units,
		Policy:         pol,
		APIKeyID:       keyID,
		Tool:           in.Tool,
		Source:         s.cfg.Source,
		MaxWait:        wait,
		Shadow:         s.cfg.Shadow || pol.Shadow,
	}
	decideStart := time.Now()
	d, err := s.cfg.Decider.Decide(ctx, req)
	if ctx.Err() != nil {
		// The caller hung up: nobody will be told, so nothing may be billed. Not a Redis
		// outage, whatever Decide returned. A waiting request that left its queue was not
		// charged, but its last script call may have admitted it as the caller went: it is
		// voided all the same (a void of nothing bills nothing).
		s.callerGone(req, d, err)
	}
	switch {
	case errors.Is(err, admission.ErrIdempotencyKeyReused):
		s.metrics.rejected("idempotency_key_reused")
		writeError(w, &Error{Status: 422, Code: "idempotency_key_reused", Message: "this idempotency key was used with different units or another tool"})
		return
	case err != nil:
		s.redisDown(ctx, w, req, in.Estimated, err)
		return
	}
	s.metrics.decided(d, pol, time.Since(start), wait > 0)
	setRateLimitHeaders(w.Header(), d.Limits)
	reply := admitReply{Decision: d.Result, Account: pol.Account(), Org: pol.Org, Estimated: in.Estimated}
	if wait > 0 {
		waited := time.Since(decideStart).Milliseconds()
		reply.WaitedMS = &waited
	}
	switch d.Result {
	case admission.Allow:
		reply.EventID, reply.Period, reply.Replayed = d.EventID, d.Period, d.Replayed
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
		writeJSON(w, http.StatusOK, reply)
	case admission.RateLimited:
		reply.BlockedBy = d.Blocked
		ms := d.RetryAfter.Milliseconds()
		reply.RetryAfterMS = &ms
		if ms >= 0 {
			w.Header().Set("Retry-After", retryAfterSeconds(d.RetryAfter))
		}
		writeJSON(w, http.StatusTooManyRequests, reply)
	case admission.InsufficientBalance:
		reply.BlockedBy = d.Blocked
		for _, b := range d.Balances {
			if b.Account == d.Blocked.Account && b.Unit == d.Blocked.Unit {
				reply.Balance = &b.Balance
			}
		}
		writeJSON(w, http.StatusPaymentRequired, reply)
	default:
		reply.BlockedBy, reply.Period = d.Blocked, d.Period
		writeJSON(w, http.StatusPaymentRequired, reply)
	}
}

// redisDown answers a decision Redis could not take: rate-only accounts fail open (their
// event goes straight to Kafka, synchronously; if that fails too, deny), quota-bearing
// accounts fail closed; both as configured.
func (s *Server) redisDown(ctx context.Context, w http.ResponseWriter, req admission.Request, est *estimate.Estimate, cause error) {
	pol := req.Policy
	policyFor := s.cfg.RedisDownRateOnly
	if pol.HasQuota() {
		policyFor = s.cfg.RedisDownQuota
	}
	if pol.HasCredits() {
		policyFor = FailClosed // a balance is never drawn without Redis: no overdraft
	}
	log := s.cfg.Log.With("org", pol.Org, "account", pol.Account(), "err", cause)
	if policyFor == FailOpen && s.cfg.Recorder != nil {
		now := s.cfg.Clock.Now().UTC()
		data := req.Admitted(period.MonthLabel(now))
		data.FailOpen = true
		ev, err := event.New(req.EventID, s.cfg.Source, event.TypeAdmitted, event.Subject(data.Path), now, data)
		if err == nil {
			err = s.cfg.Recorder.Record(ctx, pol.Org, ev)
		}
		if ctx.Err() != nil { // nobody is told: void what may be billed (callerGone does not return)
			charged, callErr := admission.Decision{}, cause
			if err == nil { // the fail-open event is in Kafka, whatever Redis did
				charged, callErr = admission.Decision{Result: admission.Allow}, nil
			}
			s.callerGone(req, charged, callErr)
		}
		if err == nil {
			log.Warn("redis unavailable: admitted fail-open, event written to kafka", "event_id", req.EventID)
			s.metrics.failOpen.Inc()
			writeJSON(w, http.StatusOK, admitReply{Decision: admission.Allow, EventID: req.EventID, Account: pol.Account(),
				Org: pol.Org, Period: data.Period, FailOpen: true, Estimated: est})
			return
		}
		log.Error("redis unavailable and the fail-open event could not be recorded: denying", "record_err", err)
	} else {
		log.Warn("redis unavailable: failing closed")
	}
	s.metrics.failClosed.Inc()
	// The script call may have run (it timed out after it was sent) or may still run (queued
	// behind a stall): void it. A retry with the same idempotency key that is answered with
	// its decision before the void lands makes it bill again (void.lua): that caller was
	// told 200. A call that never reached Redis decided nothing.
	if mayHaveCharged(admission.Decision{}, cause) {
		s.void(req, event.VoidUnavailable)
	}
	w.Header().Set("Retry-After", retryAfterSeconds(s.cfg.RedisDownRetryAfter))
	writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "the decision cannot be taken right now; retry later"})
}

// setRateLimitHeaders writes the IETF draft-10 RateLimit-Policy and RateLimit fields for
// the rate limit and the quota closest to running out. A token bucket's q is what it has
// for this request's traffic: its limit less its children's guarantees.
func setRateLimitHeaders(h http.Header, limits []admission.LimitState) {
	var picked []admission.LimitState
	for _, quota := range []bool{false, true} {
		best, found := admission.LimitState{}, false
		for _, l := range limits {
			if l.Quota != quota || l.Limit <= 0 {
				continue
			}
			if !found || float64(l.Remaining)/float64(l.Limit) < float64(best.Remaining)/float64(best.Limit) {
				best, found = l, true
			}
		}
		if found {
			picked = append(picked, best)
		}
	}
	if len(picked) == 0 {
		return
	}
	sort.SliceStable(picked, func(i, j int) bool { return !picked[i].Quota && picked[j].Quota })
	// Built with strconv, not fmt: every decision writes them.
	var pol, cur []byte
	item := func(b []byte, l admission.LimitState, k1 string, v1 int64, k2 string, v2 int64) []byte {
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		name := l.Account + "-" + l.Unit
		if l.Quota {
			name += "-quota"
		}
		b = strconv.AppendQuote(b, name)
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

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// estimate answers POST /v1/estimate: the tokens of a model request, charged to nobody.
func (s *Server) estimate(w http.ResponseWriter, r *http.Request) {
	est, e := parseEstimate(r.Body, s.cfg.Estimate)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, est)
}
