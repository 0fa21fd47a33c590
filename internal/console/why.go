package console

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/policy"
)

var (
	//go:embed sql/event_by_id.sql
	eventByIDSQL string
	//go:embed sql/event_adjustments.sql
	eventAdjustmentsSQL string
	//go:embed sql/event_invoice_lines.sql
	eventInvoiceLinesSQL string
	//go:embed sql/events_by_idempotency.sql
	eventsByIdempotencySQL string
	//go:embed sql/events_by_key.sql
	eventsByKeySQL string
	//go:embed sql/key_account.sql
	keyAccountSQL string
)

// loggedEvent is an admission of the billing log in full, with what happened to it.
type loggedEvent struct {
	ID                              string
	Time, Ingested                  time.Time
	BillingPeriod, ChargedPeriod    time.Time
	Org, Account, Kind              string
	Path                            []string
	APIKey, IdempotencyKey          string
	Plan, Tool, Source              string
	FailOpen, Late                  bool
	ShadowRefusal                   string
	Requests, Tokens, Credits, Cost int64
	Partition                       int32
	Offset                          int64
	Outcome                         *outcome
	VoidReason                      *string
	VoidTime                        *time.Time
	Corrections                     []correction
	Lines                           []invoiceLine
}

type outcome struct {
	Status                          int32
	Requests, Tokens, Credits, Cost *int64
	Time                            time.Time
}

// correction is a correction reconcile made for an event.
type correction struct {
	Kind, What string
	Amount     int64
	At         time.Time
	Applied    bool
	Reason     string
}

// invoiceLine is an invoice line an event landed on.
type invoiceLine struct {
	Invoice                  int64
	Number, Status, Currency string
	LineNo                   int32
	Kind, Unit               string
	Quantity, Amount         int64
	ForPeriod                string
}

// whyPage is the data of the "Why?" page.
type whyPage struct {
	Q, Account string
	Searched   bool
	Found      string // what q turned out to be: "event", "api key", "idempotency key"
	Message    string
	Event      *loggedEvent
	Events     []event
	Refusals   []Refusal
}

// why answers "why was this request admitted, refused or billed so?" for an event id, an
// API key id, or an idempotency key (with its account: keys are per account).
func (c *Console) why(w http.ResponseWriter, r *http.Request, v *view) {
	p := whyPage{Q: strings.TrimSpace(r.URL.Query().Get("q")), Account: strings.TrimSpace(r.URL.Query().Get("account"))}
	v.Title, v.Nav = "Why?", "why"
	if p.Q == "" || len(p.Q) > 300 {
		c.render(w, r, v, http.StatusOK, "why", p)
		return
	}
	p.Searched = true
	if err := c.explain(r.Context(), &p); err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	c.render(w, r, v, http.StatusOK, "why", p)
}

func (c *Console) explain(ctx context.Context, p *whyPage) error {
	e, err := c.loggedEvent(ctx, p.Q)
	switch {
	case err == nil:
		p.Found, p.Event = "event", &e
		return nil
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	if policy.ValidID(p.Q) {
		var account, org string
		err := c.cfg.Pool.QueryRow(ctx, keyAccountSQL, pgx.StrictNamedArgs{"key": p.Q}).Scan(&account, &org)
		switch {
		case err == nil:
			p.Found, p.Account = "api key", account
			rows, err := c.cfg.Pool.Query(ctx, eventsByKeySQL, pgx.StrictNamedArgs{"account": account, "key": p.Q,
				"since": c.now().Add(-7 * 24 * time.Hour)})
			if err == nil {
				p.Events, err = pgx.CollectRows(rows, scanEvent)
			}
			if err != nil {
				return fmt.Errorf("events of key %s: %w", p.Q, err)
			}
			p.Refusals = c.refusalsOf(ctx, org, func(f Refusal) bool { return f.APIKeyID == p.Q })
			return nil
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("account of key %s: %w", p.Q, err)
		}
	}
	if p.Account == "" {
		p.Message = "No event or API key has this id. To look it up as an idempotency key, give the account that sent it."
		return nil
	}
	pol, err := c.cfg.Policies.Resolve(p.Account)
	if err != nil {
		p.Message = "There is no account " + p.Account + "."
		return nil
	}
	p.Found = "idempotency key"
	rows, err := c.cfg.Pool.Query(ctx, eventsByIdempotencySQL, pgx.StrictNamedArgs{"account": p.Account, "key": p.Q})
	if err == nil {
		p.Events, err = pgx.CollectRows(rows, scanEvent)
	}
	if err != nil {
		return fmt.Errorf("events of idempotency key: %w", err)
	}
	if c.cfg.Refusals != nil {
		p.Refusals, err = c.cfg.Refusals.Find(ctx, pol.Org, p.Account, p.Q)
		if err != nil {
			c.cfg.Log.Warn("console: read refusals", "org", pol.Org, "err", err)
		}
	}
	if len(p.Events) == 0 && len(p.Refusals) == 0 {
		p.Message = "Account " + p.Account + " has no admission and no recent refusal under this idempotency key."
	}
	return nil
}

// refusalsOf is the org's recent refusals that keep says to; none when the log cannot be
// read (logged).
func (c *Console) refusalsOf(ctx context.Context, org string, keep func(Refusal) bool) []Refusal {
	if c.cfg.Refusals == nil {
		return nil
	}
	all, err := c.cfg.Refusals.Recent(ctx, org, 1000)
	if err != nil {
		c.cfg.Log.Warn("console: read refusals", "org", org, "err", err)
		return nil
	}
	return slices.DeleteFunc(all, func(f Refusal) bool { return !keep(f) })
}

// loggedEvent reads event id from the billing log with its outcome, void, corrections and
// invoice lines; pgx.ErrNoRows when there is none.
func (c *Console) loggedEvent(ctx context.Context, id string) (loggedEvent, error) {
	var e loggedEvent
	var o outcome
	var status *int32
	var outTime *time.Time
	err := c.cfg.Pool.QueryRow(ctx, eventByIDSQL, pgx.StrictNamedArgs{"event_id": id}).Scan(
		&e.ID, &e.Time, &e.Ingested, &e.BillingPeriod, &e.ChargedPeriod, &e.Org, &e.Account, &e.Kind, &e.Path,
		&e.APIKey, &e.IdempotencyKey, &e.Plan, &e.Tool, &e.Source, &e.FailOpen, &e.Late, &e.ShadowRefusal,
		&e.Requests, &e.Tokens, &e.Credits, &e.Cost, &e.Partition, &e.Offset,
		&status, &o.Requests, &o.Tokens, &o.Credits, &o.Cost, &outTime, &e.VoidReason, &e.VoidTime)
	if err != nil {
		return e, err
	}
	if status != nil {
		o.Status, o.Time = *status, *outTime
		e.Outcome = &o
	}
	rows, err := c.cfg.Pool.Query(ctx, eventAdjustmentsSQL, pgx.StrictNamedArgs{"event_id": id})
	if err == nil {
		e.Corrections, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (correction, error) {
			var x correction
			err := r.Scan(&x.Kind, &x.What, &x.Amount, &x.At, &x.Applied, &x.Reason)
			return x, err
		})
	}
	if err != nil {
		return e, fmt.Errorf("corrections of %s: %w", id, err)
	}
	rows, err = c.cfg.Pool.Query(ctx, eventInvoiceLinesSQL, pgx.StrictNamedArgs{"event_id": id, "org": e.Org,
		"period": e.BillingPeriod, "account_path": strings.Join(e.Path, "/")})
	if err == nil {
		e.Lines, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (invoiceLine, error) {
			var l invoiceLine
			err := r.Scan(&l.Invoice, &l.Number, &l.Status, &l.Currency, &l.LineNo, &l.Kind, &l.Unit, &l.Quantity,
				&l.Amount, &l.ForPeriod)
			return l, err
		})
	}
	if err != nil {
		return e, fmt.Errorf("invoice lines of %s: %w", id, err)
	}
	return e, nil
}
