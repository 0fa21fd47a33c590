package invoice

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The actions of an amendment.
const (
	AmendVoid     = "void"      // the events bill nothing
	AmendSetUnits = "set_units" // the events bill Units (a unit not named: unchanged)
)

// How an amendment's difference is settled.
const (
	SettleNextInvoice = "next_invoice" // an adjustment on the org's next invoice
	SettleCreditNote  = "credit_note"  // a credit note on the period's invoice, at once
)

// MaxAmendEvents bounds the events one amendment amends.
const MaxAmendEvents = 10000

// MaxEventID is the longest event id, in bytes: what the meter records.
const MaxEventID = 255

// MaxUnits is the most units an amendment sets an event to bill: policy.MaxAmount, the
// largest amount of any unit anywhere (policy imports this package, so it is repeated
// here, and a test holds them equal).
const MaxUnits = 1_000_000_000_000_000

var (
	// ErrInvalidAmendment is returned for an amendment that does not validate; the
	// message says why.
	ErrInvalidAmendment = errors.New("invalid amendment")
	// ErrUnknownEvent is returned for an amendment of an event that is not recorded.
	ErrUnknownEvent = errors.New("unknown event")
	// ErrPeriodOpen is returned for an amendment of an event of a period not closed: its
	// usage is corrected by outcomes and voids, and billed by its close.
	ErrPeriodOpen = errors.New("period not closed")
	// ErrNotACredit is returned for an amendment settled by a credit note whose difference
	// is not a credit alone (it bills more, or changes what prepaid credits covered): it
	// goes on the next invoice.
	ErrNotACredit = errors.New("the difference is not a credit")
	// ErrNoLiveInvoice is returned for an amendment settled by a credit note of a period
	// whose invoice for the org is void (or missing): there is nothing to credit.
	ErrNoLiveInvoice = errors.New("no live invoice for the period")
)

// Amendment changes what recorded events of one org's closed period bill: Action void
// (they bill nothing) or set_units (they bill Units; units not named are unchanged), for
// Reason, settled on the next invoice or by a credit note. The events are EventIDs, or
// every event of Org's Period (of Account and below, when given).
type Amendment struct {
	EventIDs []string         `json:"event_ids,omitempty"`
	Org      string           `json:"org,omitempty"`
	Period   time.Time        `json:"-"`
	Account  string           `json:"account,omitempty"`
	Action   string           `json:"action"`
	Units    map[string]int64 `json:"units,omitempty"`
	Reason   string           `json:"reason"`
	Settle   string           `json:"settle"`
	By       string           `json:"-"`
}

// Amended is what Amend did.
type Amended struct {
	ID         int64       `json:"id"`
	Org        string      `json:"org"`
	Period     string      `json:"period"` // YYYY-MM-DD
	Events     int         `json:"events"`
	AmendedAt  time.Time   `json:"amended_at"`
	CreditNote *CreditNote `json:"credit_note,omitempty"`
}

// The statements of amendments.
var (
	//go:embed sql/amend_events_by_id.sql
	amendEventsByIDSQL string
	//go:embed sql/amend_events_by_filter.sql
	amendEventsByFilterSQL string
	//go:embed sql/insert_amendment.sql
	insertAmendmentSQL string
	//go:embed sql/insert_amendment_events.sql
	insertAmendmentEventsSQL string
	//go:embed sql/period_corrections.sql
	periodCorrectionsSQL string
)

// validate checks a on its own (not against the database).
func (a Amendment) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidAmendment, fmt.Sprintf(format, args...))
	}
	if err := checkReason(a.Reason); err != nil {
		return err
	}
	switch {
	case len(a.EventIDs) > 0 && (a.Org != "" || !a.Period.IsZero() || a.Account != ""):
		return bad("name the events (event_ids) or a filter (org, period, account), not both")
	case len(a.EventIDs) == 0 && (a.Org == "" || a.Period.IsZero()):
		return bad("name the events (event_ids) or a filter with an org and a period")
	case len(a.EventIDs) > MaxAmendEvents:
		return bad("%d events, more than %d", len(a.EventIDs), MaxAmendEvents)
	case a.Settle != SettleNextInvoice && a.Settle != SettleCreditNote:
		return bad("settle %q: want %s or %s", a.Settle, SettleNextInvoice, SettleCreditNote)
	case a.Action == AmendVoid && len(a.Units) > 0:
		return bad("a void sets no units")
	case a.Action == AmendSetUnits && len(a.Units) == 0:
		return bad("set_units names at least one unit")
	case a.Action != AmendVoid && a.Action != AmendSetUnits:
		return bad("action %q: want %s or %s", a.Action, AmendVoid, AmendSetUnits)
	}
	for _, id := range a.EventIDs {
		if id == "" || len(id) > MaxEventID {
			return bad("event id %q: 1 to %d bytes", id, MaxEventID)
		}
	}
	for u, n := range a.Units {
		if !slices.Contains(units, u) {
			return bad("unit %q: want one of %v", u, units)
		}
		if n < 0 || n > MaxUnits {
			return bad("%s = %d: want 0 to %d", u, n, int64(MaxUnits))
		}
	}
	return nil
}

// Amend records an amendment of recorded events of one org's closed period: nothing in
// the billing log is rewritten; the amendment is a row, and what the events bill is read
// through it from then on (finance_billable_events). Settled on the next invoice, the
// difference is a correction of the org's next close (whatever the period's age); settled
// by a credit note, the difference is credited at once on the period's live invoice, once,
// and counts as billed for the period (so no close bills it again). It runs under the
// closes' lock. Errors (nothing written): ErrInvalidAmendment, ErrInvalidReason,
// ErrUnknownEvent, ErrPeriodOpen, ErrNotACredit, ErrNoLiveInvoice.
func Amend(ctx context.Context, pool *pgxpool.Pool, is Issuer, a Amendment) (Amended, error) {
	if err := a.validate(); err != nil {
		return Amended{}, err
	}
	if err := is.Validate(); err != nil {
		return Amended{}, fmt.Errorf("issuer: %w", err)
	}
	var out Amended
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := lockCloses(ctx, tx); err != nil {
			return err
		}
		ids, month, org, err := amendedEvents(ctx, tx, a)
		if err != nil {
			return err
		}
		var closed bool
		if err := tx.QueryRow(ctx, `select exists (select 1 from periods where period = $1)`, month).Scan(&closed); err != nil {
			return fmt.Errorf("read periods: %w", err)
		}
		if !closed {
			return fmt.Errorf("%s of org %s: %w: amend only a closed period's usage", month.Format("2006-01"), org, ErrPeriodOpen)
		}
		args := pgx.StrictNamedArgs{"org": org, "period": month, "action": a.Action, "reason": a.Reason, "settle": a.Settle,
			"events": len(ids), "amended_by": a.By}
		for _, u := range units {
			if n, ok := a.Units[u]; ok {
				args[u] = n
			} else {
				args[u] = nil
			}
		}
		out = Amended{Org: org, Period: month.Format(dateLayout), Events: len(ids)}
		if err := tx.QueryRow(ctx, insertAmendmentSQL, args).Scan(&out.ID, &out.AmendedAt); err != nil {
			return fmt.Errorf("record the amendment: %w", err)
		}
		if _, err := tx.Exec(ctx, insertAmendmentEventsSQL, pgx.StrictNamedArgs{
			"amendment_id": out.ID, "event_ids": ids, "period": month,
		}); err != nil {
			return fmt.Errorf("record the amended events: %w", err)
		}
		if a.Settle == SettleCreditNote {
			out.CreditNote, err = creditAmendment(ctx, tx, is, out, a)
		}
		return err
	})
	if err != nil {
		return Amended{}, fmt.Errorf("amend: %w", err)
	}
	return out, nil
}

// amendedEvents are the events a amends, all of one org and period: their ids, the
// period and the org.
func amendedEvents(ctx context.Context, tx pgx.Tx, a Amendment) ([]string, time.Time, string, error) {
	query, args := amendEventsByIDSQL, pgx.StrictNamedArgs{"ids": a.EventIDs}
	if len(a.EventIDs) == 0 {
		query, args = amendEventsByFilterSQL, pgx.StrictNamedArgs{"org": a.Org, "period": a.Period, "account": orNull(a.Account), "limit": MaxAmendEvents + 1}
	}
	rows, err := tx.Query(ctx, query, args)
	if err != nil {
		return nil, time.Time{}, "", fmt.Errorf("read the events: %w", err)
	}
	type ev struct {
		id     string
		period time.Time
		org    string
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ev, error) {
		var e ev
		err := r.Scan(&e.id, &e.period, &e.org)
		return e, err
	})
	if err != nil {
		return nil, time.Time{}, "", fmt.Errorf("read the events: %w", err)
	}
	if len(found) == 0 {
		return nil, time.Time{}, "", fmt.Errorf("%w: no recorded event matches", ErrUnknownEvent)
	}
	if len(found) > MaxAmendEvents {
		return nil, time.Time{}, "", fmt.Errorf("%w: more than %d events match: amend them in parts", ErrInvalidAmendment, MaxAmendEvents)
	}
	seen := map[string]bool{}
	for _, e := range found {
		seen[e.id] = true
		if e.org != found[0].org || !e.period.Equal(found[0].period) {
			return nil, time.Time{}, "", fmt.Errorf("%w: the events are of more than one org or period (%s %s, %s %s): one amendment each",
				ErrInvalidAmendment, found[0].org, found[0].period.Format("2006-01"), e.org, e.period.Format("2006-01"))
		}
	}
	for _, id := range a.EventIDs {
		if !seen[id] {
			return nil, time.Time{}, "", fmt.Errorf("%w: %q is not a recorded event", ErrUnknownEvent, id)
		}
	}
	return slices.Sorted(maps.Keys(seen)), found[0].period, found[0].org, nil
}

// creditAmendment issues, in tx, the credit note settling amendment am at once: the
// corrections of its org's period as it bills now (period_corrections.sql, priced by
// priceCorrection), each a credit, as lines crediting the period's live invoice, taxed at
// its rate. ErrNotACredit when a difference bills more or changes covered units.
func creditAmendment(ctx context.Context, tx pgx.Tx, is Issuer, am Amended, a Amendment) (*CreditNote, error) {
	month, err := time.Parse(dateLayout, am.Period)
	if err != nil {
		return nil, err
	}
	var id int64
	// Locked: a void of the same invoice at the same time waits, and then credits what this
	// note did not (or this one finds the invoice void, and refuses).
	err = tx.QueryRow(ctx, `select id from invoices where org = $1 and period = $2 and status <> 'void' order by id desc limit 1 for update`,
		am.Org, month).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%s of org %s: %w: settle it on the next invoice", month.Format("2006-01"), am.Org, ErrNoLiveInvoice)
	}
	if err != nil {
		return nil, fmt.Errorf("find the invoice of %s: %w", month.Format("2006-01"), err)
	}
	inv, err := Get(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	pr, err := loadPlans(ctx, tx, month)
	if err != nil {
		return nil, err
	}
	plan, err := pr.version(priceKey{inv.Plan, inv.PriceVersion})
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, periodCorrectionsSQL, pgx.StrictNamedArgs{"org": am.Org, "period": month})
	if err != nil {
		return nil, fmt.Errorf("read the period's corrections: %w", err)
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (correction, error) { return scanCorrection(r, month) })
	if err != nil {
		return nil, fmt.Errorf("read the period's corrections: %w", err)
	}
	var lines []Line
	for _, c := range cs {
		if c.err != nil {
			return nil, c.err
		}
		ls, err := priceCorrection(pr, plan, c)
		if err != nil {
			return nil, err
		}
		for _, l := range ls {
			if l.Kind != KindAdjustment || l.Quantity > 0 || l.AmountMinor > 0 {
				return nil, fmt.Errorf("%w: %s of %s %s by %d for %d (covered or billed more): settle it on the next invoice",
					ErrNotACredit, l.Unit, am.Org, month.Format("2006-01"), l.Quantity, l.AmountMinor)
			}
			l.Quantity, l.AmountMinor = -l.Quantity, -l.AmountMinor
			lines = append(lines, l)
		}
	}
	subtotal, err := Sum(lines)
	if err != nil {
		return nil, err
	}
	tax, err := Tax(subtotal, inv.TaxRateBP)
	if err != nil {
		return nil, err
	}
	n := CreditNote{
		Org: am.Org, InvoiceID: inv.ID, InvoiceNumber: inv.Number, Kind: "amendment", Reason: a.Reason, Currency: inv.Currency,
		SubtotalMinor: subtotal, TaxRateBP: inv.TaxRateBP, TaxMinor: tax, TotalMinor: subtotal + tax, IssuedAt: am.AmendedAt,
		IssuedBy: a.By, Seller: &is.Seller, Buyer: inv.Buyer, Lines: lines, AmendmentID: &am.ID,
	}
	if err := issueCreditNote(ctx, tx, is, &n); err != nil {
		return nil, err
	}
	return &n, nil
}
