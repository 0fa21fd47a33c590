package demo

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/metergate/metergate/internal/invoice"
)

// Report is what a demo run saw and found.
type Report struct {
	Duration time.Duration
	Where    string   // the database or schema used
	Periods  []string // billing months of the admitted events (YYYY-MM)

	// Requests the callers sent; Decisions by status (200, 429, 402); Replays: 200s
	// answered from an idempotency record; Errors: other replies ("503 unavailable") and
	// failed outcome reports ("outcome ..."), by status and code.
	Requests  int
	Decisions map[int]int
	Replays   int
	// Insufficient: the 402s of a spent balance (insufficient_balance), of Decisions[402];
	// the others are quotas (quota_exceeded).
	Insufficient int
	// Estimated: 200s charged the tokens admit estimated from the model request.
	Estimated int
	Errors    map[string]int
	// Blocked: the 429s and 402s by the limit that refused (blocked_by).
	Blocked []Blocked

	// Admitted: distinct event ids of the 200s; Rows: rows of usage_events; Missing:
	// admitted ids without a row; Unexpected: rows of ids no caller got; Duplicates: rows
	// beyond one per id.
	Admitted, Rows, Missing, Unexpected, Duplicates int
	// Outcomes accepted by admit, of them 5xx and with actual tokens; OutcomesMetered:
	// rows of usage_outcomes.
	OutcomesReported, Outcomes5xx, OutcomesActual, OutcomesMetered int
	DrainTime                                                      time.Duration

	// Guarantees: the tree's tokens guarantees and what the traffic under each was admitted.
	Guarantees []Guarantee
	// Borrowings: finance_borrowing's rows; BorrowedUnits the sum of usage_borrowings'
	// units, BorrowedView of finance_borrowing's (equal: the demo voids nothing).
	// ExpectBorrowing: the scenario's traffic goes past a guarantee, so something must
	// have been borrowed.
	Borrowings                  []Borrowing
	BorrowedUnits, BorrowedView int64
	ExpectBorrowing             bool

	// Waits: the requests sent with max_wait_ms, by account.
	Waits []Wait

	// Credits: the prepaid org's grants, calls and books.
	Credits Credits

	// Alerts: the thresholds fired and their webhook deliveries.
	Alerts Alerts

	// Reconcile is reconcile's summary; Adjustments the adjustments table grouped.
	Reconcile   Summary
	Adjustments []Adjustment
	// Invoices as exported by reconcile invoice, one per org and closed period.
	Invoices []invoice.Invoice
	// Documents: the invoices' PDFs, and the void of the first with its credit note.
	Documents Documents
	// Verified: reconcile verify passed after the close.
	Verified bool
	// Problems are the steps after the traffic that failed (reconcile, close, verify,
	// a stop that was not clean).
	Problems []string
	// Printed: Run printed the report (its FAIL lines included).
	Printed bool
}

// Adjustment is a group of adjustments rows: one kind and counter (level, account, unit).
type Adjustment struct {
	Kind, Level, Account, Unit string
	Rows                       int
	Amount                     int64 // sum of the deltas
	NotApplied                 int
}

// Guarantee is a tokens limit with a ceiling in the tree, and the tokens the requests
// under it were admitted (estimates as charged at admission).
type Guarantee struct {
	Account                  string
	Unit                     string
	RatePerS, Burst, Ceiling int64
	// Admitted: tokens admitted to the requests of accounts under it; Refused: their 429s
	// for tokens by its own limit or one above (the lender's: no spare), not by a limit
	// below it.
	Admitted int64
	Refused  int
	callers  []string // accounts under it whose keys send requests
	above    []string // it and its ancestors
}

// Wait counts an account's requests that could wait for capacity (max_wait_ms). A request
// waited when admit held it at least waitThreshold (its waited_ms); Total and Max are over
// those.
type Wait struct {
	Account  string
	Priority int
	Sent     int
	// AdmittedAtOnce and RefusedAtOnce did not wait (a refusal at once: the request's turn
	// was further away than its max_wait_ms); AdmittedAfterWait were admitted after waiting,
	// OutOfTime refused when their wait ran out.
	AdmittedAtOnce, RefusedAtOnce, AdmittedAfterWait, OutOfTime int
	Total, Max                                                  time.Duration
}

// Waited is how many of the requests waited.
func (w Wait) Waited() int { return w.AdmittedAfterWait + w.OutOfTime }

// Credits is what the prepaid org (prepaidOrg) was granted, what its calls saw, and its
// balance in the ledger and in Redis after the drain and reconcile.
type Credits struct {
	Account, Unit string
	// Expect: the scenario has a prepaid org, so its books are checked.
	Expect bool
	// Grants made: the first (sent twice: RetryID is the grant the retry was answered
	// with), then the top-up (At: since the traffic began).
	Grants  []GrantMade
	RetryID string
	// Its calls: sent, admitted (Charged: their units), refused 402 insufficient_balance
	// (the first FirstRefusal after the traffic began), admitted after the top-up, and
	// admitted ones that ended in a 5xx.
	Sent, Admitted, Refused, AdmittedAfterTopUp, FiveXX int
	RefusedAfterTopUp                                   int // 402s once the top-up was spent too
	Charged                                             int64
	FirstRefusal                                        time.Duration
	TopUpErr                                            string
	// Ledger is finance_credit_balances' row; Refunds the refund rows of credit_adjustments
	// (RefundedUnits their units, RefundsNotApplied not yet applied to Redis).
	Ledger            CreditLedger
	Refunds           int
	RefundedUnits     int64
	RefundsNotApplied int
	Redis             int64 // GET /v1/balance/{account}: what Redis holds
	Read              bool  // Ledger, Refunds and Redis were read
}

// GrantMade is a grant the demo made through the admin API.
type GrantMade struct {
	ID     string
	Amount int64
	Key    string        // idempotency key
	At     time.Duration // since the traffic began (0: before it)
}

// CreditLedger is a row of finance_credit_balances.
type CreditLedger struct {
	Granted, Consumed, Refunded, Voided, Expired, Balance int64
}

// TiesOut reports whether balance = granted - consumed + refunded - voided - expired.
func (l CreditLedger) TiesOut() bool {
	return l.Balance == l.Granted-l.Consumed+l.Refunded-l.Voided-l.Expired
}

// check returns what is wrong with the prepaid org's books and run.
func (c Credits) check() []error {
	if !c.Expect || !c.Read { // not read: a problem of the report already
		return nil
	}
	var errs []error
	l := c.Ledger
	if !l.TiesOut() {
		errs = append(errs, fmt.Errorf("%s %s: ledger balance %d ≠ granted %d - consumed %d + refunded %d - voided %d - expired %d",
			c.Account, c.Unit, l.Balance, l.Granted, l.Consumed, l.Refunded, l.Voided, l.Expired))
	}
	if c.Redis != l.Balance {
		errs = append(errs, fmt.Errorf("%s %s: balance in Redis %d ≠ ledger %d", c.Account, c.Unit, c.Redis, l.Balance))
	}
	if c.Charged != l.Consumed {
		errs = append(errs, fmt.Errorf("%s %s: the callers were admitted %d, the ledger consumed %d", c.Account, c.Unit, c.Charged, l.Consumed))
	}
	var granted int64
	for _, g := range c.Grants {
		granted += g.Amount
	}
	if granted != l.Granted {
		errs = append(errs, fmt.Errorf("%s %s: granted %d through the API, %d in the ledger", c.Account, c.Unit, granted, l.Granted))
	}
	if len(c.Grants) == 0 || c.RetryID != c.Grants[0].ID {
		errs = append(errs, fmt.Errorf("%s: the retried grant was answered %q, not the first grant", c.Account, c.RetryID))
	}
	if c.RefundsNotApplied > 0 {
		errs = append(errs, fmt.Errorf("%s: %d credit refunds not applied to Redis", c.Account, c.RefundsNotApplied))
	}
	switch {
	case c.Refused == 0:
		errs = append(errs, fmt.Errorf("%s never ran out of balance (no 402 insufficient_balance)", c.Account))
	case c.TopUpErr != "":
		errs = append(errs, fmt.Errorf("%s: top-up: %s", c.Account, c.TopUpErr))
	case len(c.Grants) < 2:
		errs = append(errs, fmt.Errorf("%s was not topped up during the traffic", c.Account))
	case c.AdmittedAfterTopUp == 0:
		errs = append(errs, fmt.Errorf("%s: no call passed after the top-up", c.Account))
	}
	return errs
}

// Borrowing is a row of finance_borrowing: what account borrowed of lender's spare.
type Borrowing struct {
	Account, Lender, Unit, Period string
	Events, Units                 int64
}

// Check is the demo's verdict: every admitted event recorded exactly once, every reported
// outcome metered.
func (r *Report) Check() error {
	var errs []error
	if r.Admitted == 0 {
		errs = append(errs, errors.New("no request was admitted"))
	}
	if r.Admitted != r.Rows || r.Missing != 0 || r.Unexpected != 0 || r.Duplicates != 0 {
		errs = append(errs, fmt.Errorf("admitted %d ≠ recorded %d (missing %d, unexpected %d, duplicates %d)",
			r.Admitted, r.Rows, r.Missing, r.Unexpected, r.Duplicates))
	}
	if r.OutcomesMetered != r.OutcomesReported {
		errs = append(errs, fmt.Errorf("outcomes reported %d ≠ metered %d", r.OutcomesReported, r.OutcomesMetered))
	}
	if r.BorrowedView != r.BorrowedUnits {
		errs = append(errs, fmt.Errorf("borrowed units: finance_borrowing %d ≠ usage_borrowings %d", r.BorrowedView, r.BorrowedUnits))
	}
	if r.ExpectBorrowing && r.BorrowedUnits <= 0 {
		errs = append(errs, errors.New("nothing borrowed: the traffic should have gone past a guarantee"))
	}
	errs = append(errs, r.Credits.check()...)
	errs = append(errs, r.Alerts.check()...)
	if len(r.Invoices) > 0 && (len(r.Documents.PDFs) != len(r.Invoices) || r.Documents.CreditNote == nil) {
		errs = append(errs, fmt.Errorf("documents: %d PDFs of %d invoices, credit note %v", len(r.Documents.PDFs), len(r.Invoices), r.Documents.CreditNote != nil))
	}
	for _, p := range r.Problems {
		errs = append(errs, errors.New(p))
	}
	if n := len(r.Reconcile.InvariantFailures); n > 0 {
		errs = append(errs, fmt.Errorf("reconcile: %d invariant failures: %s", n, strings.Join(r.Reconcile.InvariantFailures, "; ")))
	}
	return errors.Join(errs...)
}

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "════ metergate demo report: %s of traffic, period %s ════\n", r.Duration, strings.Join(r.Periods, ", "))

	fmt.Fprintf(w, "\nDecisions (%s requests through pkg/client)\n", num(int64(r.Requests)))
	statuses := []int{200, 429, 402}
	for s := range r.Decisions {
		if s != 200 && s != 429 && s != 402 {
			statuses = append(statuses, s)
		}
	}
	sort.Ints(statuses[3:])
	names := map[int]string{200: "allow", 429: "rate_limited", 402: "quota_exceeded"}
	for _, s := range statuses {
		n := r.Decisions[s]
		if s == 402 {
			n -= r.Insufficient
		}
		var notes []string
		if s == 200 && r.Replays > 0 {
			notes = append(notes, fmt.Sprintf("%d of them replays of an idempotency key: same event id, charged once", r.Replays))
		}
		if s == 200 && r.Estimated > 0 {
			notes = append(notes, fmt.Sprintf("%d charged the tokens admit estimated from the model request", r.Estimated))
		}
		note := ""
		if len(notes) > 0 {
			note = "   (" + strings.Join(notes, "; ") + ")"
		}
		fmt.Fprintf(w, "  %-24s %8s%s\n", fmt.Sprintf("%d %s", s, names[s]), num(int64(n)), note)
		if s == 402 && r.Insufficient > 0 {
			fmt.Fprintf(w, "  %-24s %8s\n", "402 insufficient_balance", num(int64(r.Insufficient)))
		}
	}
	errKeys := make([]string, 0, len(r.Errors))
	for k := range r.Errors {
		errKeys = append(errKeys, k)
	}
	sort.Strings(errKeys)
	for _, k := range errKeys {
		fmt.Fprintf(w, "  %-24s %8s\n", "error "+k, num(int64(r.Errors[k])))
	}
	if len(errKeys) == 0 {
		fmt.Fprintf(w, "  %-24s %8s\n", "errors", "0")
	}

	fmt.Fprintf(w, "\nRefusals by blocking level (blocked_by: level, account, unit)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, b := range r.Blocked {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%8s\n", b.Status, b.Level, b.Account, b.Unit, num(int64(b.Count)))
	}
	if len(r.Blocked) == 0 {
		fmt.Fprintf(tw, "  (none)\n")
	}
	tw.Flush()

	fmt.Fprintf(w, "\nBilling log (admit → Redis outbox → relay → Kafka → meter → PostgreSQL)\n")
	fmt.Fprintf(w, "  %-46s %8s\n", "events admitted (distinct event ids of the 200s)", num(int64(r.Admitted)))
	fmt.Fprintf(w, "  %-46s %8s   missing %d, unexpected %d, duplicates %d\n", "rows in usage_events", num(int64(r.Rows)), r.Missing, r.Unexpected, r.Duplicates)
	fmt.Fprintf(w, "  %-46s %8s   of %s reported (%d with a 5xx, %d with actual tokens)\n", "rows in usage_outcomes",
		num(int64(r.OutcomesMetered)), num(int64(r.OutcomesReported)), r.Outcomes5xx, r.OutcomesActual)
	fmt.Fprintf(w, "  %-46s %8s\n", "drained after the traffic ended in", r.DrainTime.Round(10*time.Millisecond))

	r.printBorrowing(w)
	r.printWaiting(w)
	r.printCredits(w)
	r.printAlerts(w)

	s := r.Reconcile
	kinds := make([]string, 0, len(s.ByKind))
	for k, n := range s.ByKind {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	fmt.Fprintf(w, "\nAdjustments (reconcile run %s: %d corrections applied [%s], drift %d, invariant failures %d)\n",
		short(s.RunID), s.AdjustmentsApplied, strings.Join(kinds, ", "), s.DriftFound, len(s.InvariantFailures))
	fmt.Fprintf(w, "  %-14s %-6s %-12s %-9s %6s %12s\n", "kind", "level", "account", "unit", "rows", "units")
	for _, a := range r.Adjustments {
		extra := ""
		if a.NotApplied > 0 {
			extra = fmt.Sprintf("   %d not applied", a.NotApplied)
		}
		fmt.Fprintf(w, "  %-14s %-6s %-12s %-9s %6d %12s%s\n", a.Kind, a.Level, a.Account, a.Unit, a.Rows, signed(a.Amount), extra)
	}
	if len(r.Adjustments) == 0 {
		fmt.Fprintf(w, "  (none)\n")
	}

	fmt.Fprintf(w, "\nInvoices (reconcile close -force, then reconcile invoice -format json)\n")
	for _, inv := range r.Invoices {
		fmt.Fprintf(w, "\n  %s  %s  plan %s  invoice %s  %s  subtotal %s  tax %s  total %s\n", inv.Org, inv.Period[:min(7, len(inv.Period))],
			inv.Plan, inv.Number, inv.Status, money(inv.SubtotalMinor, inv.Currency), money(inv.TaxMinor, inv.Currency), money(inv.TotalMinor, inv.Currency))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, l := range inv.Lines {
			price := ""
			if l.Kind != "base_fee" && l.PerUnits > 0 && l.UnitPriceMinor > 0 {
				price = fmt.Sprintf("%s per %s", money(l.UnitPriceMinor, inv.Currency), num(l.PerUnits))
			}
			qty := num(l.Quantity)
			if l.Kind == "base_fee" {
				qty = ""
			}
			fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t%s\n", l.Kind, l.AccountPath, l.Unit, qty, price, money(l.AmountMinor, inv.Currency))
		}
		tw.Flush()
	}
	for _, p := range r.Documents.PDFs {
		fmt.Fprintf(w, "\n  PDF written: %s", p)
	}
	if n := r.Documents.CreditNote; n != nil {
		fmt.Fprintf(w, "\n\n  invoice %s voided: credit note %s of %s (GET /v1/admin/credit-notes/%d.pdf)\n", r.Documents.Voided, n.Number,
			money(n.TotalMinor, n.Currency), n.ID)
	}
	if r.Verified {
		fmt.Fprintf(w, "\nreconcile verify: every quota counter equals its billable total; every invoice ties out\n")
	}

	if err := r.Check(); err != nil {
		fmt.Fprintf(w, "\nFAIL: %v\n", err)
		return
	}
	fmt.Fprintf(w, "\nOK: %s events admitted, %s recorded in PostgreSQL, each exactly once\n", num(int64(r.Admitted)), num(int64(r.Rows)))
}

// printBorrowing writes the guarantees and what was borrowed beyond them.
func (r *Report) printBorrowing(w io.Writer) {
	fmt.Fprintf(w, "\nBorrowing (guarantees with a ceiling: usage_borrowings, finance_borrowing)\n")
	secs := r.Duration.Seconds()
	for _, g := range r.Guarantees {
		fmt.Fprintf(w, "  %-12s guaranteed %s %s/s (burst %s), ceiling %s: admitted %s = %s/s; refused for %s by it or above: %d\n",
			g.Account, g.Unit, num(g.RatePerS), num(g.Burst), num(g.Ceiling), num(g.Admitted), num(int64(float64(g.Admitted)/secs)), g.Unit, g.Refused)
	}
	fmt.Fprintf(w, "  %-12s %-8s %-7s %-7s %7s %14s\n", "account", "lender", "unit", "period", "events", "units borrowed")
	for _, b := range r.Borrowings {
		fmt.Fprintf(w, "  %-12s %-8s %-7s %-7s %7s %14s\n", b.Account, b.Lender, b.Unit, b.Period, num(b.Events), num(b.Units))
	}
	if len(r.Borrowings) == 0 {
		fmt.Fprintf(w, "  (nothing borrowed)\n")
	}
	fmt.Fprintf(w, "  units borrowed: %s in finance_borrowing, %s in usage_borrowings\n", num(r.BorrowedView), num(r.BorrowedUnits))
}

// printWaiting writes what the requests that could wait saw, highest priority first.
func (r *Report) printWaiting(w io.Writer) {
	fmt.Fprintf(w, "\nWaiting (max_wait_ms: a refused request waits in the limit's queue, highest priority first)\n")
	fmt.Fprintf(w, "  %-8s %8s %6s %9s %7s %14s %12s %9s %9s\n", "account", "priority", "sent", "at once", "waited", "then admitted", "out of time", "avg wait", "max wait")
	for _, x := range r.Waits {
		avg := time.Duration(0)
		if n := x.Waited(); n > 0 {
			avg = x.Total / time.Duration(n)
		}
		fmt.Fprintf(w, "  %-8s %8d %6d %9d %7d %14d %12d %9s %9s\n", x.Account, x.Priority, x.Sent,
			x.AdmittedAtOnce+x.RefusedAtOnce, x.Waited(), x.AdmittedAfterWait, x.OutOfTime,
			avg.Round(time.Millisecond), x.Max.Round(time.Millisecond))
	}
	if len(r.Waits) == 0 {
		fmt.Fprintf(w, "  (no request could wait)\n")
	}
}

// printCredits writes the prepaid org's grants, calls and books.
func (r *Report) printCredits(w io.Writer) {
	c := r.Credits
	if !c.Expect {
		return
	}
	fmt.Fprintf(w, "\nPrepaid credits (%s, %s: grants through the admin API; finance_credit_balances; GET /v1/balance/%s)\n", c.Account, c.Unit, c.Account)
	for i, g := range c.Grants {
		when := "before the traffic"
		if g.At > 0 {
			when = fmt.Sprintf("at %s of the traffic (top-up)", g.At.Round(100*time.Millisecond))
		}
		fmt.Fprintf(w, "  grant %s  %12s  key %s  %s\n", g.ID, num(g.Amount), g.Key, when)
		if i == 0 {
			same := "the same grant, nothing granted again"
			if c.RetryID != g.ID {
				same = "ANOTHER grant: " + c.RetryID
			}
			fmt.Fprintf(w, "    retried with the same idempotency key: 200, %s\n", same)
		}
	}
	if c.TopUpErr != "" {
		fmt.Fprintf(w, "  top-up FAILED: %s\n", c.TopUpErr)
	}
	first := "never"
	if c.Refused > 0 {
		first = fmt.Sprintf("first at %s, %d after the top-up", c.FirstRefusal.Round(100*time.Millisecond), c.RefusedAfterTopUp)
	}
	fmt.Fprintf(w, "  calls %d: admitted %d (%s %s drawn; %d after the top-up; %d ended in a 5xx), 402 insufficient_balance %d (%s)\n",
		c.Sent, c.Admitted, num(c.Charged), c.Unit, c.AdmittedAfterTopUp, c.FiveXX, c.Refused, first)
	if !c.Read {
		fmt.Fprintf(w, "  (the ledger was not read)\n")
		return
	}
	l := c.Ledger
	fmt.Fprintf(w, "  %-28s %12s\n", "granted", num(l.Granted))
	fmt.Fprintf(w, "  %-28s %12s\n", "consumed", num(-l.Consumed))
	fmt.Fprintf(w, "  %-28s %12s   (%d refunds of 5xx draws by reconcile)\n", "refunded", signed(l.Refunded), c.Refunds)
	fmt.Fprintf(w, "  %-28s %12s\n", "voided", num(-l.Voided))
	fmt.Fprintf(w, "  %-28s %12s\n", "expired", num(-l.Expired))
	ties := "ties out"
	if !l.TiesOut() {
		ties = fmt.Sprintf("DOES NOT tie out: the terms give %s", num(l.Granted-l.Consumed+l.Refunded-l.Voided-l.Expired))
	}
	fmt.Fprintf(w, "  %-28s %12s   (%s)\n", "balance (ledger)", num(l.Balance), ties)
	agree := "agrees with the ledger"
	if c.Redis != l.Balance {
		agree = fmt.Sprintf("DIFFERS from the ledger by %s", signed(c.Redis-l.Balance))
	}
	fmt.Fprintf(w, "  %-28s %12s   (%s)\n", "balance (Redis, GET balance)", num(c.Redis), agree)
}

// printTree shows the accounts the demo created and their limits.
func printTree(w io.Writer, tree []account) {
	depth := map[string]int{}
	for _, a := range tree {
		if a.Parent != "" {
			depth[a.ID] = depth[a.Parent] + 1
		}
		var what []string
		if a.Plan != "" {
			what = append(what, "plan "+a.Plan)
		}
		if a.Concurrency > 0 {
			what = append(what, fmt.Sprintf("≤ %d in flight", a.Concurrency))
		}
		if a.Priority > 0 {
			what = append(what, fmt.Sprintf("priority %d", a.Priority))
		}
		units := make([]string, 0, len(a.Limits))
		for u := range a.Limits {
			units = append(units, u)
		}
		sort.Strings(units)
		for _, u := range units {
			what = append(what, u+" "+describe(a.Limits[u].(map[string]any)))
		}
		if a.note != "" {
			what = append(what, a.note)
		}
		key := ""
		if a.key {
			key = "  [API key]"
		}
		fmt.Fprintf(w, "  %s%s (%s) %s%s\n", strings.Repeat("  ", depth[a.ID]), a.ID, a.Kind, strings.Join(what, ", "), key)
	}
}

func describe(l map[string]any) string {
	var parts []string
	switch {
	case l["algorithm"] == "sliding_window":
		parts = append(parts, fmt.Sprintf("%v per %v s (sliding window)", l["limit"], l["window_s"]))
	case l["rate_per_s"] != nil:
		parts = append(parts, fmt.Sprintf("%v/s burst %v", num(toInt(l["rate_per_s"])), num(toInt(l["burst"]))))
	}
	if c, ok := l["ceiling"]; ok {
		parts[len(parts)-1] = "guaranteed " + parts[len(parts)-1] + fmt.Sprintf(", ceiling %s", num(toInt(c)))
	}
	if q, ok := l["quota"]; ok {
		parts = append(parts, fmt.Sprintf("quota %s/month", num(toInt(q))))
	}
	return strings.Join(parts, ", ")
}

func toInt(v any) int64 {
	switch n := v.(type) {
	case int:
		return int64(n)
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return 0
}

// money formats minor units in their currency: "EUR 49.00".
func money(minor int64, currency string) string {
	decimals := 2
	switch currency {
	case "JPY", "KRW", "CLP", "ISK", "VND":
		decimals = 0
	case "BHD", "KWD", "OMR", "JOD", "TND":
		decimals = 3
	}
	sign := ""
	if minor < 0 {
		sign, minor = "-", -minor
	}
	if decimals == 0 {
		return fmt.Sprintf("%s %s%s", currency, sign, num(minor))
	}
	pow := int64(1)
	for range decimals {
		pow *= 10
	}
	return fmt.Sprintf("%s %s%s.%0*d", currency, sign, num(minor/pow), decimals, minor%pow)
}

// num writes n with thousands separators: 1,234,567.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func signed(n int64) string {
	if n > 0 {
		return "+" + num(n)
	}
	return num(n)
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
