package gate

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/pkg/event"
)

// Voiding a request nobody was told the decision of (docs/guarantees.md: nothing is billed that
// was not answered 200) happens in Redis, where the decision was taken: void.lua orders it with
// the decision's other requests (replays by its idempotency key), so a void never unbills a
// decision that a replay answered with 200, whichever runs first. While Redis cannot take it,
// the void is retried in the background; only when admit stops (or after voidRetryFor) does a
// void still pending go straight to Kafka, where it voids the request's own event id.
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

// void voids req: once now, and in the background until Redis takes it.
func (g *Gate) void(req admission.Request, reason string) {
	if g.tryVoid(req, reason) {
		g.metrics.voids.WithLabelValues(reason, "redis").Inc()
		return
	}
	g.voids.mu.Lock()
	if g.voids.closed || g.voids.pending.Add(1) > maxPendingVoids {
		if !g.voids.closed {
			g.voids.pending.Add(-1)
		}
		g.voids.mu.Unlock()
		g.voidInKafka(req, reason)
		return
	}
	g.voids.wg.Add(1)
	g.voids.mu.Unlock()
	g.metrics.pending.Inc()
	go func() {
		defer g.voids.wg.Done()
		defer g.voids.pending.Add(-1)
		defer g.metrics.pending.Dec()
		g.retryVoid(req, reason)
	}()
}

func (g *Gate) tryVoid(req admission.Request, reason string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), voidTimeout)
	defer cancel()
	_, err := g.cfg.Decider.Void(ctx, admission.Void{Request: req, Reason: reason})
	if err != nil {
		g.cfg.Log.Warn("void not taken by redis yet; retrying", "event_id", req.EventID, "org", req.Policy.Org, "err", err)
	}
	return err == nil
}

// retryVoid retries a void against Redis with backoff; when admit stops or voidRetryFor has
// passed, it writes the void straight to Kafka instead.
func (g *Gate) retryVoid(req admission.Request, reason string) {
	deadline := time.Now().Add(voidRetryFor)
	for wait := 50 * time.Millisecond; time.Now().Before(deadline); wait = min(2*wait, voidBackoffMax) {
		select {
		case <-time.After(wait):
		case <-g.voids.stop:
			g.voidInKafka(req, reason)
			return
		}
		if g.tryVoid(req, reason) {
			g.metrics.voids.WithLabelValues(reason, "redis_retried").Inc()
			return
		}
	}
	g.voidInKafka(req, reason)
}

// voidInKafka records the void of req's own event id straight to Kafka. It is the last
// resort: a replay of req's decision answered after this (once Redis is back) would be
// told 200 for an event that bills nothing (docs/admission.md).
func (g *Gate) voidInKafka(req admission.Request, reason string) {
	log := g.cfg.Log.With("event_id", req.EventID, "org", req.Policy.Org, "reason", reason)
	err := errors.New("no kafka recorder")
	if g.cfg.Recorder != nil {
		var ev event.CloudEvent
		if ev, err = admission.VoidedEvent(req, req.EventID, reason, g.cfg.Clock.Now()); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), voidTimeout)
			err = g.cfg.Recorder.Record(ctx, req.Policy.Org, ev)
			cancel()
		}
	}
	if err != nil {
		g.metrics.voids.WithLabelValues(reason, "lost").Inc()
		log.Error("void lost: neither redis nor kafka took it", "err", err)
		return
	}
	g.metrics.voids.WithLabelValues(reason, "kafka").Inc()
	log.Warn("void written straight to kafka: redis did not take it")
}

// Close ends the voids still retried against Redis: each goes straight to Kafka, as does
// any void after it. Call it once the doors have stopped; it returns when they are
// written or ctx ends.
func (g *Gate) Close(ctx context.Context) error {
	g.voids.mu.Lock()
	if !g.voids.closed {
		g.voids.closed = true
		close(g.voids.stop)
	}
	g.voids.mu.Unlock()
	done := make(chan struct{})
	go func() { g.voids.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
