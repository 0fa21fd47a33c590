package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/outbox"
	"github.com/metergate/metergate/internal/topic"
)

// runRelay runs the outbox relay alone, for deployments that scale it apart from the API.
func runRelay(ctx context.Context, cfg config.Admit, log *slog.Logger) error {
	reg := ops.NewRegistry()
	w := cfg.Kafka.Writer()
	defer w.Close()
	r, err := newRelay(cfg, log, reg, w)
	if err != nil {
		return err
	}
	defer r.Close()
	probes := &ops.Probes{}
	mux := http.NewServeMux()
	probes.Mount(mux, reg)

	g, ctx := errgroup.WithContext(ctx)
	r.start(ctx, g, probes, cfg.Admission.OutboxMaxAge)
	g.Go(func() error { return ops.Serve(ctx, log, cfg.Server.HTTP(), mux) })
	g.Go(topic.EnsureThen(ctx, log, cfg.Kafka.Brokers, cfg.Kafka.Spec(), nil))
	return g.Wait()
}

// relay is the outbox relay and, unless the billing log is off (ADMIT_IDEMPOTENCY_HOT=0),
// the idempotency janitor, which moves the shards' marks as the meters commit what the
// relays produced.
type relay struct {
	relay  *outbox.Relay
	marker *outbox.Marker // nil when off
	rdb    redis.UniversalClient
}

// newRelay builds the relay producing through w, with a Redis client of its own: every
// outbox stream (two per shard: Keys.Outboxes) blocks one connection while it waits for
// entries, which must not starve the decisions' pool. Close it once it has run.
func newRelay(cfg config.Admit, log *slog.Logger, reg prometheus.Registerer, w *outbox.Writer) (*relay, error) {
	rdb, err := cfg.Redis.OpenPool(2*cfg.Admission.Shards + 4)
	if err != nil {
		return nil, err
	}
	r := &relay{rdb: rdb, relay: outbox.NewRelay(rdb, w,
		cfg.Admission.RelayOptions(outbox.RelayOptions{Log: log.With("component", "relay"), Registerer: reg}))}
	if cfg.Admission.UsesBillingLog() {
		r.marker = outbox.NewMarker(rdb, cfg.MarkOptions(outbox.MarkOptions{Log: log.With("component", "idempotency"), Registerer: reg}))
	}
	return r, nil
}

// start runs the relay and the janitor in g, and adds the outbox to probes: degraded past
// maxAge (ADMIT_OUTBOX_MAX_AGE).
func (r *relay) start(ctx context.Context, g *errgroup.Group, probes *ops.Probes, maxAge time.Duration) {
	probes.AddDegraded("outbox", outboxCheck(r.relay, maxAge))
	g.Go(func() error { return r.relay.Run(ctx) })
	if r.marker != nil {
		g.Go(func() error { return r.marker.Run(ctx) })
	}
}

// Close closes the relay's Redis client.
func (r *relay) Close() { _ = r.rdb.Close() }

// outboxCheck fails when the oldest unrelayed event is older than limit: Kafka is down or
// the relay falls behind. Admission goes on meanwhile, so it is a degraded check.
func outboxCheck(relay *outbox.Relay, limit time.Duration) ops.Check {
	return func(ctx context.Context) error {
		age, err := relay.OldestAge(ctx)
		if err != nil {
			return err
		}
		if age > limit {
			return fmt.Errorf("oldest unrelayed event is %s old (limit %s)", age.Round(time.Second), limit)
		}
		return nil
	}
}
