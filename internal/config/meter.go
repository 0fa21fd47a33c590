package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/metergate/metergate/internal/meter"
	"github.com/metergate/metergate/internal/webhook"
)

// Meter is the configuration of cmd/meter.
type Meter struct {
	Server   Server
	Log      Log
	Postgres Postgres
	Kafka    Kafka
	// Group is the Kafka consumer group of the meters.
	Group string
	// BatchSize is the most messages written per PostgreSQL transaction; BatchWait how long
	// a batch waits to fill once its first message is in.
	BatchSize int
	BatchWait time.Duration
	// SessionTimeout is how long the group waits for a silent meter before giving its
	// partitions to the others.
	SessionTimeout time.Duration
	// DeliverWebhooks runs the webhook deliverer in the meter (METER_WEBHOOKS).
	DeliverWebhooks bool
	Webhooks        Webhooks
	Migrate         bool
}

// Webhooks is how webhook targets are guarded (admit and meter) and deliveries retried
// (meter's deliverer, internal/webhook).
type Webhooks struct {
	AllowPrivate bool
	Timeout      time.Duration
	Poll         time.Duration
	Concurrency  int
	BackoffBase  time.Duration
	BackoffCap   time.Duration
	RetryFor     time.Duration
	DisableAfter int
}

func (c *Webhooks) registerAllowPrivate(l *Loader) {
	l.Bool(&c.AllowPrivate, "WEBHOOK_ALLOW_PRIVATE", false, "let webhook endpoints be loopback, private or link-local addresses (tests, private deployments)")
}

// Register adds the WEBHOOK_* settings of the deliverer.
func (c *Webhooks) Register(l *Loader) {
	c.registerAllowPrivate(l)
	l.Duration(&c.Timeout, "WEBHOOK_TIMEOUT", webhook.DefaultTimeout, "bound of one delivery attempt, connection to the end of the reply")
	l.Duration(&c.Poll, "WEBHOOK_POLL", webhook.DefaultPoll, "how often due deliveries are looked for (a queued alert wakes the deliverer sooner through LISTEN/NOTIFY)")
	l.Int(&c.Concurrency, "WEBHOOK_CONCURRENCY", webhook.DefaultConcurrency, "most delivery attempts in flight per meter")
	l.Duration(&c.BackoffBase, "WEBHOOK_BACKOFF_BASE", webhook.DefaultBackoffBase, "retry n waits a random time up to min(WEBHOOK_BACKOFF_CAP, base·2^(n-1))")
	l.Duration(&c.BackoffCap, "WEBHOOK_BACKOFF_CAP", webhook.DefaultBackoffCap, "longest wait between two attempts of a delivery")
	l.Duration(&c.RetryFor, "WEBHOOK_RETRY_FOR", webhook.DefaultRetryFor, "how long after its first attempt a delivery is retried before it is failed")
	l.Int(&c.DisableAfter, "WEBHOOK_DISABLE_AFTER", webhook.DefaultDisableAfter, "failed attempts in a row, across an endpoint's deliveries, that disable it")
}

// Validate reports every bad deliverer setting.
func (c Webhooks) Validate() error {
	var errs []error
	for name, d := range map[string]time.Duration{"WEBHOOK_TIMEOUT": c.Timeout, "WEBHOOK_POLL": c.Poll,
		"WEBHOOK_BACKOFF_BASE": c.BackoffBase, "WEBHOOK_BACKOFF_CAP": c.BackoffCap, "WEBHOOK_RETRY_FOR": c.RetryFor} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%s: want more than 0", name, d))
		}
	}
	if c.BackoffCap < c.BackoffBase {
		errs = append(errs, fmt.Errorf("WEBHOOK_BACKOFF_CAP=%s: want at least WEBHOOK_BACKOFF_BASE (%s)", c.BackoffCap, c.BackoffBase))
	}
	if c.Concurrency < 1 || c.Concurrency > 1024 {
		errs = append(errs, fmt.Errorf("WEBHOOK_CONCURRENCY=%d: want 1-1024", c.Concurrency))
	}
	if c.DisableAfter < 1 {
		errs = append(errs, fmt.Errorf("WEBHOOK_DISABLE_AFTER=%d: want at least 1", c.DisableAfter))
	}
	return prefix("webhooks", errs)
}

// Register adds every setting of meter to l.
func (c *Meter) Register(l *Loader) {
	c.Server.register(l, "METER_ADDR", "127.0.0.1:8081")
	c.Log.Register(l)
	c.Postgres.Register(l)
	c.Kafka.Register(l)
	registerMeterGroup(l, &c.Group)
	l.Int(&c.BatchSize, "METER_BATCH_SIZE", meter.DefaultBatchSize, "most messages per batch (one PostgreSQL transaction, then one offset commit)")
	l.Duration(&c.BatchWait, "METER_BATCH_WAIT", meter.DefaultBatchWait, "how long a batch waits to fill once its first message is in")
	l.Duration(&c.SessionTimeout, "METER_SESSION_TIMEOUT", meter.DefaultSessionTimeout, "how long the consumer group waits for a silent meter before giving its partitions to the others (within the broker's group.min/max.session.timeout.ms)")
	l.Bool(&c.DeliverWebhooks, "METER_WEBHOOKS", true, "run the webhook deliverer in this process (docs/webhooks.md)")
	c.Webhooks.Register(l)
	l.Bool(&c.Migrate, "MIGRATE", false, "apply pending database migrations at start")
}

// Validate reports every problem of the configuration, one per line, prefixed by section.
func (c Meter) Validate() error {
	var errs []error
	if c.Group == "" {
		errs = append(errs, errors.New("METER_GROUP: must not be empty"))
	}
	if c.BatchSize < 1 || c.BatchSize > 100000 {
		errs = append(errs, fmt.Errorf("METER_BATCH_SIZE=%d: want 1-100000", c.BatchSize))
	}
	if c.BatchWait <= 0 || c.BatchWait > time.Minute {
		errs = append(errs, fmt.Errorf("METER_BATCH_WAIT=%s: want more than 0 and at most 1m", c.BatchWait))
	}
	if c.SessionTimeout < time.Second || c.SessionTimeout > 30*time.Minute {
		errs = append(errs, fmt.Errorf("METER_SESSION_TIMEOUT=%s: want 1s-30m", c.SessionTimeout))
	}
	return errors.Join(c.Server.Validate(), c.Log.Validate(), c.Postgres.Validate(), c.Kafka.Validate(), prefix("meter", errs), c.Webhooks.Validate())
}

// MeterOptions returns o, which carries the meter's logger, registerer and failpoint, with
// the meter's settings: a shutdown writes the batch in hand within SHUTDOWN_TIMEOUT.
func (c Meter) MeterOptions(o meter.Options) meter.Options {
	o.Brokers, o.Topic, o.Group = c.Kafka.Brokers, c.Kafka.Topic, c.Group
	o.BatchSize, o.BatchWait, o.SessionTimeout = c.BatchSize, c.BatchWait, c.SessionTimeout
	o.FlushTimeout = c.Server.ShutdownTimeout
	return o
}

// DelivererOptions returns o, which carries the deliverer's logger and registerer, with
// the delivery settings. An endpoint that answers 410 Gone is disabled at once.
func (c Webhooks) DelivererOptions(o webhook.DelivererOptions) webhook.DelivererOptions {
	o.AllowPrivate, o.Timeout, o.Poll, o.Concurrency = c.AllowPrivate, c.Timeout, c.Poll, c.Concurrency
	o.BackoffBase, o.BackoffCap, o.RetryFor = c.BackoffBase, c.BackoffCap, c.RetryFor
	o.DisableAfter, o.DisableOnGone = c.DisableAfter, true
	return o
}
