package invoice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/period"
)

// DefaultGrace is how long after a period's end Close waits, unless told otherwise: long
// enough for the pipeline to drain and reconcile to settle the month.
const DefaultGrace = 3 * 24 * time.Hour

var (
	// ErrTooEarly is returned by Close before the period's end plus the grace (without Force).
	ErrTooEarly = errors.New("period not over yet (end + grace)")
	// ErrLaterPeriodClosed is returned by Close for a period older than a closed one: late
	// events would otherwise be billed on an earlier invoice than the one they follow.
	ErrLaterPeriodClosed = errors.New("a later period is already closed")
	// ErrNotFound is returned by Export when the org has no invoice for the period.
	ErrNotFound = errors.New("invoice not found")
	// ErrInvoicesFailed is returned by Close, with its Result, when some orgs' invoices
	// could not be issued (Result.Failed): the others are issued and the period is closed;
	// a close of the period again retries the failed ones.
	ErrInvoicesFailed = errors.New("some orgs' invoices could not be issued")
)

// Options tunes Close. The zero value closes a period that ended more than DefaultGrace ago.
type Options struct {
	Clock period.Clock  // nil: the system clock
	Grace time.Duration // after the period's end; zero = DefaultGrace
	Force bool          // close even before the end plus the grace
	By    string        // who closes, recorded in periods.closed_by; empty = "invoice.Close"
	Log   *slog.Logger  // where each org's failed invoice is logged; nil: nowhere
}

// Invoice is an issued invoice and its lines.
type Invoice struct {
	ID            int64     `json:"id"`
	Org           string    `json:"org"`
	Period        string    `json:"period"`
	Plan          string    `json:"plan"`
	PriceVersion  int       `json:"price_version"` // the version of the plan's price it was priced with
	Currency      string    `json:"currency"`
	SubtotalMinor int64     `json:"subtotal_minor"`
	TotalMinor    int64     `json:"total_minor"`
	IssuedAt      time.Time `json:"issued_at"`
	Status        string    `json:"status"`
	Lines         []Line    `json:"lines"`
}

// Result is what Close did.
type Result struct {
	Period   time.Time
	ClosedAt time.Time
	Created  bool // true: this call closed the period; false: it was closed already
	// Issued counts the invoices this call issued: every due org's when it closed the
	// period, the retried ones when it was closed already (0: nothing was written).
	Issued   int
	Invoices []Invoice // every invoice of the period
	// Failed lists the orgs whose invoice this call could not issue (empty when none).
	Failed []Failure
}

// Failure is an org whose invoice a close could not issue: its invoice was rolled back
// alone, recorded in invoice_failures, and is retried by a close of the period again.
type Failure struct {
	Org    string `json:"org"`
	Period string `json:"period"` // YYYY-MM
	Error  string `json:"error"`
}

// dateLayout is how a period's first day is keyed (as PostgreSQL's date).
const dateLayout = period.DayLayout

// LastClosable is the last month whose end plus the grace (zero: DefaultGrace) has passed at
// now: the month a monthly close job closes.
func LastClosable(now time.Time, grace time.Duration) time.Time {
	if grace == 0 {
		grace = DefaultGrace
	}
	return period.MonthStart(now.Add(-grace)).AddDate(0, -1, 0)
}

// Close freezes a billing period and issues one invoice per org: the orgs with usage in
// the period, with unbilled late events of earlier closed periods, or on a plan with a base
// fee. It runs in one transaction, serialized with other closes by an advisory lock, and
// each org's invoice is written under a savepoint of its own: an org whose invoice cannot
// be priced or written (a total past bigint, a price that does not validate, any error of
// its own) is rolled back alone, recorded in invoice_failures and returned in
// Result.Failed with ErrInvoicesFailed; every other org's invoice is issued and the period
// is closed.
//
// Closing a closed period again retries its open failures (orgs with a failure and still
// no invoice), each issued at most once (invoices are unique per org and period), and
// otherwise writes nothing and returns its invoices. An org with an open failure of an
// earlier period is not invoiced for a later one (it fails, naming that period), so its
// invoices are issued in order once its data is fixed.
func Close(ctx context.Context, pool *pgxpool.Pool, month time.Time, opts Options) (Result, error) {
	month = period.MonthStart(month)
	end := month.AddDate(0, 1, 0)
	now, grace, by, log := opts.Clock.Now(), opts.Grace, opts.By, opts.Log
	if grace == 0 {
		grace = DefaultGrace
	}
	if by == "" {
		by = "invoice.Close"
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !opts.Force && now.Before(end.Add(grace)) {
		return Result{}, fmt.Errorf("close %s before %s: %w", period.MonthLabel(month), end.Add(grace).Format(time.RFC3339), ErrTooEarly)
	}
	var res Result
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res = Result{Period: month, Failed: []Failure{}}
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtext('metergate.invoice.close'))`); err != nil {
			return fmt.Errorf("lock close: %w", err)
		}
		var closedAt *time.Time
		var later bool
		if err := tx.QueryRow(ctx, `select (select closed_at from periods where period = $1),
		        exists (select 1 from periods where period > $1)`, month).Scan(&closedAt, &later); err != nil {
			return fmt.Errorf("read periods: %w", err)
		}
		var only []string // nil: every org due an invoice
		if closedAt != nil {
			res.ClosedAt = *closedAt
			open, err := openFailures(ctx, tx, month)
			if err != nil {
				return err
			}
			if len(open) == 0 {
				invs, err := loadInvoices(ctx, tx, month, "")
				res.Invoices = invs
				return err
			}
			only = open
		} else {
			if later {
				return fmt.Errorf("close %s: %w", period.MonthLabel(month), ErrLaterPeriodClosed)
			}
			if err := lockPartition(ctx, tx, month); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `insert into periods (period, closed_at, closed_by) values ($1, clock_timestamp(), $2) returning closed_at`,
				month, by).Scan(&res.ClosedAt); err != nil {
				return fmt.Errorf("insert period: %w", err)
			}
			res.Created = true
		}
		issued, failed, err := issue(ctx, tx, month, end, res.ClosedAt, only)
		if err != nil {
			return err
		}
		res.Issued = issued
		for _, f := range failed {
			if _, err := tx.Exec(ctx, `insert into invoice_failures (period, org, error) values ($1, $2, $3)`, month, f.Org, f.Error); err != nil {
				return fmt.Errorf("record the failed invoice of org %s: %w", f.Org, err)
			}
			res.Failed = append(res.Failed, f)
		}
		invs, err := loadInvoices(ctx, tx, month, "")
		res.Invoices = invs
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("close period %s: %w", period.MonthLabel(month), err)
	}
	for _, f := range res.Failed {
		log.Error("invoice not issued", "org", f.Org, "period", f.Period, "err", f.Error)
	}
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("close period %s: %d orgs: %w", period.MonthLabel(month), len(res.Failed), ErrInvoicesFailed)
	}
	return res, nil
}

// lockPartition waits for the meter's transactions writing month, and keeps new ones out
// until the close commits: what the invoices read is then exactly what was ingested by
// closed_at. Later rows are late.
func lockPartition(ctx context.Context, tx pgx.Tx, month time.Time) error {
	var part pgx.Identifier
	err := tx.QueryRow(ctx, `
		select array[n.nspname::text, c.relname::text]
		from pg_inherits i join pg_class c on c.oid = i.inhrelid join pg_namespace n on n.oid = c.relnamespace
		where i.inhparent = 'usage_events'::regclass and c.relname = 'usage_events_' || to_char($1::date, 'YYYY_MM')`,
		month).Scan(&part)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // no partition: no usage, nothing to wait for
	case err != nil:
		return fmt.Errorf("find partition: %w", err)
	default:
		if _, err := tx.Exec(ctx, "lock table "+part.Sanitize()+" in share mode"); err != nil {
			return fmt.Errorf("lock partition %s: %w", part.Sanitize(), err)
		}
	}
	return nil
}

// openFailures lists the orgs with a failed invoice for month and still no invoice.
func openFailures(ctx context.Context, tx pgx.Tx, month time.Time) ([]string, error) {
	rows, err := tx.Query(ctx, `select distinct f.org from invoice_failures f
		where f.period = $1 and not exists (select 1 from invoices i where i.org = f.org and i.period = f.period)
		order by f.org`, month)
	if err != nil {
		return nil, fmt.Errorf("read failed invoices: %w", err)
	}
	orgs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read failed invoices: %w", err)
	}
	return orgs, nil
}

// earlierFailures maps each org with an open failure of a period before month to the
// first such period.
func earlierFailures(ctx context.Context, tx pgx.Tx, month time.Time) (map[string]time.Time, error) {
	rows, err := tx.Query(ctx, `select f.org, min(f.period) from invoice_failures f
		where f.period < $1 and not exists (select 1 from invoices i where i.org = f.org and i.period = f.period)
		group by f.org`, month)
	if err != nil {
		return nil, fmt.Errorf("read earlier failed invoices: %w", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var org string
		var p time.Time
		if err := rows.Scan(&org, &p); err != nil {
			return nil, fmt.Errorf("read earlier failed invoices: %w", err)
		}
		out[org] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read earlier failed invoices: %w", err)
	}
	return out, nil
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

type lateEvent struct {
	eventID string
	period  time.Time
	org     string
	path    string
	units   map[string]int64
	covered map[string]int64 // of units, what the org's own credit grants covered
}

// issue writes the invoices of a period: of every org due one (only nil: usage in the
// period, unbilled late events or corrections, or a plan with a base fee), or of the orgs
// in only (a retry of failed ones). Each org's invoice is written under a savepoint: one
// that fails is rolled back alone and returned in failed, and the others are issued. The
// error is for what stops every org (the connection, the context, a shared read).
func issue(ctx context.Context, tx pgx.Tx, period, end, closedAt time.Time, only []string) (issued int, failed []Failure, err error) {
	pr, err := loadPlans(ctx, tx, period)
	if err != nil {
		return 0, nil, err
	}
	orgPlan := map[string]string{}
	rows, err := tx.Query(ctx, `select id, plan from accounts where kind = 'org'`)
	if err != nil {
		return 0, nil, fmt.Errorf("read orgs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var plan *string
		if err := rows.Scan(&id, &plan); err != nil {
			return 0, nil, fmt.Errorf("read orgs: %w", err)
		}
		orgPlan[id] = pr.smallest
		if plan != nil {
			if _, ok := pr.plans[*plan]; ok {
				orgPlan[id] = *plan
			}
		}
	}
	if err := rows.Err(); err != nil {
		return 0, nil, fmt.Errorf("read orgs: %w", err)
	}
	planOf := func(org string) string {
		if p, ok := orgPlan[org]; ok {
			return p
		}
		return pr.smallest // an org no longer in accounts: the smallest plan, as admit clamps
	}

	// What an org's own data makes impossible to invoice (a sum past bigint): that org
	// fails, the others are issued. The sums are numeric, read as text, so that one org's
	// does not abort the statement for all.
	bad := map[string]error{}
	usage := map[string][]Usage{}
	rows, err = tx.Query(ctx, `
		select org, account_path, sum(billable_requests)::text, sum(billable_tokens)::text,
		       sum(billable_credits)::text, sum(billable_cost_micros)::text
		from finance_billable_events
		where billing_period = $1 and not late
		group by org, account_path`, period)
	if err != nil {
		return 0, nil, fmt.Errorf("read usage: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var org, path string
		var raw [4]string
		if err := rows.Scan(&org, &path, &raw[0], &raw[1], &raw[2], &raw[3]); err != nil {
			return 0, nil, fmt.Errorf("read usage: %w", err)
		}
		for i, unit := range units {
			q, err := parseSum(raw[i])
			if err != nil {
				bad[org] = fmt.Errorf("usage of %s by %s: %w", unit, path, err)
			}
			usage[org] = append(usage[org], Usage{AccountPath: path, Unit: unit, Quantity: q})
		}
	}
	if err := rows.Err(); err != nil {
		return 0, nil, fmt.Errorf("read usage: %w", err)
	}

	// What the org's own credit grants covered of the same events (credits_covered).
	covered := map[string]map[string]int64{}
	rows, err = tx.Query(ctx, `
		select org, unit, sum(covered)::text
		from credits_covered
		where billing_period = $1 and not late
		group by org, unit`, period)
	if err != nil {
		return 0, nil, fmt.Errorf("read covered usage: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var org, unit, raw string
		if err := rows.Scan(&org, &unit, &raw); err != nil {
			return 0, nil, fmt.Errorf("read covered usage: %w", err)
		}
		q, err := parseSum(raw)
		if err != nil {
			bad[org] = fmt.Errorf("covered %s: %w", unit, err)
		}
		if covered[org] == nil {
			covered[org] = map[string]int64{}
		}
		covered[org][unit] = q
	}
	if err := rows.Err(); err != nil {
		return 0, nil, fmt.Errorf("read covered usage: %w", err)
	}

	late, err := loadLate(ctx, tx, period)
	if err != nil {
		return 0, nil, err
	}
	corrections, err := loadCorrections(ctx, tx, period)
	if err != nil {
		return 0, nil, err
	}
	earlier, err := earlierFailures(ctx, tx, period)
	if err != nil {
		return 0, nil, err
	}

	orgs := map[string]bool{}
	if only != nil {
		for _, org := range only {
			orgs[org] = true
		}
	} else {
		for org := range usage {
			orgs[org] = true
		}
		for _, e := range late {
			orgs[e.org] = true
		}
		for _, c := range corrections {
			orgs[c.org] = true
		}
		var active []string
		rows, err = tx.Query(ctx, `select id from accounts where kind = 'org' and created_at < $1`, end)
		if err != nil {
			return 0, nil, fmt.Errorf("read active orgs: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return 0, nil, fmt.Errorf("read active orgs: %w", err)
			}
			active = append(active, id)
		}
		if err := rows.Err(); err != nil {
			return 0, nil, fmt.Errorf("read active orgs: %w", err)
		}
		for _, id := range active {
			if pr.plans[planOf(id)].BaseFeeMinor > 0 {
				orgs[id] = true
			}
		}
	}

	sorted := make([]string, 0, len(orgs))
	for org := range orgs {
		sorted = append(sorted, org)
	}
	sort.Strings(sorted)
	for _, org := range sorted {
		err := bad[org]
		if p, ok := earlier[org]; ok && err == nil {
			err = fmt.Errorf("the org's invoice for %s is not issued (a failed close): close %s again first",
				p.Format("2006-01"), p.Format("2006-01"))
		}
		if err == nil {
			var mine []lateEvent
			for _, e := range late {
				if e.org == org {
					mine = append(mine, e)
				}
			}
			var theirs []correction
			for _, c := range corrections {
				if c.org == org {
					theirs = append(theirs, c)
				}
			}
			err = issueOrg(ctx, tx, pr, planOf(org), org, period, closedAt, usage[org], covered[org], mine, theirs)
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
	return issued, failed, nil
}

// issueOrg writes one org's invoice of period under a savepoint of tx: on an error nothing
// of it is written, and tx goes on. An error of the connection shows in the rollback, and
// stops the close.
func issueOrg(ctx context.Context, tx pgx.Tx, pr prices, planID, org string, period, closedAt time.Time,
	usage []Usage, covered map[string]int64, late []lateEvent, corrections []correction) (err error) {
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
	plan, err := pr.plan(planID)
	if err != nil {
		return err
	}
	lines, err := Price(plan, org, usage, covered)
	if err != nil {
		return fmt.Errorf("price org %s: %w", org, err)
	}
	// Corrections first: they bring what was billed for a period up (or down) to what is
	// billable, and the late lines are priced at the margin after them.
	billed := map[[2]string]billedUnits{}
	for _, c := range corrections {
		l, err := priceCorrection(pr, plan, c)
		if err != nil {
			return fmt.Errorf("price correction of org %s: %w", org, err)
		}
		lines = append(lines, l...)
		billed[[2]string{c.period.Format(dateLayout), c.unit}] = billedUnits{quantity: c.billable, covered: c.covered}
	}
	lateLines, err := priceLate(ctx, sp, pr, plan, org, late, billed)
	if err != nil {
		return fmt.Errorf("price late events of org %s: %w", org, err)
	}
	lines = append(lines, lateLines...)
	total, err := Sum(lines)
	if err != nil {
		return fmt.Errorf("org %s: %w", org, err)
	}
	var id int64
	if err := sp.QueryRow(ctx, `
		insert into invoices (org, period, plan, price_version, currency, subtotal_minor, total_minor, issued_at, status)
		values ($1, $2, $3, $4, $5, $6, $6, $7, 'issued') returning id`,
		org, period, plan.ID, plan.Version, plan.Currency, total, closedAt).Scan(&id); err != nil {
		return fmt.Errorf("insert invoice of org %s: %w", org, err)
	}
	if err := insertLines(ctx, sp, id, lines); err != nil {
		return fmt.Errorf("insert lines of org %s: %w", org, err)
	}
	if len(late) > 0 {
		ids := make([]string, len(late))
		periods := make([]time.Time, len(late))
		for i, e := range late {
			ids[i], periods[i] = e.eventID, e.period
		}
		if _, err := sp.Exec(ctx, `insert into invoice_late_events (event_id, billing_period, invoice_id)
			select * , $3::bigint from unnest($1::text[], $2::date[])`, ids, periods, id); err != nil {
			return fmt.Errorf("record late events of org %s: %w", org, err)
		}
	}
	return nil
}

// units are the billing log's units, in the order of finance_billable_events' billable_*.
var units = []string{"requests", "tokens", "credits", "cost_micros"}

func insertLines(ctx context.Context, tx pgx.Tx, id int64, lines []Line) error {
	rows := make([][]any, len(lines))
	for i, l := range lines {
		var unit, forPeriod any
		if l.Unit != "" {
			unit = l.Unit
		}
		if l.ForPeriod != "" {
			forPeriod = l.ForPeriod
		}
		rows[i] = []any{id, i + 1, l.Kind, l.AccountPath, unit, l.Quantity, l.UnitPriceMinor, l.PerUnits, l.AmountMinor, forPeriod}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"invoice_lines"},
		[]string{"invoice_id", "line_no", "kind", "account_path", "unit", "quantity", "unit_price_minor", "per_units", "amount_minor", "for_period"},
		pgx.CopyFromRows(rows))
	return err
}

// loadLate reads the late events not billed yet of the closed periods before period: events
// flagged late by the meter, or ingested after their period's close.
func loadLate(ctx context.Context, tx pgx.Tx, period time.Time) ([]lateEvent, error) {
	rows, err := tx.Query(ctx, `
		select l.event_id, l.billing_period, l.org, l.account_path,
		       l.billable_requests, l.billable_tokens, l.billable_credits, l.billable_cost_micros,
		       c.requests, c.tokens, c.credits, c.cost_micros
		from finance_late_events l
		cross join lateral (
			select coalesce(sum(covered) filter (where unit = 'requests'), 0)::bigint as requests,
			       coalesce(sum(covered) filter (where unit = 'tokens'), 0)::bigint as tokens,
			       coalesce(sum(covered) filter (where unit = 'credits'), 0)::bigint as credits,
			       coalesce(sum(covered) filter (where unit = 'cost_micros'), 0)::bigint as cost_micros
			from credits_covered c where c.event_id = l.event_id and c.billing_period = l.billing_period) c
		where l.billed_on is null and l.billing_period < $1
		order by l.billing_period, l.org, l.account_path, l.event_id`, period)
	if err != nil {
		return nil, fmt.Errorf("read late events: %w", err)
	}
	defer rows.Close()
	var out []lateEvent
	for rows.Next() {
		var e lateEvent
		var q, c [4]int64
		if err := rows.Scan(&e.eventID, &e.period, &e.org, &e.path, &q[0], &q[1], &q[2], &q[3], &c[0], &c[1], &c[2], &c[3]); err != nil {
			return nil, fmt.Errorf("read late events: %w", err)
		}
		e.units, e.covered = map[string]int64{}, map[string]int64{}
		for i, u := range units {
			e.units[u], e.covered[u] = q[i], c[i]
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read late events: %w", err)
	}
	return out, nil
}

// billedUnits is what was billed for a closed period and unit so far: units (usage, late
// and adjustment lines) and, of them, the units credits covered (credits_applied lines).
// The tiers priced quantity − covered.
type billedUnits struct {
	quantity, covered int64
}

// priceLate prices late events at the margin of the period they belong to: with B units
// already billed for that period (its invoice's usage lines and earlier late lines), Cb of
// them covered by credits, and L late ones of which the org's credits covered C, they cost
// price(B−Cb+L−C) − price(B−Cb), under the plan of that period's invoice and the price
// version it was priced with (the current plan if the org had none). One late line per
// period, account path and unit, each the margin over the lines before it, so the lines add
// up to the exact margin; each followed by a credits_applied line (amount 0) of its C when
// C > 0.
func priceLate(ctx context.Context, tx pgx.Tx, pr prices, current Plan, org string, events []lateEvent, billed map[[2]string]billedUnits) ([]Line, error) {
	type key struct {
		period time.Time
		path   string
		unit   string
	}
	qty, cov := map[key]int64{}, map[key]int64{}
	var keys []key
	for _, e := range events {
		for _, u := range units {
			if e.units[u] == 0 {
				continue
			}
			k := key{e.period, e.path, u}
			if _, ok := qty[k]; !ok {
				keys = append(keys, k)
			}
			qty[k] += e.units[u]
			cov[k] += min(e.covered[u], e.units[u])
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if !a.period.Equal(b.period) {
			return a.period.Before(b.period)
		}
		if a.unit != b.unit {
			return a.unit < b.unit
		}
		return a.path < b.path
	})
	// billed: (period, unit) → units billed so far, when a correction set it already.
	var lines []Line
	for _, k := range keys {
		pk := [2]string{k.period.Format(dateLayout), k.unit}
		plan := current
		var priced priceKey
		err := tx.QueryRow(ctx, `select plan, price_version from invoices where org = $1 and period = $2`, org, k.period).Scan(&priced.plan, &priced.version)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return nil, fmt.Errorf("read invoice plan: %w", err)
		default:
			p, err := pr.version(priced)
			if err != nil {
				return nil, fmt.Errorf("the %s invoice: %w", pk[0], err)
			}
			plan = p
		}
		if plan.Currency != current.Currency {
			return nil, fmt.Errorf("late units of %s were priced in %s, the invoice is in %s", pk[0], plan.Currency, current.Currency)
		}
		var up *UnitPrice
		for i := range plan.Units {
			if plan.Units[i].Unit == k.unit {
				up = &plan.Units[i]
			}
		}
		if up == nil {
			continue // a unit the plan does not bill
		}
		if _, ok := billed[pk]; !ok {
			var b billedUnits
			if err := tx.QueryRow(ctx, `
				select coalesce(sum(l.quantity) filter (where i.period = $2 and l.kind = 'usage'), 0)::bigint
				     + coalesce(sum(l.quantity) filter (where l.kind in ('late', 'adjustment') and l.for_period = $2), 0)::bigint,
				       coalesce(sum(l.quantity) filter (where l.kind = 'credits_applied' and coalesce(l.for_period, i.period) = $2), 0)::bigint
				from invoices i join invoice_lines l on l.invoice_id = i.id
				where i.org = $1 and l.unit = $3`, org, k.period, k.unit).Scan(&b.quantity, &b.covered); err != nil {
				return nil, fmt.Errorf("read billed units: %w", err)
			}
			billed[pk] = b
		}
		b := billed[pk]
		before, err := up.Amount(b.quantity - b.covered)
		if err != nil {
			return nil, err
		}
		after, err := up.Amount(b.quantity - b.covered + qty[k] - cov[k])
		if err != nil {
			return nil, err
		}
		billed[pk] = billedUnits{quantity: b.quantity + qty[k], covered: b.covered + cov[k]}
		lines = append(lines, Line{Kind: KindLate, AccountPath: k.path, Unit: k.unit, Quantity: qty[k],
			PerUnits: 1, AmountMinor: after - before, ForPeriod: pk[0]})
		if cov[k] > 0 {
			lines = append(lines, Line{Kind: KindCreditsApplied, AccountPath: k.path, Unit: k.unit, Quantity: cov[k],
				PerUnits: 1, ForPeriod: pk[0]})
		}
	}
	return lines, nil
}

// correctionWindow is how far back a close looks for closed periods whose billable usage
// changed after their close (outcomes reported late: a 5xx refunds, actual tokens settle).
const correctionWindow = 3

type correction struct {
	org, plan, unit  string
	version          int // the price version of the period's invoice
	period           time.Time
	billed, billable int64
	// billedCovered is what credits_applied lines for the period said credits covered;
	// covered is what the org's credits cover of the period's billed events now.
	billedCovered, covered int64
}

// loadCorrections reads, for the closed periods of the correctionWindow months before
// period, every (org, period, unit) whose billed units differ from its billable units now,
// or whose credits applied differ from what the org's credits cover now
// (finance_period_billing).
func loadCorrections(ctx context.Context, tx pgx.Tx, period time.Time) ([]correction, error) {
	var out []correction
	for m := correctionWindow; m >= 1; m-- {
		// One period per query: the equality reaches into the view's grouped subqueries.
		rows, err := tx.Query(ctx, `
			select org, plan, price_version, unit, billed_quantity, billable_quantity, billed_covered, covered_quantity
			from finance_period_billing
			where period = $1 and (billed_quantity <> billable_quantity or billed_covered <> covered_quantity)
			order by org, unit`, period.AddDate(0, -m, 0))
		if err != nil {
			return nil, fmt.Errorf("read corrections: %w", err)
		}
		for rows.Next() {
			c := correction{period: period.AddDate(0, -m, 0)}
			if err := rows.Scan(&c.org, &c.plan, &c.version, &c.unit, &c.billed, &c.billable, &c.billedCovered, &c.covered); err != nil {
				rows.Close()
				return nil, fmt.Errorf("read corrections: %w", err)
			}
			out = append(out, c)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read corrections: %w", err)
		}
	}
	return out, nil
}

// priceCorrection prices the change from billed to billable units of a closed period at its
// margin, under that period's invoice's plan and price version: price(billable − covered) −
// price(billed − billed covered), negative for a refund, as an adjustment line (left out
// when both its quantity and amount are 0), then a credits_applied line (amount 0) of the
// change in covered units when there is one. nil when the plan does not bill the unit.
func priceCorrection(pr prices, current Plan, c correction) ([]Line, error) {
	plan, err := pr.version(priceKey{c.plan, c.version})
	if err != nil {
		return nil, fmt.Errorf("the %s invoice: %w", period.MonthLabel(c.period), err)
	}
	if plan.Currency != current.Currency {
		return nil, fmt.Errorf("units of %s were priced in %s, the invoice is in %s", period.MonthLabel(c.period), plan.Currency, current.Currency)
	}
	for _, up := range plan.Units {
		if up.Unit != c.unit {
			continue
		}
		before, err := up.Amount(c.billed - c.billedCovered)
		if err != nil {
			return nil, err
		}
		after, err := up.Amount(c.billable - c.covered)
		if err != nil {
			return nil, err
		}
		var lines []Line
		if c.billable != c.billed || after != before {
			lines = append(lines, Line{Kind: KindAdjustment, AccountPath: c.org, Unit: c.unit, Quantity: c.billable - c.billed,
				PerUnits: 1, AmountMinor: after - before, ForPeriod: c.period.Format(dateLayout)})
		}
		if c.covered != c.billedCovered {
			lines = append(lines, Line{Kind: KindCreditsApplied, AccountPath: c.org, Unit: c.unit, Quantity: c.covered - c.billedCovered,
				PerUnits: 1, ForPeriod: c.period.Format(dateLayout)})
		}
		return lines, nil
	}
	return nil, nil
}

// priceKey names one price version of a plan.
type priceKey struct {
	plan    string
	version int
}

// prices are the price versions a close prices with.
type prices struct {
	plans    map[string]Plan   // per plan, the version that prices the period
	versions map[priceKey]Plan // every version
	invalid  map[priceKey]error
	smallest string // the plan of an org with an unknown or missing plan
}

// plan is the version of plan id that prices the period, or why there is none to use.
func (p prices) plan(id string) (Plan, error) {
	v, ok := p.plans[id]
	if !ok {
		return Plan{}, fmt.Errorf("plan %s has no price for the period", id)
	}
	if err := p.invalid[priceKey{v.ID, v.Version}]; err != nil {
		return Plan{}, err
	}
	return v, nil
}

// version is price version k, or why it cannot be used.
func (p prices) version(k priceKey) (Plan, error) {
	v, ok := p.versions[k]
	if !ok {
		return Plan{}, fmt.Errorf("price version %d of plan %s is gone", k.version, k.plan)
	}
	if err := p.invalid[k]; err != nil {
		return Plan{}, err
	}
	return v, nil
}

// loadPlans reads every price version and, per plan, the version that prices period (plans
// without one are unpriced for the period), and the smallest plan (lowest rank), which an
// org with an unknown or missing plan is billed on, as admit clamps it. A version that does
// not validate is kept with its error: only the orgs priced with it fail.
func loadPlans(ctx context.Context, tx pgx.Tx, period time.Time) (prices, error) {
	all, invalid, err := readPrices(ctx, tx, "")
	if err != nil {
		return prices{}, err
	}
	pr := prices{plans: map[string]Plan{}, versions: make(map[priceKey]Plan, len(all)), invalid: invalid}
	for _, p := range all { // by plan and version: the last effective one wins
		pr.versions[priceKey{p.ID, p.Version}] = p
		if !p.EffectivePeriod.After(period) {
			pr.plans[p.ID] = p
		}
	}
	if err := tx.QueryRow(ctx, `select id from plans order by rank limit 1`).Scan(&pr.smallest); err != nil {
		return prices{}, fmt.Errorf("read the smallest plan: %w", err)
	}
	return pr, nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// loadInvoices reads the invoices of a period (of one org when org is not empty), with
// their lines, ordered by org and line number.
func loadInvoices(ctx context.Context, q querier, period time.Time, org string) ([]Invoice, error) {
	rows, err := q.Query(ctx, `
		select i.id, i.org, i.period::text, i.plan, i.price_version, i.currency, i.subtotal_minor, i.total_minor, i.issued_at, i.status,
		       l.kind, l.account_path, coalesce(l.unit, ''), l.quantity, l.unit_price_minor, l.per_units, l.amount_minor,
		       coalesce(l.for_period::text, '')
		from invoices i join invoice_lines l on l.invoice_id = i.id
		where i.period = $1 and ($2 = '' or i.org = $2)
		order by i.org, l.line_no`, period, org)
	if err != nil {
		return nil, fmt.Errorf("read invoices: %w", err)
	}
	defer rows.Close()
	var out []Invoice
	for rows.Next() {
		var inv Invoice
		var l Line
		if err := rows.Scan(&inv.ID, &inv.Org, &inv.Period, &inv.Plan, &inv.PriceVersion, &inv.Currency, &inv.SubtotalMinor, &inv.TotalMinor,
			&inv.IssuedAt, &inv.Status, &l.Kind, &l.AccountPath, &l.Unit, &l.Quantity, &l.UnitPriceMinor, &l.PerUnits,
			&l.AmountMinor, &l.ForPeriod); err != nil {
			return nil, fmt.Errorf("read invoices: %w", err)
		}
		if n := len(out); n == 0 || out[n-1].ID != inv.ID {
			out = append(out, inv)
		}
		out[len(out)-1].Lines = append(out[len(out)-1].Lines, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read invoices: %w", err)
	}
	return out, nil
}
