// Command meter consumes usage events from Kafka as a consumer group and writes one exact
// row per event into PostgreSQL, committing Kafka offsets only after the rows are committed
// (internal/meter). On SIGTERM it writes the batches in hand, commits their offsets and exits 0.
// Unless METER_WEBHOOKS=false it also delivers the usage alerts it records to the webhook
// endpoints (internal/webhook), beside any other meter.
//
// Configuration comes from environment variables, each mirrored by a flag (meter -h lists
// them); -validate checks it and exits; -migrate applies pending database migrations first.
package main

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"

	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/meter"
	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/topic"
	"github.com/metergate/metergate/internal/webhook"
)

// failpoint is called at internal/meter's failpoints. It is nil in the command; a test build of
// it sets it (failpoint_test.go), for the chaos suite to kill the meter between a batch's
// rows and its offsets.
var failpoint func(point string) error

func main() {
	var cfg config.Meter
	config.LoadOrExit(&cfg, "meter", os.Args[1:])
	log := cfg.Log.Logger(os.Stderr).With("service", "meter")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("meter failed", "err", err)
		os.Exit(1)
	}
}

// run consumes the topic into PostgreSQL and, unless METER_WEBHOOKS=false, delivers the
// webhooks, until ctx ends.
func run(ctx context.Context, cfg config.Meter, log *slog.Logger) error {
	pool, err := cfg.Postgres.OpenMigrated(ctx, cfg.Migrate, log)
	if err != nil {
		return err
	}
	defer pool.Close()

	kc := &kafka.Client{Addr: kafka.TCP(cfg.Kafka.Brokers...), Timeout: 5 * time.Second}
	probes := &ops.Probes{}
	probes.Add("postgres", pool.Ping)
	probes.Add("kafka", func(ctx context.Context) error {
		_, err := kc.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{cfg.Kafka.Topic}})
		return err
	})
	reg := ops.NewRegistry()
	mux := http.NewServeMux()
	probes.Mount(mux, reg)

	m, err := meter.New(pool, cfg.MeterOptions(meter.Options{
		Logger: log.With("component", "meter"), Registerer: reg, Failpoint: failpoint}))
	if err != nil {
		return err
	}
	var deliverer *webhook.Deliverer
	if cfg.DeliverWebhooks {
		deliverer = webhook.NewDeliverer(pool, cfg.Webhooks.DelivererOptions(webhook.DelivererOptions{
			Logger: log.With("component", "webhooks"), Registerer: reg}))
		probes.Add("webhooks", deliverer.Ready)
	}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Serve(ctx, log, cfg.Server.HTTP(), mux) })
	if deliverer != nil {
		// Run ends when ctx does, once the attempts in flight are recorded.
		g.Go(func() error { return deliverer.Run(ctx) })
	}
	// The meter reads once the topic is there. Run ends when ctx does, after writing the
	// batches in hand and committing their offsets.
	g.Go(topic.EnsureThen(ctx, log, cfg.Kafka.Brokers, cfg.Kafka.Spec(), m.Run))
	return g.Wait()
}
