package webhook

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

var (
	//go:embed sql/claim.sql
	claimSQL string
	//go:embed sql/replay_range.sql
	replayRangeSQL string
	//go:embed sql/delivery_stats.sql
	deliveryStatsSQL string
)

// The queries of an attempt's record.
var (
	//go:embed sql/insert_attempt.sql
	insertAttemptSQL string
	//go:embed sql/mark_delivered.sql
	markDeliveredSQL string
	//go:embed sql/reset_failures.sql
	resetFailuresSQL string
	//go:embed sql/mark_attempt_failed.sql
	markAttemptFailedSQL string
	//go:embed sql/count_failure.sql
	countFailureSQL string
	//go:embed sql/disable_endpoint.sql
	disableEndpointSQL string
)

// The deliverer's defaults (DelivererOptions).
const (
	// DefaultTimeout bounds one delivery attempt.
	DefaultTimeout = 10 * time.Second
	// DefaultPoll is how often due deliveries are looked for.
	DefaultPoll = time.Second
	// DefaultConcurrency is the most attempts in flight.
	DefaultConcurrency = 8
	// DefaultBackoffBase and DefaultBackoffCap bound the delay before a retry.
	DefaultBackoffBase = 5 * time.Second
	DefaultBackoffCap  = time.Hour
	// DefaultRetryFor is how long after its first attempt a delivery is retried.
	DefaultRetryFor = 24 * time.Hour
	// DefaultDisableAfter is the run of failed attempts that disables an endpoint.
	DefaultDisableAfter = 50
)

// DelivererOptions configure a Deliverer; zero values take the defaults.
type DelivererOptions struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// AllowPrivate lets deliveries reach loopback, private and link-local addresses.
	AllowPrivate bool
	// Timeout bounds one attempt (10s); a delivery's lease is Timeout + LeaseMargin (5s).
	Timeout     time.Duration
	LeaseMargin time.Duration
	// Poll is how often due deliveries are looked for (1s); LISTEN/NOTIFY wakes the
	// deliverer sooner when a delivery is queued, unless NoListen.
	Poll     time.Duration
	NoListen bool
	// Concurrency is the most attempts in flight (8).
	Concurrency int
	// The delay before retry n (n ≥ 1) is uniform in [0, min(BackoffCap, BackoffBase·2^(n-1))]
	// ("full jitter"); 5s and 1h.
	BackoffBase time.Duration
	BackoffCap  time.Duration
	// RetryFor is how long after its first attempt a delivery is retried (24h); the first
	// failed attempt past it makes it failed.
	RetryFor time.Duration
	// DisableAfter is the run of failed attempts across an endpoint's deliveries that
	// disables it (50); a delivered attempt resets the run.
	DisableAfter int
	// DisableOnGone disables an endpoint at once when it answers 410 Gone.
	DisableOnGone bool
	// UserAgent of every attempt ("metergate-webhooks/1").
	UserAgent string
}

func (o *DelivererOptions) defaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	set := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	set(&o.Timeout, DefaultTimeout)
	set(&o.LeaseMargin, 5*time.Second)
	set(&o.Poll, DefaultPoll)
	set(&o.BackoffBase, DefaultBackoffBase)
	set(&o.BackoffCap, DefaultBackoffCap)
	set(&o.RetryFor, DefaultRetryFor)
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.DisableAfter <= 0 {
		o.DisableAfter = DefaultDisableAfter
	}
	if o.UserAgent == "" {
		o.UserAgent = "metergate-webhooks/1"
	}
}

// Deliverer POSTs due deliveries. Several may run on one database: a delivery is claimed
// with FOR UPDATE SKIP LOCKED and a lease in a short transaction, POSTed outside any
// transaction, and its attempt recorded after; a deliverer killed in between leaves a
// lease that lapses, and the delivery is attempted again, with the same webhook-id.
type Deliverer struct {
	pool    *pgxpool.Pool
	opt     DelivererOptions
	client  *Client
	metrics *metrics

	mu      sync.Mutex
	lastErr error
	stats   time.Time // when the gauges were last refreshed
}

var errNotStarted = errors.New("webhook deliverer has not polled yet")

// NewDeliverer returns a deliverer over pool (migrated).
func NewDeliverer(pool *pgxpool.Pool, o DelivererOptions) *Deliverer {
	o.defaults()
	return &Deliverer{pool: pool, opt: o, lastErr: errNotStarted, metrics: newMetrics(o.Registerer),
		client: NewClient(Options{AllowPrivate: o.AllowPrivate, Timeout: o.Timeout})}
}

// Ready reports the last poll's error: nil once the deliverer reads due deliveries.
func (d *Deliverer) Ready(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastErr
}

// job is a claimed delivery.
type job struct {
	id       int64
	endpoint string
	event    string // the webhook-id
	attempts int
	lease    time.Time
	first    time.Time
	now      time.Time // the database's, at the claim
	url      string
	payload  string
	secrets  []string
}

// Run delivers until ctx ends; attempts in flight then finish (within Timeout) and are
// recorded.
func (d *Deliverer) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	if !d.opt.NoListen {
		wg.Add(1)
		go func() { defer wg.Done(); d.listen(ctx, signal) }()
	}
	slots := make(chan struct{}, d.opt.Concurrency)
	for {
		free := cap(slots) - len(slots)
		var jobs []job
		if free > 0 {
			var err error
			jobs, err = d.claim(ctx, free)
			if ctx.Err() != nil {
				return nil
			}
			d.setErr(err)
			if err != nil {
				d.opt.Logger.Warn("claim webhook deliveries", "err", err)
			}
			for _, j := range jobs {
				slots <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					// An attempt in flight at shutdown finishes and is recorded.
					d.attempt(context.WithoutCancel(ctx), j)
					<-slots
					signal()
				}()
			}
			d.refreshGauges(ctx)
		}
		if free > 0 && len(jobs) == free {
			continue // more may be due
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-time.After(d.opt.Poll):
		}
	}
}

func (d *Deliverer) setErr(err error) {
	d.mu.Lock()
	d.lastErr = err
	d.mu.Unlock()
}

// listen wakes the loop on every NOTIFY webhook_deliveries (a queued delivery), on a
// connection of its own; on errors it reconnects after a poll interval.
func (d *Deliverer) listen(ctx context.Context, wake func()) {
	for ctx.Err() == nil {
		err := func() error {
			conn, err := pgx.ConnectConfig(ctx, d.pool.Config().ConnConfig.Copy())
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			if _, err := conn.Exec(ctx, "listen webhook_deliveries"); err != nil {
				return err
			}
			for {
				if _, err := conn.WaitForNotification(ctx); err != nil {
					return err
				}
				wake()
			}
		}()
		if ctx.Err() != nil {
			return
		}
		d.opt.Logger.Warn("listen for webhook deliveries; polling meanwhile", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(d.opt.Poll):
		}
	}
}

func (d *Deliverer) claim(ctx context.Context, limit int) ([]job, error) {
	lease := (d.opt.Timeout + d.opt.LeaseMargin).Seconds()
	rows, err := d.pool.Query(ctx, claimSQL, pgx.StrictNamedArgs{"limit": limit, "lease_s": lease})
	if err != nil {
		return nil, fmt.Errorf("claim webhook deliveries: %w", err)
	}
	jobs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (job, error) {
		var j job
		err := row.Scan(&j.id, &j.endpoint, &j.event, &j.attempts, &j.lease, &j.first, &j.now, &j.url, &j.payload, &j.secrets)
		return j, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim webhook deliveries: %w", err)
	}
	return jobs, nil
}

// result is what an attempt came to.
type result struct {
	started time.Time
	latency time.Duration
	status  *int
	err     string
}

func (r result) delivered() bool { return r.status != nil && *r.status >= 200 && *r.status < 300 }

// label is the metric's result label.
func (r result) label() string {
	switch {
	case r.delivered():
		return "delivered"
	case r.status != nil:
		return "http_error"
	default:
		return "error"
	}
}

func (d *Deliverer) attempt(ctx context.Context, j job) {
	res := d.post(ctx, j)
	d.metrics.attempts.WithLabelValues(res.label()).Inc()
	d.metrics.latency.Observe(res.latency.Seconds())
	if err := d.record(ctx, j, res); err != nil {
		// The lease lapses and the delivery is attempted again.
		d.opt.Logger.Error("record webhook attempt", "delivery", j.id, "err", err)
	}
}

func (d *Deliverer) post(ctx context.Context, j job) result {
	started := time.Now()
	body := []byte(j.payload)
	h, err := Sign(j.event, started, body, j.secrets...)
	if err != nil {
		return result{started: started, err: err.Error()}
	}
	h.Set("User-Agent", d.opt.UserAgent)
	ctx, cancel := context.WithTimeout(ctx, d.opt.Timeout)
	defer cancel()
	reply, err := d.client.Post(ctx, j.url, h, body)
	res := result{started: started, latency: time.Since(started)}
	if err != nil {
		res.err = err.Error()
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
			res.err = fmt.Sprintf("timeout after %s: %s", d.opt.Timeout, err)
		}
		if errors.Is(err, ErrForbiddenTarget) {
			d.opt.Logger.Warn("webhook target refused", "endpoint", j.endpoint, "delivery", j.id, "err", err)
		}
		return res
	}
	res.status = &reply.Status
	if !res.delivered() {
		res.err = fmt.Sprintf("HTTP %d %s", reply.Status, http.StatusText(reply.Status))
		if len(reply.Body) > 0 {
			res.err += ": " + clip(reply.Body, 200)
		}
	}
	return res
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// backoff is the delay after failed attempt n (1 = the first): full jitter over an
// exponential ceiling.
func (d *Deliverer) backoff(n int) time.Duration {
	ceiling := d.opt.BackoffCap
	if n-1 < 40 {
		ceiling = min(ceiling, d.opt.BackoffBase<<(n-1))
	}
	if ceiling <= 0 {
		ceiling = d.opt.BackoffCap
	}
	return rand.N(ceiling + 1) //nolint:gosec // jitter, not a secret
}

// record logs the attempt and moves the delivery and its endpoint on, in one transaction.
// The delivery's state changes only if this deliverer still holds its lease (a replay, or
// another deliverer after the lease lapsed, took it over); the attempt is logged anyway.
func (d *Deliverer) record(ctx context.Context, j job, res result) error {
	outcome := StatusFailed
	if res.delivered() {
		outcome = StatusDelivered
	}
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insertAttemptSQL, pgx.StrictNamedArgs{
			"delivery": j.id, "started_at": res.started, "latency_us": res.latency.Microseconds(),
			"http_status": res.status, "error": nullable(res.err), "outcome": outcome,
		}); err != nil {
			return fmt.Errorf("insert webhook attempt: %w", err)
		}
		if res.delivered() {
			if _, err := tx.Exec(ctx, markDeliveredSQL,
				pgx.StrictNamedArgs{"id": j.id, "lease_until": j.lease, "last_status": res.status}); err != nil {
				return fmt.Errorf("mark webhook delivered: %w", err)
			}
			if _, err := tx.Exec(ctx, resetFailuresSQL, pgx.StrictNamedArgs{"id": j.endpoint}); err != nil {
				return fmt.Errorf("reset webhook failures: %w", err)
			}
			return nil
		}
		status, delay := StatusPending, d.backoff(j.attempts+1)
		if j.now.Sub(j.first) >= d.opt.RetryFor {
			status = StatusFailed
		}
		if _, err := tx.Exec(ctx, markAttemptFailedSQL, pgx.StrictNamedArgs{
			"id": j.id, "lease_until": j.lease, "status": status, "delay_s": delay.Seconds(),
			"last_status": res.status, "last_error": res.err,
		}); err != nil {
			return fmt.Errorf("mark webhook attempt failed: %w", err)
		}
		var run int
		var enabled bool
		if err := tx.QueryRow(ctx, countFailureSQL, pgx.StrictNamedArgs{"id": j.endpoint}).Scan(&run, &enabled); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // deleted meanwhile
			}
			return fmt.Errorf("count webhook failures: %w", err)
		}
		reason := ""
		switch {
		case !enabled:
		case d.opt.DisableOnGone && res.status != nil && *res.status == http.StatusGone:
			reason = "the endpoint answered 410 Gone"
		case run >= d.opt.DisableAfter:
			reason = fmt.Sprintf("%d consecutive failed attempts (last: %s)", run, clip([]byte(res.err), 300))
		}
		if reason == "" {
			return nil
		}
		if _, err := tx.Exec(ctx, disableEndpointSQL, pgx.StrictNamedArgs{"id": j.endpoint, "reason": reason}); err != nil {
			return fmt.Errorf("disable webhook endpoint: %w", err)
		}
		d.metrics.disabled.Inc()
		d.opt.Logger.Warn("webhook endpoint disabled", "endpoint", j.endpoint, "reason", reason)
		return nil
	})
}

// statsEvery bounds how often the gauges query the database.
const statsEvery = 5 * time.Second

func (d *Deliverer) refreshGauges(ctx context.Context) {
	d.mu.Lock()
	due := time.Since(d.stats) >= statsEvery
	if due {
		d.stats = time.Now()
	}
	d.mu.Unlock()
	if !due {
		return
	}
	var pending, disabled int64
	var oldest float64
	err := d.pool.QueryRow(ctx, deliveryStatsSQL).Scan(&pending, &oldest, &disabled)
	if err != nil {
		return
	}
	d.metrics.pending.Set(float64(pending))
	d.metrics.oldestDue.Set(oldest)
	d.metrics.endpointsDisabled.Set(float64(disabled))
}
