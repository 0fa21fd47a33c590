// Command admit is metergate's admission service: APIs call it synchronously on every
// request for an allow / deny decision against hierarchical limits, and it records every
// admitted request in a Redis Stream outbox that its relay moves to Kafka.
//
//	admit [serve] [flags]  serve the API, and relay the outbox to Kafka (unless ADMIT_RELAY=false)
//	admit relay [flags]    relay the outbox to Kafka only (with /healthz, /readyz, /metrics)
//	admit staff -create NAME -role ROLE | -revoke ID | -list
//	                       add (its token printed once), revoke or list staff members
//	admit help [command]   list the commands, or a command's flags
//
// Configuration comes from environment variables, each mirrored by a flag (admit -h lists
// them); -validate checks it and exits; -migrate applies pending database migrations first.
// An unknown command exits 2.
package main

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/billinglog"
	"github.com/metergate/metergate/internal/cli"
	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/console"
	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/gate"
	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/refusals"
	"github.com/metergate/metergate/internal/staff"
	"github.com/metergate/metergate/internal/topic"
	"github.com/metergate/metergate/internal/webhook"
)

func main() {
	cli.Main("admit", os.Args[1:],
		command("serve", "serve the API, and relay the outbox to Kafka unless ADMIT_RELAY=false", run),
		command("relay", "relay the outbox to Kafka only (with /healthz, /readyz, /metrics)", runRelay),
		staffCommand,
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

// run serves the API (and Envoy's rate-limit service when ADMIT_GRPC_ADDR is set) and, unless
// ADMIT_RELAY=false, relays the outbox, until ctx ends.
func run(ctx context.Context, cfg config.Admit, log *slog.Logger) error {
	rdb, err := cfg.Redis.Open()
	if err != nil {
		return err
	}
	defer rdb.Close()
	pool, err := cfg.Postgres.OpenMigrated(ctx, cfg.Migrate, log)
	if err != nil {
		return err
	}
	defer pool.Close()

	reg := ops.NewRegistry()
	cache := policy.NewCache(pool, log, cfg.Admission.PolicyReload)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "metergate_policy_accounts",
		Help: "Accounts in this node's policy cache (0 until the first load)."}, func() float64 { return float64(cache.Len()) }))
	// Past the hot window, idempotency keys are answered from the billing log
	// (docs/admission.md, "Idempotency"); ADMIT_IDEMPOTENCY_HOT=0 keeps every record in Redis.
	admitter := admission.New(rdb, cfg.Admission.AdmitterOptions(admission.Options{
		IdempotencyLog: billinglog.New(pool, billinglog.Options{}), Registerer: reg}))
	// Deferred, so it runs once the HTTP server has stopped: a request still waiting for
	// capacity is woken through the queue channel until then.
	defer admitter.Close()
	recorder := cfg.Kafka.Writer()
	defer recorder.Close()
	staffStore, credits := staff.NewStore(pool), credit.NewStore(pool, rdb, admitter.Keys(), nil)
	// The refusal log (docs/admission.md): what the console shows of refused requests.
	var refusalLog *refusals.Log
	if cfg.Refusals.Enabled {
		refusalLog = refusals.New(rdb, admitter.Keys(), cfg.Refusals.Options(refusals.Options{
			Log: log.With("component", "refusals"), Registerer: reg}))
	}
	customers := customer.NewStore(pool)
	server := api.New(cfg.Portal.APIConfig(cfg.Admission.APIConfig(api.Config{
		Log: log, Policies: cache, Admin: policy.NewStore(pool), Decider: admitter, Recorder: recorder, Registerer: reg,
		Credits: credits, Webhooks: webhook.NewStore(pool, cfg.Webhooks.AllowPrivate),
		Invoices: api.InvoiceStore{Pool: pool, Issuer: cfg.Issuer()}, Usage: api.UsageOf{Pool: pool},
		Staff: staffStore, Customers: customers, Refusals: gateRefusals(refusalLog),
	})))
	probes := readiness(rdb, pool, cache)
	mux := http.NewServeMux()
	probes.Mount(mux, reg)
	server.Mount(mux)
	var con *console.Console
	if cfg.Console.Enabled {
		con = console.New(cfg.Console.ConsoleConfig(console.Config{Log: log, API: server, Staff: staffStore,
			AdminToken: cfg.Admission.AdminToken, Pool: pool, Policies: cache, Counters: admitter, Metrics: reg,
			Refusals: consoleRefusals(refusalLog), Balances: credits}))
		con.Mount(mux)
	}
	if cfg.Portal.Enabled {
		// The customer portal (docs/portal.md): its pages read the customer API in process.
		console.NewPortal(cfg.Portal.PortalConfig(console.PortalConfig{Log: log, API: server, Sessions: customers},
			cfg.Console.InsecureCookies)).Mount(mux)
	}
	// Envoy's rate-limit service has a listener of its own (docs/gateways.md), opened before
	// anything runs so that a taken port fails the start.
	serveGRPC, closeGRPC, err := listenGRPC(cfg, log, server, reg)
	if err != nil {
		return err
	}
	defer closeGRPC()

	g, ctx := errgroup.WithContext(ctx)
	if cfg.Admission.Relay {
		r, err := newRelay(cfg, log, reg, recorder)
		if err != nil {
			return err
		}
		defer r.Close()
		r.start(ctx, g, probes, cfg.Admission.OutboxMaxAge)
	}
	g.Go(func() error { return cache.Run(ctx) })
	if con != nil {
		g.Go(func() error { return con.Sample(ctx) })
	}
	// HTTP_WRITE_TIMEOUT outlasts ADMIT_MAX_WAIT (config.Admit.Validate), so a request may wait
	// for capacity; at shutdown, waiters still held after SHUTDOWN_TIMEOUT are cut (docs/config.md).
	g.Go(func() error { return ops.Serve(ctx, log, cfg.Server.HTTP(), mux) })
	if serveGRPC != nil {
		g.Go(func() error { return serveGRPC(ctx) })
	}
	// Admission does not wait for Kafka (the outbox absorbs an outage), so the topic is
	// made sure of in the background, retrying until the broker answers.
	g.Go(topic.EnsureThen(ctx, log, cfg.Kafka.Brokers, cfg.Kafka.Spec(), nil))
	err = g.Wait()
	// The HTTP server has stopped: no request is voided any more. Voids Redis has not taken
	// yet go straight to Kafka (the recorder is closed after this).
	cctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout)
	defer cancel()
	if cerr := server.Close(cctx); cerr != nil {
		log.Error("voids still pending at shutdown", "err", cerr)
	}
	if refusalLog != nil {
		if cerr := refusalLog.Close(cctx); cerr != nil {
			log.Warn("refusal log: refusals still queued at shutdown were dropped", "err", cerr)
		}
	}
	return err
}

// gateRefusals and consoleRefusals are the refusal log as the API and the console take
// it: nil when it is off (a nil *refusals.Log in an interface would not be nil).
func gateRefusals(l *refusals.Log) gate.Refusals {
	if l == nil {
		return nil
	}
	return l
}

func consoleRefusals(l *refusals.Log) console.Refusals {
	if l == nil {
		return nil
	}
	return l
}
