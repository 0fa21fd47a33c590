// Command admit is metergate's admission service: APIs call it synchronously on every
// request for an allow / deny decision against hierarchical limits, and it records every
// admitted request in a Redis Stream outbox that its relay moves to Kafka.
//
//	admit [serve] [flags]  serve the API, and relay the outbox to Kafka (unless ADMIT_RELAY=false)
//	admit relay [flags]    relay the outbox to Kafka only (with /healthz, /readyz, /metrics)
//	admit help [command]   list the commands, or a command's flags
//
// Configuration comes from environment variables, each mirrored by a flag (admit -h lists
// them); -validate checks it and exits; -migrate applies pending database migrations first.
// An unknown command exits 2.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/billinglog"
	"github.com/metergate/metergate/internal/cli"
	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/estimate"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/outbox"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/topic"
	"github.com/metergate/metergate/internal/webhook"
	"github.com/metergate/metergate/migrations"
)

func main() {
	cli.Main("admit", os.Args[1:],
		command("serve", "serve the API, and relay the outbox to Kafka unless ADMIT_RELAY=false", run),
		command("relay", "relay the outbox to Kafka only (with /healthz, /readyz, /metrics)", runRelay),
	)
}

// command is a subcommand of admit: it reads the configuration from the environment and
// args (exit 2 when it is bad), runs do until SIGINT or SIGTERM, and logs do's error and
// exits 1.
func command(name, summary string, do func(context.Context, config.Admit, *slog.Logger) error) cli.Command {
	return cli.Command{Name: name, Summary: summary, Run: func(args []string) int {
		var cfg config.Admit
		config.LoadOrExit(&cfg, "admit", args)
		log := cfg.Log.Logger(os.Stderr).With("service", "admit")
		config.RedisLogsTo(log)
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := do(ctx, cfg, log); err != nil {
			log.Error("admit failed", "err", err)
			return 1
		}
		return 0
	}}
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
		applied, err := migrations.UpURL(ctx, cfg.Postgres.MigrationURL())
		if err != nil {
			return err
		}
		log.Info("migrations applied", "versions", applied)
	}

	a := cfg.Admission
	reg := ops.NewRegistry()
	cache := policy.NewCache(pool, log, a.PolicyReload)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "metergate_policy_accounts",
		Help: "Accounts in this node's policy cache (0 until the first load).",
	}, func() float64 { return float64(cache.Len()) }))
	// Past the hot window, idempotency keys are answered from the billing log
	// (docs/admission.md, "Idempotency"); ADMIT_IDEMPOTENCY_HOT=0 keeps every record in Redis.
	var idempotencyLog admission.IdempotencyLog
	if a.IdempotencyHot > 0 {
		idempotencyLog = billinglog.New(pool, billinglog.Options{})
	}
	admitter := admission.New(rdb, admission.Options{
		KeyPrefix: a.KeyPrefix, Shards: a.Shards, IdempotencyTTL: a.IdempotencyTTL, IdempotencyLegacy: a.IdempotencyLegacy,
		IdempotencyLog: idempotencyLog, IdempotencyHot: a.IdempotencyHot, IdempotencyFilterBits: uint64(a.IdempotencyFilterBits), //nolint:gosec // validated: 2^13-2^32
		LeaseTTL: a.LeaseTTL, Registerer: reg,
		MaxBatch: a.MaxBatch, Pipeline: a.Pipeline, WaitReplicas: a.WaitReplicas, WaitTimeout: a.WaitTimeout,
	})
	// Deferred, so it runs once the HTTP server has stopped: a request still waiting for
	// capacity is woken through the queue channel until then.
	defer admitter.Close()
	recorder := outbox.NewWriter(cfg.Kafka.Brokers, cfg.Kafka.Topic)
	defer recorder.Close()
	server := api.New(api.Config{
		Log: log, Policies: cache, Admin: policy.NewStore(pool), Decider: admitter, Recorder: recorder,
		ServiceToken: a.ServiceToken, AdminToken: a.AdminToken, Source: a.Node, Tools: a.ToolCredits,
		RedisDownRateOnly: api.FailPolicy(a.RedisDownRateOnly), RedisDownQuota: api.FailPolicy(a.RedisDownQuota),
		Registerer: reg, Estimate: estimate.Options{DefaultOutput: int64(a.EstimateDefaultOutput)},
		MaxWait: a.MaxWait, Shadow: a.Shadow, Credits: credit.NewStore(pool, rdb, admitter.Keys(), nil),
		Webhooks: webhook.NewStore(pool, cfg.Webhooks.AllowPrivate),
		Check:    api.CheckHeaders(a.Check), RevealAccounts: a.RevealAccounts, MaxEstimates: a.MaxEstimates,
	})

	probes := &ops.Probes{}
	// Without Redis, admit still serves rate-only accounts fail-open (and answers 503 for
	// the rest): a load balancer must keep sending it traffic.
	probes.AddDegraded("redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	// Decisions come from the policy cache: while PostgreSQL restarts admit keeps deciding
	// (policy changes wait), so PostgreSQL is a degraded check too.
	probes.AddDegraded("postgres", pool.Ping)
	probes.Add("policy", func(context.Context) error {
		if !cache.Loaded() {
			return errors.New("policies not loaded yet")
		}
		return nil
	})
	mux := http.NewServeMux()
	probes.Mount(mux, reg)
	server.Mount(mux)

	// Envoy's rate-limit service has a listener of its own (docs/gateways.md), opened before
	// anything runs so that a taken port fails the start.
	var grpcServe func(context.Context) error
	if cfg.RLS.Addr != "" {
		lis, gs, health, err := grpcListener(cfg, server, reg)
		if err != nil {
			return err
		}
		defer lis.Close() // closed by the server once it serves; this covers an early return
		log.Info("grpc listening", "addr", lis.Addr().String())
		grpcServe = func(ctx context.Context) error {
			return server.ServeGRPC(ctx, lis, gs, health, cfg.Server.ShutdownTimeout)
		}
	}

	g, ctx := errgroup.WithContext(ctx)
	if a.Relay {
		relay, marker, closeRelay, err := newRelay(cfg, log, reg, recorder)
		if err != nil {
			return err
		}
		defer closeRelay()
		probes.AddDegraded("outbox", outboxCheck(relay, a.OutboxMaxAge))
		g.Go(func() error { return relay.Run(ctx) })
		if marker != nil {
			g.Go(func() error { return marker.Run(ctx) })
		}
	}
	g.Go(func() error { return cache.Run(ctx) })
	// HTTP_WRITE_TIMEOUT outlasts ADMIT_MAX_WAIT (config.Admit.Validate), so a request may wait
	// for capacity; at shutdown, waiters still held after SHUTDOWN_TIMEOUT are cut (docs/config.md).
	g.Go(func() error { return ops.Serve(ctx, log, cfg.Server.HTTP(), mux) })
	if grpcServe != nil {
		g.Go(func() error { return grpcServe(ctx) })
	}
	// Admission does not wait for Kafka (the outbox absorbs an outage), so the topic is
	// made sure of in the background, retrying until the broker answers.
	g.Go(func() error {
		_ = topic.EnsureRetry(ctx, log, cfg.Kafka.Brokers, cfg.Kafka.Spec()) // ends only with ctx
		return nil
	})
	err = g.Wait()
	// The HTTP server has stopped: no request is voided any more. Voids Redis has not taken
	// yet go straight to Kafka (the recorder is closed after this).
	cctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout)
	defer cancel()
	if cerr := server.Close(cctx); cerr != nil {
		log.Error("voids still pending at shutdown", "err", cerr)
	}
	return err
}

// grpcListener opens the gRPC listener, at most ADMIT_GRPC_MAX_CONNS connections at once,
// and builds the server with the listener's limits: streams, message and metadata sizes,
// handshake, idle, age and keepalive bounds, and the service token for every streaming
// call (health Watch, reflection), ADMIT_GRPC_MAX_HELD_STREAMS of them at once. Unary
// calls are not concerned: health Check stays open to orchestrators, ShouldRateLimit
// checks the token itself.
func grpcListener(cfg config.Admit, server *api.Server, reg prometheus.Registerer) (net.Listener, *grpc.Server, *health.Server, error) {
	guard, err := ops.StreamGuard(cfg.Admission.ServiceToken, cfg.RLS.MaxHeldStreams)
	if err != nil {
		return nil, nil, nil, err
	}
	opts := append(cfg.GRPC().ServerOptions(), grpc.ChainStreamInterceptor(guard))
	gs, hs, err := server.NewGRPCServer(rlsMapping(cfg.RLS), opts...)
	if err != nil {
		return nil, nil, nil, err
	}
	lis, err := net.Listen("tcp", cfg.RLS.Addr)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("ADMIT_GRPC_ADDR: %w", err)
	}
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "metergate_grpc_connections_refused_total",
		Help: "gRPC connections closed when accepted because ADMIT_GRPC_MAX_CONNS were open.",
	})
	reg.MustRegister(refused)
	return ops.LimitListener(lis, cfg.RLS.Limits.MaxConns, refused), gs, hs, nil
}

// rlsMapping is the descriptor mapping of Envoy's rate-limit service as configured.
func rlsMapping(c config.RLS) api.RLS {
	return api.RLS{APIKey: c.APIKey, Account: c.Account, Tool: c.Tool, IdempotencyKey: c.IdempotencyKey,
		Event: c.Event, Status: c.Status, Unit: c.Unit, Hits: policy.Unit(c.Hits), Ignore: c.Ignore}
}

// runRelay runs the outbox relay alone, for deployments that scale it apart from the API.
func runRelay(ctx context.Context, cfg config.Admit, log *slog.Logger) error {
	reg := ops.NewRegistry()
	w := outbox.NewWriter(cfg.Kafka.Brokers, cfg.Kafka.Topic)
	defer w.Close()
	relay, marker, closeRelay, err := newRelay(cfg, log, reg, w)
	if err != nil {
		return err
	}
	defer closeRelay()
	probes := &ops.Probes{}
	probes.AddDegraded("outbox", outboxCheck(relay, cfg.Admission.OutboxMaxAge))
	mux := http.NewServeMux()
	probes.Mount(mux, reg)

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return relay.Run(ctx) })
	if marker != nil {
		g.Go(func() error { return marker.Run(ctx) })
	}
	g.Go(func() error { return ops.Serve(ctx, log, cfg.Server.HTTP(), mux) })
	g.Go(func() error {
		_ = topic.EnsureRetry(ctx, log, cfg.Kafka.Brokers, cfg.Kafka.Spec()) // ends only with ctx
		return nil
	})
	return g.Wait()
}

// newRelay builds the relay producing through w, with a Redis client of its own: every
// outbox stream (two per shard: Keys.Outboxes) blocks one connection while it waits for
// entries, which must not starve the decisions' pool. Beside it, unless the billing log
// is off (ADMIT_IDEMPOTENCY_HOT=0), the idempotency janitor, which moves the shards' marks
// as the meters commit what the relays produced (nil when off).
func newRelay(cfg config.Admit, log *slog.Logger, reg prometheus.Registerer, w *outbox.Writer) (*outbox.Relay, *outbox.Marker, func(), error) {
	a := cfg.Admission
	rdb, err := cfg.Redis.OpenPool(2*a.Shards + 4)
	if err != nil {
		return nil, nil, nil, err
	}
	keys := keyspace.Keys{Prefix: a.KeyPrefix, Shards: a.Shards}
	relay := outbox.NewRelay(rdb, w, outbox.RelayOptions{
		Keys: keys, Consumer: a.Node,
		Batch: a.RelayBatch, ClaimAfter: a.RelayClaimAfter, Log: log.With("component", "relay"), Registerer: reg,
		WaitReplicas: a.WaitReplicas, WaitTimeout: a.WaitTimeout,
	})
	var marker *outbox.Marker
	if a.IdempotencyHot > 0 {
		marker = outbox.NewMarker(rdb, outbox.MarkOptions{
			Keys: keys, Hot: a.IdempotencyHot, TTL: a.IdempotencyTTL, Every: a.IdempotencyMarkEvery,
			Brokers: cfg.Kafka.Brokers, Topic: cfg.Kafka.Topic, Group: a.MeterGroup,
			Log: log.With("component", "idempotency"), Registerer: reg,
		})
	}
	return relay, marker, func() { _ = rdb.Close() }, nil
}

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
