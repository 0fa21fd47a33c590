// Command admit is metergate's admission service: APIs call it synchronously on every
// request for an allow / deny decision against hierarchical limits, and it records every
// admitted request in a Redis Stream outbox that its relay moves to Kafka.
//
// Configuration comes from environment variables, each mirrored by a flag (admit -h lists
// them); -validate checks it and exits; -migrate applies pending database migrations first.
package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/metergate/metergate/migrations"
	"github.com/metergate/metergate/pkg/admission"
	"github.com/metergate/metergate/pkg/api"
	"github.com/metergate/metergate/pkg/config"
	"github.com/metergate/metergate/pkg/ops"
	"github.com/metergate/metergate/pkg/outbox"
	"github.com/metergate/metergate/pkg/policy"
	"github.com/metergate/metergate/pkg/topic"
)

func main() {
	var cfg config.Admit
	config.LoadOrExit(&cfg, "admit", os.Args[1:])
	log := cfg.Log.Logger(os.Stderr).With("service", "admit")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("admit failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config.Admit, log *slog.Logger) error {
	rdb, err := cfg.Redis.Open()
	if err != nil {
		return err
	}
	defer rdb.Close()
	pool, err := cfg.Postgres.Open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	if cfg.Migrate {
		applied, err := migrations.Up(ctx, pool)
		if err != nil {
			return err
		}
		log.Info("migrations applied", "versions", applied)
	}

	a := cfg.Admission
	reg := ops.NewRegistry()
	cache := policy.NewCache(pool, log, a.PolicyReload)
	admitter := admission.New(rdb, admission.Options{
		Shards: a.Shards, IdempotencyTTL: a.IdempotencyTTL, LeaseTTL: a.LeaseTTL, Registerer: reg,
		MaxBatch: a.MaxBatch, Pipeline: a.Pipeline,
	})
	recorder := outbox.NewWriter(cfg.Kafka.Brokers, cfg.Kafka.Topic)
	defer recorder.Close()
	server := api.New(api.Config{
		Log: log, Policies: cache, Admin: policy.NewStore(pool), Decider: admitter, Recorder: recorder,
		ServiceToken: a.ServiceToken, AdminToken: a.AdminToken, Source: a.Node, Tools: a.ToolCredits,
		RedisDownRateOnly: api.FailPolicy(a.RedisDownRateOnly), RedisDownQuota: api.FailPolicy(a.RedisDownQuota),
		Registerer: reg,
	})

	probes := &ops.Probes{}
	// Without Redis, admit still serves rate-only accounts fail-open (and answers 503 for
	// the rest): a load balancer must keep sending it traffic.
	probes.AddDegraded("redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	probes.Add("postgres", pool.Ping)
	probes.Add("policy", func(context.Context) error {
		if !cache.Loaded() {
			return errors.New("policies not loaded yet")
		}
		return nil
	})
	mux := http.NewServeMux()
	probes.Mount(mux, reg)
	server.Mount(mux)

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return cache.Run(ctx) })
	g.Go(func() error { return ops.Serve(ctx, log, cfg.Server.Addr, mux, cfg.Server.ShutdownTimeout) })
	// Admission does not wait for Kafka (the outbox absorbs an outage), so the topic is
	// made sure of in the background, retrying until the broker answers.
	g.Go(func() error {
		_ = topic.EnsureRetry(ctx, log, cfg.Kafka.Brokers, cfg.Kafka.Spec()) // ends only with ctx
		return nil
	})
	return g.Wait()
}
