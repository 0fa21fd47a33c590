package api

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/metergate/metergate/pkg/admission"
	"github.com/metergate/metergate/pkg/event"
)

// Voiding a request nobody was told the decision of (DESIGN.md, failure policy) happens in
// Redis, where the decision was taken: void.lua orders it with the decision's other
// requests (replays by its idempotency key), so a void never unbills a decision that a
// replay answered with 200, whichever runs first. While Redis cannot take it, the void is
// retried in the background; only when admit stops (or after voidRetryFor) does a void
// still pending go straight to Kafka, where it voids the request's own event id.
const (
	// voidTimeout bounds one script call of a void (the Redis client's timeouts apply too).
	voidTimeout = 2 * time.Second
	// voidRetryFor is how long a void is retried against Redis before it goes to Kafka.
	voidRetryFor = time.Hour
	// voidBackoffMax is the longest pause between two tries.
	voidBackoffMax = 5 * time.Second
	// maxPendingVoids bounds the voids retried in the background; past it (a long outage
	// with calls timing out), a void goes straight to Kafka.
	maxPendingVoids = 10_000
)

// voids runs the voids that Redis did not take at the first try.
type voids struct {
	pending atomic.Int64
	wg      sync.WaitGroup
	mu      sync.Mutex // orders wg.Add with Close
	closed  bool
	stop    chan struct{}
}

// callerGone handles a request whose caller hung up while it was decided: it is counted as
// abandoned (not as a Redis outage), voided unless nothing was charged, and answered with
// nothing at all. It does not return: it aborts the handler (http.ErrAbortHandler), as
// returning would make net/http answer an implicit, empty 200.
func (s *Server) callerGone(req admission.Request, d admission.Decision, err error) {
	s.metrics.abandoned.Inc()
	if mayHaveCharged(d, err) {
		s.void(req, event.VoidCallerGone)
	}
	panic(http.ErrAbortHandler)
}

// mayHaveCharged reports whether Decide's answer leaves a charge possible: an admission, or
// an error after the script call was sent (a denial, a reused idempotency key and a call
// that never reached Redis charged nothing).
func mayHaveCharged(d admission.Decision, err error) bool {
	if err != nil {
		return !errors.Is(err, admission.ErrIdempotencyKeyReused) && !errors.Is(err, admission.ErrNotSent)
	}
	return d.Result == admission.Allow
}

// void voids req: once now, and in the background until Redis takes it.
func (s *Server) void(req admission.Request, reason string) {
	if s.tryVoid(req, reason) {
		s.metrics.voids.WithLabelValues(reason, "redis").Inc()
		return
	}
	s.voids.mu.Lock()
	if s.voids.closed || s.voids.pending.Add(1) > maxPendingVoids {
		if !s.voids.closed {
			s.voids.pending.Add(-1)
		}
		s.voids.mu.Unlock()
		s.voidInKafka(req, reason)
		return
	}
	s.voids.wg.Add(1)
	s.voids.mu.Unlock()
	s.metrics.pending.Inc()
	go func() {
		defer s.voids.wg.Done()
		defer s.voids.pending.Add(-1)
		defer s.metrics.pending.Dec()
		s.retryVoid(req, reason)
	}()
}

func (s *Server) tryVoid(req admission.Request, reason string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), voidTimeout)
	defer cancel()
	_, err := s.cfg.Decider.Void(ctx, admission.Void{Request: req, Reason: reason})
	if err != nil {
		s.cfg.Log.Warn("void not taken by redis yet; retrying", "event_id", req.EventID, "org", req.Policy.Org, "err", err)
	}
	return err == nil
}

// retryVoid retries a void against Redis with backoff; when admit stops or voidRetryFor has
// passed, it writes the void straight to Kafka instead.
func (s *Server) retryVoid(req admission.Request, reason string) {
	deadline := time.Now().Add(voidRetryFor)
	for wait := 50 * time.Millisecond; time.Now().Before(deadline); wait = min(2*wait, voidBackoffMax) {
		select {
		case <-time.After(wait):
		case <-s.voids.stop:
			s.voidInKafka(req, reason)
			return
		}
		if s.tryVoid(req, reason) {
			s.metrics.voids.WithLabelValues(reason, "redis_retried").Inc()
			return
		}
	}
	s.voidInKafka(req, reason)
}

// voidInKafka records the void of req's own event id straight to Kafka. It is the last
// resort: a replay of req's decision answered after this (once Redis is back) would be
// told 200 for an event that bills nothing (docs/admission.md).
func (s *Server) voidInKafka(req admission.Request, reason string) {
	log := s.cfg.Log.With("event_id", req.EventID, "org", req.Policy.Org, "reason", reason)
	err := errors.New("no kafka recorder")
	if s.cfg.Recorder != nil {
		var ev event.CloudEvent
		if ev, err = admission.VoidedEvent(req, req.EventID, reason, s.cfg.Clock.Now()); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), voidTimeout)
			err = s.cfg.Recorder.Record(ctx, req.Policy.Org, ev)
			cancel()
		}
	}
	if err != nil {
		s.metrics.voids.WithLabelValues(reason, "lost").Inc()
		log.Error("void lost: neither redis nor kafka took it", "err", err)
		return
	}
	s.metrics.voids.WithLabelValues(reason, "kafka").Inc()
	log.Warn("void written straight to kafka: redis did not take it")
}

// Close ends the voids still retried against Redis: each goes straight to Kafka, as does
// any void after it. Call it once the HTTP server has stopped; it returns when they are
// written or ctx ends.
func (s *Server) Close(ctx context.Context) error {
	s.voids.mu.Lock()
	if !s.voids.closed {
		s.voids.closed = true
		close(s.voids.stop)
	}
	s.voids.mu.Unlock()
	done := make(chan struct{})
	go func() { s.voids.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
