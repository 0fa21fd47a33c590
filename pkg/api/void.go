package api

import (
	"context"
	"errors"
	"time"

	"github.com/metergate/metergate/pkg/admission"
	"github.com/metergate/metergate/pkg/event"
)

// Voiding a request nobody was told the decision of (DESIGN.md, failure policy): first in
// Redis, where the decision was taken (void.lua also stops a replay of it); when Redis
// cannot take it, its usage.voided event goes straight to Kafka, and the Redis part is
// retried in the background.
const (
	// voidTimeout bounds the void's script call made before a 503 is answered.
	voidTimeout = 2 * time.Second
	// voidRetryFor is how long the Redis part of a void is retried after it failed.
	voidRetryFor = 10 * time.Minute
)

// callerGone handles a request whose caller hung up while it was decided: it is counted as
// abandoned (not as a Redis outage) and, unless nothing was charged, voided.
func (s *Server) callerGone(req admission.Request, d admission.Decision, err error) {
	s.metrics.abandoned.Inc()
	if err == nil && d.Result != admission.Allow || errors.Is(err, admission.ErrIdempotencyKeyReused) {
		return // a denial consumed nothing
	}
	s.void(req, event.VoidCallerGone)
}

// void voids req; it returns once the void is recorded in Redis or in Kafka, or both failed
// (then logged and retried in the background, against Redis).
func (s *Server) void(req admission.Request, reason string) {
	log := s.cfg.Log.With("event_id", req.EventID, "org", req.Policy.Org, "reason", reason)
	ctx, cancel := context.WithTimeout(context.Background(), voidTimeout)
	defer cancel()
	if _, err := s.cfg.Decider.Void(ctx, admission.Void{Request: req, Reason: reason}); err == nil {
		s.metrics.voids.WithLabelValues(reason, "redis").Inc()
		return
	} else {
		log = log.With("err", err)
	}
	go s.retryVoid(req, reason)
	if s.cfg.Recorder != nil {
		ev, err := admission.VoidedEvent(req, req.EventID, reason, s.cfg.Clock())
		if err == nil {
			err = s.cfg.Recorder.Record(ctx, req.Policy.Org, ev)
		}
		if err == nil {
			s.metrics.voids.WithLabelValues(reason, "kafka").Inc()
			log.Warn("request voided in kafka; its redis part is retried")
			return
		}
		log = log.With("record_err", err)
	}
	s.metrics.voids.WithLabelValues(reason, "pending").Inc()
	log.Error("request could not be voided yet; retrying against redis")
}

// retryVoid retries the Redis part of a void with backoff until it succeeds or voidRetryFor
// has passed.
func (s *Server) retryVoid(req admission.Request, reason string) {
	deadline := time.Now().Add(voidRetryFor)
	for wait := 100 * time.Millisecond; time.Now().Before(deadline); wait = min(2*wait, 5*time.Second) {
		time.Sleep(wait)
		ctx, cancel := context.WithTimeout(context.Background(), voidTimeout)
		_, err := s.cfg.Decider.Void(ctx, admission.Void{Request: req, Reason: reason})
		cancel()
		if err == nil {
			s.metrics.voids.WithLabelValues(reason, "redis_retried").Inc()
			return
		}
	}
	s.metrics.voids.WithLabelValues(reason, "given_up").Inc()
	s.cfg.Log.Error("void given up in redis", "event_id", req.EventID, "org", req.Policy.Org)
}
