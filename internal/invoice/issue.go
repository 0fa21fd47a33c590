package invoice

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/document"
)

// The statements that read what a period's invoices bill, and write them.
var (
	//go:embed sql/billable_usage.sql
	billableUsageSQL string
	//go:embed sql/covered_usage.sql
	coveredUsageSQL string
	//go:embed sql/insert_invoice.sql
	insertInvoiceSQL string
	//go:embed sql/insert_late_events.sql
	insertLateEventsSQL string
)

// units are the billing log's units, in the order of finance_billable_events' billable_*.
var units = []string{"requests", "tokens", "credits", "cost_micros"}

// issuance is the invoices of a period in three steps: what they bill is read once for
// every org (loadIssue), then each org's invoice is priced (price) and written
// (writeInvoice) under a savepoint of its own (issueOrg).
type issuance struct {
	period, closedAt time.Time // closedAt: the period's close, which decides the events it covers
	issuedAt         time.Time // when the invoices are issued: closedAt, or a reissue's now
	replaces         *Invoice  // a reissue: the voided invoice it replaces
	reason           string    // a reissue: why
	by               string    // who issues the invoices
	pr               prices
	orgPlan          map[string]string           // org → its plan, of the orgs in accounts
	usage            map[string][]Usage          // org → what its account paths bill for the period
	covered          map[string]map[string]int64 // org → unit → what its own credit grants covered
	late             []lateEvent                 // late events to bill, of every org
	corrections      []correction                // corrections to bill, of every org
	earlier          map[string]time.Time        // org → its first period with an open failure
	details          map[string]*BillingDetails  // org → its billing details, of the orgs that have them
	bad              map[string]error            // org → why its own data cannot be invoiced
	orgs             []string                    // the orgs to invoice, sorted
	issuer           Issuer
	seq              *sequence      // the invoices' numbers
	events           []billingEvent // of the invoices written, recorded at the end
}

// draft is an org's invoice as priced, before it is written.
type draft struct {
	org      string
	plan     Plan
	lines    []Line
	subtotal int64
	taxBP    int
	tax      int64
	late     []lateEvent // the late events its late lines bill
}

// issue writes the invoices of a period: of every org due one (only nil: usage in the
// period, unbilled late events or corrections, or a plan with a base fee), or of the orgs
// in only (a retry of failed ones). Each org's invoice is written under a savepoint: one
// that fails is rolled back alone and returned in failed, and the others are issued. The
// error is for what stops every org (the connection, the context, a shared read).
func issue(ctx context.Context, tx pgx.Tx, issuer Issuer, by string, period, end, closedAt time.Time, only []string) (issued int, failed []Failure, err error) {
	is, err := loadIssue(ctx, tx, period, end, closedAt, only)
	if err != nil {
		return 0, nil, err
	}
	is.issuer, is.by = issuer, by
	if is.details, err = readBillingDetails(ctx, tx, is.orgs); err != nil {
		return 0, nil, err
	}
	if is.seq, err = lockSequence(ctx, tx, issuer, seqInvoice, is.issuedAt); err != nil {
		return 0, nil, err
	}
	for _, org := range is.orgs {
		err := is.blocked(org)
		if err == nil {
			err = is.issueOrg(ctx, tx, org)
		}
		if err != nil {
			if ctx.Err() != nil {
				return 0, nil, ctx.Err()
			}
			failed = append(failed, Failure{Org: org, Period: period.Format("2006-01"), Error: err.Error()})
			continue
		}
		issued++
	}
	if err := recordEvents(ctx, tx, is.events...); err != nil {
		return 0, nil, err
	}
	return issued, failed, is.seq.save(ctx, tx)
}

// loadIssue is the load step: it reads in tx, once for every org, what the invoices of
// period bill (prices, plans, usage, covered units, late events, corrections, earlier
// failures) and which orgs to invoice: those in only, or when only is nil every org due
// an invoice (due; active ones are those created before end).
func loadIssue(ctx context.Context, tx pgx.Tx, period, end, closedAt time.Time, only []string) (*issuance, error) {
	is := &issuance{period: period, closedAt: closedAt, issuedAt: closedAt, bad: map[string]error{}}
	var err error
	if is.pr, err = loadPlans(ctx, tx, period); err != nil {
		return nil, err
	}
	if is.orgPlan, err = readOrgPlans(ctx, tx, is.pr); err != nil {
		return nil, err
	}
	if err := is.readUsage(ctx, tx); err != nil {
		return nil, err
	}
	if err := is.readCovered(ctx, tx); err != nil {
		return nil, err
	}
	if is.late, err = loadLate(ctx, tx, period); err != nil {
		return nil, err
	}
	corrections, err := loadCorrections(ctx, tx, period)
	if err != nil {
		return nil, err
	}
	for _, c := range corrections {
		if c.err != nil {
			is.bad[c.org] = fmt.Errorf("correction of %w", c.err)
			continue
		}
		is.corrections = append(is.corrections, c)
	}
	if is.earlier, err = earlierFailures(ctx, tx, period); err != nil {
		return nil, err
	}
	if only != nil {
		is.orgs = slices.Compact(slices.Sorted(slices.Values(only)))
		return is, nil
	}
	active, err := readActiveOrgs(ctx, tx, end)
	if err != nil {
		return nil, err
	}
	is.orgs = is.due(active)
	return is, nil
}

// readOrgPlans maps each org in accounts to the plan it is billed on: its own when the
// close prices it, the smallest plan otherwise (unknown or missing), as admit clamps it.
func readOrgPlans(ctx context.Context, tx pgx.Tx, pr prices) (map[string]string, error) {
	rows, err := tx.Query(ctx, `select id, plan from accounts where kind = 'org'`)
	if err != nil {
		return nil, fmt.Errorf("read orgs: %w", err)
	}
	defer rows.Close()
	orgPlan := map[string]string{}
	for rows.Next() {
		var id string
		var plan *string
		if err := rows.Scan(&id, &plan); err != nil {
			return nil, fmt.Errorf("read orgs: %w", err)
		}
		orgPlan[id] = pr.smallest
		if plan != nil {
			if _, ok := pr.plans[*plan]; ok {
				orgPlan[id] = *plan
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read orgs: %w", err)
	}
	return orgPlan, nil
}

// planOf is the plan org is billed on.
func (is *issuance) planOf(org string) string {
	if p, ok := is.orgPlan[org]; ok {
		return p
	}
	return is.pr.smallest // an org no longer in accounts: the smallest plan, as admit clamps
}

// readUsage reads what each org's account paths bill for the period into is.usage. What
// an org's own data makes impossible to invoice (a sum past bigint) goes to is.bad: that
// org fails, the others are issued.
func (is *issuance) readUsage(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, billableUsageSQL, pgx.StrictNamedArgs{"period": is.period, "closed_at": is.closedAt})
	if err != nil {
		return fmt.Errorf("read usage: %w", err)
	}
	defer rows.Close()
	is.usage = map[string][]Usage{}
	for rows.Next() {
		var org, path string
		var raw [4]string
		if err := rows.Scan(&org, &path, &raw[0], &raw[1], &raw[2], &raw[3]); err != nil {
			return fmt.Errorf("read usage: %w", err)
		}
		for i, unit := range units {
			q, err := parseSum(raw[i])
			if err != nil {
				is.bad[org] = fmt.Errorf("usage of %s by %s: %w", unit, path, err)
			}
			is.usage[org] = append(is.usage[org], Usage{AccountPath: path, Unit: unit, Quantity: q})
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read usage: %w", err)
	}
	return nil
}

// readCovered reads what each org's own credit grants covered of the same events into
// is.covered; a sum past bigint goes to is.bad, as in readUsage.
func (is *issuance) readCovered(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, coveredUsageSQL, pgx.StrictNamedArgs{"period": is.period, "closed_at": is.closedAt})
	if err != nil {
		return fmt.Errorf("read covered usage: %w", err)
	}
	defer rows.Close()
	is.covered = map[string]map[string]int64{}
	for rows.Next() {
		var org, unit, raw string
		if err := rows.Scan(&org, &unit, &raw); err != nil {
			return fmt.Errorf("read covered usage: %w", err)
		}
		q, err := parseSum(raw)
		if err != nil {
			is.bad[org] = fmt.Errorf("covered %s: %w", unit, err)
		}
		if is.covered[org] == nil {
			is.covered[org] = map[string]int64{}
		}
		is.covered[org][unit] = q
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read covered usage: %w", err)
	}
	return nil
}

// parseSum reads a sum PostgreSQL computed as numeric (given as text): an integer that fits
// a bigint, the largest quantity an invoice line holds.
func parseSum(raw string) (int64, error) {
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("total %s is past the largest quantity %d (bigint)", raw, int64(1<<63-1))
	}
	return v, nil
}

// readActiveOrgs lists the orgs created before end.
func readActiveOrgs(ctx context.Context, tx pgx.Tx, end time.Time) ([]string, error) {
	rows, err := tx.Query(ctx, `select id from accounts where kind = 'org' and created_at < $1`, end)
	if err != nil {
		return nil, fmt.Errorf("read active orgs: %w", err)
	}
	defer rows.Close()
	var active []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("read active orgs: %w", err)
		}
		active = append(active, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read active orgs: %w", err)
	}
	return active, nil
}

// due lists, sorted, the orgs due an invoice: with usage in the period, late events or
// corrections to bill (or whose own data fails them), or among active on a plan with a base fee.
func (is *issuance) due(active []string) []string {
	orgs := map[string]bool{}
	for org := range is.usage {
		orgs[org] = true
	}
	for org := range is.bad { // its own data fails it: recorded as a failure, not skipped
		orgs[org] = true
	}
	for _, e := range is.late {
		orgs[e.org] = true
	}
	for _, c := range is.corrections {
		orgs[c.org] = true
	}
	for _, id := range active {
		if is.pr.plans[is.planOf(id)].BaseFeeMinor > 0 {
			orgs[id] = true
		}
	}
	return slices.Sorted(maps.Keys(orgs))
}

// blocked is why org is not invoiced before its invoice is priced: its own data (a sum
// past bigint), or an open failure of an earlier period; nil when it can be.
func (is *issuance) blocked(org string) error {
	err := is.bad[org]
	if p, ok := is.earlier[org]; ok && err == nil {
		err = fmt.Errorf("the org's invoice for %s is not issued (a failed close): close %s again first",
			p.Format("2006-01"), p.Format("2006-01"))
	}
	return err
}

// issueOrg prices and writes org's invoice under a savepoint of tx: on an error nothing
// of it is written, and tx goes on. An error of the connection shows in the rollback, and
// stops the close.
func (is *issuance) issueOrg(ctx context.Context, tx pgx.Tx, org string) (err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("savepoint for org %s: %w", org, err)
	}
	defer func() {
		if err == nil {
			if err = sp.Commit(ctx); err != nil {
				err = fmt.Errorf("release savepoint of org %s: %w", org, err)
			}
			return
		}
		if rerr := sp.Rollback(ctx); rerr != nil {
			err = errors.Join(err, fmt.Errorf("roll back org %s: %w", org, rerr))
		}
	}()
	d, err := is.price(ctx, sp, org)
	if err != nil {
		return err
	}
	_, e, err := is.writeInvoice(ctx, sp, d)
	if err == nil { // kept only once the savepoint is released (the deferred Commit)
		is.seq.take()
		is.events = append(is.events, e)
	}
	return err
}

// price is the price step: org's invoice lines and total, from its usage and corrections
// (priceUsage, pure Go) and its late events, priced at the margin of what was billed
// before (priceLate, which reads that through tx).
func (is *issuance) price(ctx context.Context, tx pgx.Tx, org string) (draft, error) {
	plan, err := is.pr.plan(is.planOf(org))
	if err != nil {
		return draft{}, err
	}
	var corrections []correction
	for _, c := range is.corrections {
		if c.org == org {
			corrections = append(corrections, c)
		}
	}
	lines, billed, err := priceUsage(is.pr, plan, org, is.usage[org], is.covered[org], corrections)
	if err != nil {
		return draft{}, err
	}
	var late []lateEvent
	for _, e := range is.late {
		if e.org == org {
			late = append(late, e)
		}
	}
	lateLines, err := priceLate(ctx, tx, is.pr, plan, org, late, billed)
	if err != nil {
		return draft{}, fmt.Errorf("price late events of org %s: %w", org, err)
	}
	lines = append(lines, lateLines...)
	if is.replaces != nil {
		self, err := is.reissueCorrections(ctx, tx, plan, org, lines)
		if err != nil {
			return draft{}, err
		}
		lines = append(lines, self...)
	}
	subtotal, err := Sum(lines)
	if err != nil {
		return draft{}, fmt.Errorf("org %s: %w", org, err)
	}
	details := is.details[org]
	if details != nil && details.Currency != "" && details.Currency != plan.Currency {
		return draft{}, fmt.Errorf("org %s is invoiced in %s (its billing details), its plan %s prices in %s: %w",
			org, details.Currency, plan.ID, plan.Currency, ErrCurrencyMismatch)
	}
	taxBP := is.issuer.taxRate(details)
	tax, err := Tax(subtotal, taxBP)
	if err != nil {
		return draft{}, fmt.Errorf("tax of org %s: %w", org, err)
	}
	if total := subtotal + tax; (tax > 0 && total < subtotal) || (tax < 0 && total > subtotal) {
		return draft{}, fmt.Errorf("org %s: total: %w", org, ErrOverflow)
	}
	return draft{org: org, plan: plan, lines: lines, subtotal: subtotal, taxBP: taxBP, tax: tax, late: late}, nil
}

// priceUsage prices all of org's invoice under plan but its late events: the base fee and
// the period's usage less the covered units (Price), then each correction of a closed
// period (priceCorrection). Corrections come first: they bring what was billed for a
// period up (or down) to what is billable, and billed (per period and unit, as
// priceLate keys it) is that, for the late lines priced at the margin after them.
func priceUsage(pr prices, plan Plan, org string, usage []Usage, covered map[string]int64, corrections []correction) (lines []Line, billed map[[2]string]billedUnits, err error) {
	lines, err = Price(plan, org, usage, covered)
	if err != nil {
		return nil, nil, fmt.Errorf("price org %s: %w", org, err)
	}
	billed = map[[2]string]billedUnits{}
	for _, c := range corrections {
		l, err := priceCorrection(pr, plan, c)
		if err != nil {
			return nil, nil, fmt.Errorf("price correction of org %s: %w", org, err)
		}
		lines = append(lines, l...)
		amount := c.billedAmount
		for _, cl := range l {
			amount += cl.AmountMinor
		}
		billed[[2]string{c.period.Format(dateLayout), c.unit}] = billedUnits{quantity: c.billable, covered: c.covered, amount: amount}
	}
	return lines, billed, nil
}

// writeInvoice is the write step: the invoice as issued at the close, numbered next in
// is.seq (the caller takes the number once the invoice stands), its lines numbered from 1
// in order, and the late events it bills. It returns the invoice (without lines) and its
// invoice.issued.v1, for the caller to record.
func (is *issuance) writeInvoice(ctx context.Context, tx pgx.Tx, d draft) (Invoice, billingEvent, error) {
	number := is.seq.next()
	var buyer *document.Party
	if details := is.details[d.org]; details != nil {
		buyer = &details.Party
	}
	due := is.issuedAt.Add(is.issuer.terms())
	inv := Invoice{
		Number: number, Org: d.org, Period: is.period.Format(dateLayout), Plan: d.plan.ID, PriceVersion: d.plan.Version,
		Currency: d.plan.Currency, Status: StatusIssued, Seller: &is.issuer.Seller, Buyer: buyer, SubtotalMinor: d.subtotal,
		TaxRateBP: d.taxBP, TaxMinor: d.tax, TotalMinor: d.subtotal + d.tax, IssuedAt: is.issuedAt, DueAt: &due, IssuedBy: is.by,
	}
	var replaces, reason any
	if is.replaces != nil {
		replaces, reason = is.replaces.ID, is.reason
		inv.Replaces, inv.Reason = &is.replaces.ID, is.reason
	}
	var id int64
	if err := tx.QueryRow(ctx, insertInvoiceSQL, pgx.StrictNamedArgs{
		"org": d.org, "period": is.period, "plan": d.plan.ID, "price_version": d.plan.Version,
		"currency": d.plan.Currency, "subtotal_minor": d.subtotal, "tax_rate_bp": d.taxBP, "tax_minor": d.tax,
		"issued_at": is.issuedAt, "due_at": due, "number": number, "issuer": is.issuer.prefix(),
		"seller": is.issuer.Seller, "buyer": buyer, "replaces": replaces, "reason": reason, "issued_by": is.by,
	}).Scan(&id); err != nil {
		return Invoice{}, billingEvent{}, fmt.Errorf("insert invoice of org %s: %w", d.org, err)
	}
	inv.ID = id
	if err := insertLines(ctx, tx, id, d.lines); err != nil {
		return Invoice{}, billingEvent{}, fmt.Errorf("insert lines of org %s: %w", d.org, err)
	}
	if len(d.late) > 0 {
		ids := make([]string, len(d.late))
		periods := make([]time.Time, len(d.late))
		for i, e := range d.late {
			ids[i], periods[i] = e.eventID, e.period
		}
		if _, err := tx.Exec(ctx, insertLateEventsSQL, pgx.StrictNamedArgs{
			"event_ids": ids, "billing_periods": periods, "invoice_id": id,
		}); err != nil {
			return Invoice{}, billingEvent{}, fmt.Errorf("record late events of org %s: %w", d.org, err)
		}
	}
	e, err := newEvent(is.issuer, "invoice.issued/"+number, EventInvoiceIssued, d.org, "invoice/"+number, is.issuedAt, inv)
	return inv, e, err
}

func insertLines(ctx context.Context, tx pgx.Tx, id int64, lines []Line) error {
	rows := make([][]any, len(lines))
	for i, l := range lines {
		rows[i] = lineRow(id, i+1, l)
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"invoice_lines"}, lineColumns("invoice_id"), pgx.CopyFromRows(rows))
	return err
}

// lineColumns are the columns of a document's line (invoice_lines, credit_note_lines),
// the document's id first.
func lineColumns(document string) []string {
	return []string{document, "line_no", "kind", "account_path", "unit", "quantity", "unit_price_minor", "per_units", "amount_minor", "for_period"}
}

// lineRow is line l, number no, of document id, as lineColumns lists them.
func lineRow(id int64, no int, l Line) []any {
	var unit, forPeriod any
	if l.Unit != "" {
		unit = l.Unit
	}
	if l.ForPeriod != "" {
		forPeriod = l.ForPeriod
	}
	return []any{id, no, l.Kind, l.AccountPath, unit, l.Quantity, l.UnitPriceMinor, l.PerUnits, l.AmountMinor, forPeriod}
}
