package webhook

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/policy"
)

// The event types an endpoint may take, by the short names endpoints use: the CloudEvents
// type's suffix after "io.metergate.". Migration 00023 checks the same list.
const (
	// EventThreshold is a usage alert's (usage_alerts).
	EventThreshold = "usage.threshold.v1"
	// EventInvoiceIssued, EventInvoiceStatusChanged and EventCreditNoteIssued are the
	// billing events' (billing_events), written by the invoice code, which names them.
	EventInvoiceIssued        = invoice.EventInvoiceIssued
	EventInvoiceStatusChanged = invoice.EventInvoiceStatusChanged
	EventCreditNoteIssued     = invoice.EventCreditNoteIssued
)

// EventTypes are the event types an endpoint may take.
var EventTypes = []string{EventThreshold, EventInvoiceIssued, EventInvoiceStatusChanged, EventCreditNoteIssued}

// Limits of an endpoint.
const (
	MaxURL = 2048
	// DefaultOverlap is how long a rotated secret keeps signing beside the new one.
	DefaultOverlap = 24 * time.Hour
	// MaxOverlap bounds a rotation's overlap.
	MaxOverlap = 30 * 24 * time.Hour
)

// Delivery statuses.
const (
	StatusPending   = "pending"
	StatusDelivered = "delivered"
	StatusFailed    = "failed"
)

// Errors of the store.
var (
	ErrNotFound = errors.New("webhook endpoint or delivery not found")
	// ErrUnknownAccount: an endpoint's account filter names no account.
	ErrUnknownAccount = errors.New("unknown account")
)

// InvalidError is returned for every input the store refuses; nothing is written.
type InvalidError struct {
	Field   string // url, event_types, account, overlap, range
	Message string
}

// Error returns "field: message".
func (e *InvalidError) Error() string { return e.Field + ": " + e.Message }

func invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Endpoint is a webhook endpoint as stored.
type Endpoint struct {
	ID                  string    `json:"id"`
	URL                 string    `json:"url"`
	EventTypes          []string  `json:"event_types"`
	Account             string    `json:"account,omitempty"`
	Enabled             bool      `json:"enabled"`
	DisabledReason      string    `json:"disabled_reason,omitempty"`
	ConsecutiveFailures int       `json:"consecutive_failures"`
	CreatedAt           time.Time `json:"created_at"`
	UpdatedAt           time.Time `json:"updated_at"`
}

// EndpointRequest creates or replaces an endpoint. Enabled nil leaves it as it is (a new
// endpoint is enabled); enabling a disabled endpoint resets its run of failures.
type EndpointRequest struct {
	URL        string
	EventTypes []string
	Account    string
	Enabled    *bool
}

// Delivery is one event's delivery to one endpoint; its webhook-id is Event.
type Delivery struct {
	ID       int64  `json:"id"`
	Endpoint string `json:"endpoint"`
	// Event is the id of the event delivered, an alert's or a billing event's. Its JSON
	// name is "alert" in the admin API, from when alerts were the only events.
	Event          string     `json:"alert"`
	Status         string     `json:"status"`
	Attempts       int        `json:"attempts"`
	NextAttemptAt  *time.Time `json:"next_attempt_at,omitempty"`
	FirstAttemptAt *time.Time `json:"first_attempt_at,omitempty"`
	DeliveredAt    *time.Time `json:"delivered_at,omitempty"`
	LastStatus     *int       `json:"last_status,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	// Log is the delivery's attempts, oldest first (Store.Delivery only).
	Log []Attempt `json:"log,omitempty"`
}

// Attempt is one logged attempt of a delivery.
type Attempt struct {
	StartedAt time.Time `json:"started_at"`
	LatencyUS int64     `json:"latency_us"`
	Status    *int      `json:"status,omitempty"`
	Error     string    `json:"error,omitempty"`
	Outcome   string    `json:"outcome"`
}

// CheckURL refuses what may not be an endpoint's URL: anything but an absolute http(s) URL
// with a host, of at most MaxURL bytes (an *InvalidError), and a host that is a literal
// address the delivery client would refuse (a special-purpose address that is not
// globally reachable, address.go) unless allowPrivate (ErrForbiddenTarget). A name is
// checked when a delivery connects, after DNS.
func CheckURL(raw string, allowPrivate bool) error {
	if len(raw) > MaxURL {
		return invalid("url", "url is longer than %d bytes", MaxURL)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return invalid("url", "url must be an absolute http or https URL, e.g. https://example.com/hooks")
	}
	if u.User != nil {
		return invalid("url", "url must not carry credentials")
	}
	if allowPrivate {
		return nil
	}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil {
		return checkIP(ip)
	}
	return nil
}

func validTypes(types []string) error {
	known := strings.Join(EventTypes, ", ")
	if len(types) == 0 {
		return invalid("event_types", "event_types must name at least one type (known: %s)", known)
	}
	for _, t := range types {
		if !slices.Contains(EventTypes, t) {
			return invalid("event_types", "unknown event type %q (known: %s)", t, known)
		}
	}
	return nil
}

// validEndpointID reports whether id can be an endpoint's ("wh_" and 32 lowercase hex
// digits): anything else names none, and never reaches PostgreSQL (a NUL or invalid UTF-8
// would be its error, not a 404).
func validEndpointID(id string) bool {
	if len(id) != 3+32 || id[:3] != "wh_" {
		return false
	}
	for i := 3; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func newID(prefix string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return prefix + hex.EncodeToString(b)
}

// Store keeps endpoints, their secrets and the delivery log in PostgreSQL.
type Store struct {
	pool         *pgxpool.Pool
	allowPrivate bool
}

// NewStore returns a store over pool (migrated). allowPrivate lets endpoints have literal
// private addresses (WEBHOOK_ALLOW_PRIVATE).
func NewStore(pool *pgxpool.Pool, allowPrivate bool) *Store {
	return &Store{pool: pool, allowPrivate: allowPrivate}
}

// The queries of endpoints and secrets. Those that return an endpoint return the columns
// scanEndpoint scans.
var (
	//go:embed sql/insert_endpoint.sql
	insertEndpointSQL string
	//go:embed sql/insert_secret.sql
	insertSecretSQL string
	//go:embed sql/update_endpoint.sql
	updateEndpointSQL string
	//go:embed sql/update_and_enable_endpoint.sql
	updateAndEnableEndpointSQL string
	//go:embed sql/update_and_disable_endpoint.sql
	updateAndDisableEndpointSQL string
	//go:embed sql/endpoint.sql
	endpointSQL string
	//go:embed sql/endpoints.sql
	endpointsSQL string
	//go:embed sql/touch_endpoint.sql
	touchEndpointSQL string
	//go:embed sql/expire_secret.sql
	expireSecretSQL string
)

func scanEndpoint(row pgx.Row) (Endpoint, error) {
	var e Endpoint
	err := row.Scan(&e.ID, &e.URL, &e.EventTypes, &e.Account, &e.Enabled, &e.DisabledReason,
		&e.ConsecutiveFailures, &e.CreatedAt, &e.UpdatedAt)
	e.CreatedAt, e.UpdatedAt = e.CreatedAt.UTC(), e.UpdatedAt.UTC()
	return e, err
}

func (s *Store) check(r EndpointRequest) error {
	if err := CheckURL(r.URL, s.allowPrivate); err != nil {
		return err
	}
	if err := validTypes(r.EventTypes); err != nil {
		return err
	}
	if r.Account != "" && !policy.ValidID(r.Account) {
		return invalid("account", "account must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
	}
	return nil
}

// checkAccount refuses (ErrUnknownAccount) an account filter that names no account, in tx;
// FOR KEY SHARE keeps the account until tx ends. An empty filter is none.
func checkAccount(ctx context.Context, tx pgx.Tx, account string) error {
	if account == "" {
		return nil
	}
	var found bool
	err := tx.QueryRow(ctx, "select true from accounts where id = @id for key share", pgx.StrictNamedArgs{"id": account}).Scan(&found)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("account %q: %w", account, ErrUnknownAccount)
	}
	if err != nil {
		return fmt.Errorf("read account %q: %w", account, err)
	}
	return nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// CreateEndpoint records an endpoint and its first secret, which it returns: the only time
// the secret is shown. An account filter must name an existing account (ErrUnknownAccount).
func (s *Store) CreateEndpoint(ctx context.Context, r EndpointRequest) (Endpoint, string, error) {
	if err := s.check(r); err != nil {
		return Endpoint{}, "", err
	}
	secret, err := NewSecret()
	if err != nil {
		return Endpoint{}, "", err
	}
	enabled := r.Enabled == nil || *r.Enabled
	var reason *string
	if !enabled {
		reason = nullable(reasonAdmin)
	}
	var e Endpoint
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := checkAccount(ctx, tx, r.Account); err != nil {
			return err
		}
		var err error
		e, err = scanEndpoint(tx.QueryRow(ctx, insertEndpointSQL, pgx.StrictNamedArgs{
			"id": newID("wh_"), "url": r.URL, "event_types": r.EventTypes, "account": nullable(r.Account),
			"enabled": enabled, "disabled_reason": reason,
		}))
		if err != nil {
			return fmt.Errorf("insert webhook endpoint: %w", err)
		}
		if _, err := tx.Exec(ctx, insertSecretSQL, pgx.StrictNamedArgs{"endpoint": e.ID, "secret": secret}); err != nil {
			return fmt.Errorf("insert webhook secret: %w", err)
		}
		return nil
	})
	if err != nil {
		return Endpoint{}, "", err
	}
	return e, secret, nil
}

// reasonAdmin is the disabled_reason of an endpoint disabled through the admin API.
const reasonAdmin = "disabled through the admin API"

// UpdateEndpoint replaces an endpoint's URL, types and account filter (an existing
// account's, ErrUnknownAccount otherwise), and enables or disables it (Enabled). Enabling
// resets its run of failures.
func (s *Store) UpdateEndpoint(ctx context.Context, id string, r EndpointRequest) (Endpoint, error) {
	if !validEndpointID(id) {
		return Endpoint{}, fmt.Errorf("endpoint %q: %w", id, ErrNotFound)
	}
	if err := s.check(r); err != nil {
		return Endpoint{}, err
	}
	// Leaving the endpoint enabled or disabled, enabling it and disabling it are three
	// queries, chosen here.
	query, args := updateEndpointSQL, pgx.StrictNamedArgs{
		"id": id, "url": r.URL, "event_types": r.EventTypes, "account": nullable(r.Account),
	}
	switch {
	case r.Enabled == nil: // as it is
	case *r.Enabled:
		query = updateAndEnableEndpointSQL
	default:
		query, args["reason"] = updateAndDisableEndpointSQL, reasonAdmin
	}
	var e Endpoint
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := checkAccount(ctx, tx, r.Account); err != nil {
			return err
		}
		var err error
		e, err = scanEndpoint(tx.QueryRow(ctx, query, args))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("endpoint %q: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("update webhook endpoint: %w", err)
		}
		return nil
	})
	if err != nil {
		return Endpoint{}, err
	}
	return e, nil
}

// Endpoint returns one endpoint.
func (s *Store) Endpoint(ctx context.Context, id string) (Endpoint, error) {
	if !validEndpointID(id) {
		return Endpoint{}, fmt.Errorf("endpoint %q: %w", id, ErrNotFound)
	}
	e, err := scanEndpoint(s.pool.QueryRow(ctx, endpointSQL, pgx.StrictNamedArgs{"id": id}))
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, fmt.Errorf("endpoint %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("read webhook endpoint: %w", err)
	}
	return e, nil
}

// Endpoints returns every endpoint, oldest first.
func (s *Store) Endpoints(ctx context.Context) ([]Endpoint, error) {
	rows, err := s.pool.Query(ctx, endpointsSQL)
	if err != nil {
		return nil, fmt.Errorf("list webhook endpoints: %w", err)
	}
	out := []Endpoint{}
	for rows.Next() {
		e, err := scanEndpoint(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("list webhook endpoints: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list webhook endpoints: %w", err)
	}
	return out, nil
}

// DeleteEndpoint deletes an endpoint with its secrets, deliveries and their log.
func (s *Store) DeleteEndpoint(ctx context.Context, id string) error {
	if !validEndpointID(id) {
		return fmt.Errorf("endpoint %q: %w", id, ErrNotFound)
	}
	tag, err := s.pool.Exec(ctx, "delete from webhook_endpoints where id = @id", pgx.StrictNamedArgs{"id": id})
	if err != nil {
		return fmt.Errorf("delete webhook endpoint: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("endpoint %q: %w", id, ErrNotFound)
	}
	return nil
}

// Rotate gives an endpoint a new secret, which it returns (shown only here). The current
// secret keeps signing beside it for overlap (0: it stops at once; the admin API's default
// is DefaultOverlap); older secrets keep their own expiry.
func (s *Store) Rotate(ctx context.Context, id string, overlap time.Duration) (Endpoint, string, error) {
	if !validEndpointID(id) {
		return Endpoint{}, "", fmt.Errorf("endpoint %q: %w", id, ErrNotFound)
	}
	if overlap < 0 || overlap > MaxOverlap {
		return Endpoint{}, "", invalid("overlap", "overlap_s must be 0-%d seconds", int64(MaxOverlap/time.Second))
	}
	secret, err := NewSecret()
	if err != nil {
		return Endpoint{}, "", err
	}
	var e Endpoint
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		e, err = scanEndpoint(tx.QueryRow(ctx, touchEndpointSQL, pgx.StrictNamedArgs{"id": id}))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("endpoint %q: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("rotate webhook secret: %w", err)
		}
		if _, err := tx.Exec(ctx, "delete from webhook_secrets where endpoint = @endpoint and expires_at <= now()",
			pgx.StrictNamedArgs{"endpoint": id}); err != nil {
			return fmt.Errorf("drop expired webhook secrets: %w", err)
		}
		if _, err := tx.Exec(ctx, expireSecretSQL, pgx.StrictNamedArgs{"endpoint": id, "overlap_s": overlap.Seconds()}); err != nil {
			return fmt.Errorf("expire webhook secret: %w", err)
		}
		if _, err := tx.Exec(ctx, insertSecretSQL, pgx.StrictNamedArgs{"endpoint": id, "secret": secret}); err != nil {
			return fmt.Errorf("insert webhook secret: %w", err)
		}
		return nil
	})
	if err != nil {
		return Endpoint{}, "", err
	}
	return e, secret, nil
}

// The queries of deliveries. Those that return a delivery return the columns scanDelivery
// scans.
var (
	//go:embed sql/deliveries.sql
	deliveriesSQL string
	//go:embed sql/deliveries_of_status.sql
	deliveriesOfStatusSQL string
	//go:embed sql/delivery.sql
	deliverySQL string
	//go:embed sql/attempts.sql
	attemptsSQL string
	//go:embed sql/replay.sql
	replaySQL string
)

func scanDelivery(row pgx.Row) (Delivery, error) {
	var d Delivery
	err := row.Scan(&d.ID, &d.Endpoint, &d.Event, &d.Status, &d.Attempts, &d.NextAttemptAt, &d.FirstAttemptAt,
		&d.DeliveredAt, &d.LastStatus, &d.LastError, &d.CreatedAt)
	for _, t := range []*time.Time{d.NextAttemptAt, d.FirstAttemptAt, d.DeliveredAt} {
		if t != nil {
			*t = t.UTC()
		}
	}
	d.CreatedAt = d.CreatedAt.UTC()
	return d, err
}

// MaxList is the most deliveries Deliveries returns.
const MaxList = 1000

// Deliveries returns an endpoint's latest deliveries, newest first, of status (any when
// empty), at most limit.
func (s *Store) Deliveries(ctx context.Context, endpoint, status string, limit int) ([]Delivery, error) {
	if _, err := s.Endpoint(ctx, endpoint); err != nil {
		return nil, err
	}
	if status != "" && status != StatusPending && status != StatusDelivered && status != StatusFailed {
		return nil, invalid("status", "status must be pending, delivered or failed")
	}
	if limit < 1 || limit > MaxList {
		return nil, invalid("limit", "limit must be 1-%d", MaxList)
	}
	query, args := deliveriesSQL, pgx.StrictNamedArgs{"endpoint": endpoint, "limit": limit}
	if status != "" {
		query, args["status"] = deliveriesOfStatusSQL, status
	}
	rows, err := s.pool.Query(ctx, query, args)
	if err != nil {
		return nil, fmt.Errorf("list webhook deliveries: %w", err)
	}
	out := []Delivery{}
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("list webhook deliveries: %w", err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list webhook deliveries: %w", err)
	}
	return out, nil
}

// Delivery returns one delivery of an endpoint with its log of attempts.
func (s *Store) Delivery(ctx context.Context, endpoint string, id int64) (Delivery, error) {
	if !validEndpointID(endpoint) {
		return Delivery{}, fmt.Errorf("endpoint %q: %w", endpoint, ErrNotFound)
	}
	d, err := scanDelivery(s.pool.QueryRow(ctx, deliverySQL, pgx.StrictNamedArgs{"id": id, "endpoint": endpoint}))
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivery{}, fmt.Errorf("delivery %d of endpoint %q: %w", id, endpoint, ErrNotFound)
	}
	if err != nil {
		return Delivery{}, fmt.Errorf("read webhook delivery: %w", err)
	}
	rows, err := s.pool.Query(ctx, attemptsSQL, pgx.StrictNamedArgs{"delivery": id})
	if err != nil {
		return Delivery{}, fmt.Errorf("read webhook attempts: %w", err)
	}
	d.Log, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := row.Scan(&a.StartedAt, &a.LatencyUS, &a.Status, &a.Error, &a.Outcome)
		a.StartedAt = a.StartedAt.UTC()
		return a, err
	})
	if err != nil {
		return Delivery{}, fmt.Errorf("read webhook attempts: %w", err)
	}
	return d, nil
}

// Replay queues a delivery again, due now, whatever its status: the same webhook-id, its
// attempts appended to its log, a new retry window. A lease held by a deliverer in the
// middle of an attempt is dropped, so the replay is not lost to that attempt's result.
func (s *Store) Replay(ctx context.Context, endpoint string, id int64) (Delivery, error) {
	if !validEndpointID(endpoint) {
		return Delivery{}, fmt.Errorf("endpoint %q: %w", endpoint, ErrNotFound)
	}
	d, err := scanDelivery(s.pool.QueryRow(ctx, replaySQL, pgx.StrictNamedArgs{"id": id, "endpoint": endpoint}))
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivery{}, fmt.Errorf("delivery %d of endpoint %q: %w", id, endpoint, ErrNotFound)
	}
	if err != nil {
		return Delivery{}, fmt.Errorf("replay webhook delivery: %w", err)
	}
	s.notify(ctx)
	return d, nil
}

// ReplayRange queues, due now, a delivery to the endpoint of every event in [from, to) (an
// alert's event time, a billing event's occurred_at) that the endpoint's types and account
// filter match: a delivery made before is queued again (as Replay), a missing one (an
// event from before the endpoint, or from while it was disabled) is created. It returns
// how many it queued.
func (s *Store) ReplayRange(ctx context.Context, endpoint string, from, to time.Time) (int64, error) {
	if !from.Before(to) {
		return 0, invalid("range", "from must be before to")
	}
	if _, err := s.Endpoint(ctx, endpoint); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, replayRangeSQL, pgx.StrictNamedArgs{"endpoint": endpoint, "from": from, "to": to})
	if err != nil {
		return 0, fmt.Errorf("replay webhook deliveries: %w", err)
	}
	s.notify(ctx)
	return tag.RowsAffected(), nil
}

// notify wakes the deliverers listening (a missed wake-up only waits for their poll).
func (s *Store) notify(ctx context.Context) {
	_, _ = s.pool.Exec(ctx, "select pg_notify('webhook_deliveries', '')")
}
