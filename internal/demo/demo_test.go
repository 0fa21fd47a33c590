package demo

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/metergate/metergate/internal/testenv"
)

// bin holds the admit, meter and reconcile binaries built for this run.
var bin string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithBinaries(m, &bin, "../../cmd/admit", "../../cmd/meter", "../../cmd/reconcile"))
}

// The demo end to end, with 5 s of traffic, on a database (schema), Redis key prefix and
// topic of this test: every admitted event is recorded once, the hierarchy shows in the
// refusals (429 at the agent level, the free org's quota spent: 402), a team borrows past
// its guarantee while its sibling keeps its own, requests wait for capacity, reconcile
// refunds 5xx and settles tokens, the close issues one invoice per org, verify passes; the
// prepaid org runs out of balance (402), is topped up and passes again, and its ledger ties
// out with Redis's balance after reconcile's refunds.
func TestDemo(t *testing.T) {
	name := testenv.Name(t)
	ctx := testenv.Context(t, 3*time.Minute)
	cfg := Config{
		BinDir:      bin,
		RedisURL:    testenv.RedisURL(t),
		DatabaseURL: testenv.MigrateDatabaseURL(t),
		Brokers:     testenv.KafkaBrokers(t),
		Duration:    5 * time.Second,
		Database:    "test_" + name,
		KeyPrefix:   "t:" + name + ":mg",
		Topic:       "t." + name,
		LogDir:      t.TempDir(),
		Cleanup:     true,
		Seed:        1,
	}
	var out bytes.Buffer
	begin := time.Now()
	r, err := Run(ctx, cfg, &out)
	t.Logf("demo in %s:\n%s", time.Since(begin).Round(time.Millisecond), out.String())
	if err != nil { // the report's checks below say more when it was printed
		t.Errorf("demo failed: %v", err)
		if r == nil || !r.Printed {
			t.FailNow()
		}
	}

	if r.Admitted == 0 || r.Admitted != r.Rows || r.Missing+r.Unexpected+r.Duplicates != 0 {
		t.Errorf("admitted %d, rows %d, missing %d, unexpected %d, duplicates %d", r.Admitted, r.Rows, r.Missing, r.Unexpected, r.Duplicates)
	}
	if r.OutcomesReported == 0 || r.OutcomesMetered != r.OutcomesReported {
		t.Errorf("outcomes reported %d, metered %d", r.OutcomesReported, r.OutcomesMetered)
	}
	count := func(status int, level, account string) int {
		n := 0
		for _, b := range r.Blocked {
			if b.Status == status && b.Level == level && (account == "" || b.Account == account) {
				n += b.Count
			}
		}
		return n
	}
	if count(429, "agent", "") == 0 {
		t.Errorf("no 429 at the agent level: %+v", r.Blocked)
	}
	if count(402, "org", "tinyco") == 0 {
		t.Errorf("tinyco's quota never ran out (no 402): %+v", r.Blocked)
	}
	if r.Decisions[200] == 0 || r.Decisions[429] == 0 || r.Decisions[402] == 0 {
		t.Errorf("decisions by status: %v", r.Decisions)
	}
	kinds := map[string]int{}
	for _, a := range r.Adjustments {
		kinds[a.Kind] += a.Rows
		if a.NotApplied != 0 {
			t.Errorf("adjustments left unapplied: %+v", a)
		}
	}
	if kinds["refund_5xx"] == 0 || kinds["settle_tokens"] == 0 {
		t.Errorf("adjustments by kind: %v, want refund_5xx and settle_tokens", kinds)
	}
	if r.Reconcile.ByKind["refund_5xx"] != kinds["refund_5xx"] || r.Reconcile.ByKind["settle_tokens"] != kinds["settle_tokens"] {
		t.Errorf("reconcile's summary %v differs from the adjustments table %v", r.Reconcile.ByKind, kinds)
	}
	orgs := map[string]int{}
	for _, inv := range r.Invoices {
		orgs[inv.Org]++
		if inv.Status != "issued" || len(inv.Lines) == 0 {
			t.Errorf("invoice of %s: status %q, %d lines", inv.Org, inv.Status, len(inv.Lines))
		}
		var sum, overage int64
		for _, l := range inv.Lines {
			sum += l.AmountMinor
			if l.Kind != "base_fee" {
				overage += l.AmountMinor
			}
		}
		if sum != inv.SubtotalMinor || inv.TotalMinor != inv.SubtotalMinor+inv.TaxMinor {
			t.Errorf("invoice of %s: lines sum to %d, subtotal %d + tax %d = total %d", inv.Org, sum, inv.SubtotalMinor, inv.TaxMinor, inv.TotalMinor)
		}
		if wantTax := (inv.Org == "acme"); (inv.TaxRateBP == 1900) != wantTax || (inv.Buyer != nil) != wantTax {
			t.Errorf("invoice of %s: tax rate %d, buyer %v: only acme has billing details (Germany, 19 %%)", inv.Org, inv.TaxRateBP, inv.Buyer)
		}
		if !strings.HasPrefix(inv.Number, "MG-") {
			t.Errorf("invoice of %s: number %q", inv.Org, inv.Number)
		}
		if inv.Org == "acme" && overage <= 0 {
			t.Errorf("acme's invoice has no priced usage past the team plan's included units: %+v", inv.Lines)
		}
	}
	if len(orgs) != 4 || orgs["acme"] != 1 || orgs["tinyco"] != 1 || orgs["bigcorp"] != 1 || orgs[prepaidOrg] != 1 {
		t.Errorf("invoices by org: %v, want one each for acme, tinyco, bigcorp and %s", orgs, prepaidOrg)
	}
	if n := r.Documents.CreditNote; n == nil || len(r.Documents.PDFs) != len(r.Invoices) {
		t.Errorf("documents: %d PDFs for %d invoices, credit note %v", len(r.Documents.PDFs), len(r.Invoices), n)
	}
	for _, p := range r.Documents.PDFs {
		if b, err := os.ReadFile(p); err != nil || !bytes.HasPrefix(b, []byte("%PDF-")) {
			t.Errorf("PDF %s: %v, starts %q", p, err, b[:min(8, len(b))])
		}
	}
	if !r.Verified {
		t.Error("reconcile verify did not pass")
	}

	// Guarantees: engineering borrows acme's spare past its guarantee, and is admitted at
	// least its guarantee; marketing, within its own, is never refused for tokens.
	if r.BorrowedUnits <= 0 || r.BorrowedView != r.BorrowedUnits {
		t.Errorf("borrowed units: usage_borrowings %d, finance_borrowing %d; want equal and > 0", r.BorrowedUnits, r.BorrowedView)
	}
	var engBorrowed int64
	for _, b := range r.Borrowings {
		if b.Account == "engineering" && b.Lender == "acme" && b.Unit == "tokens" {
			engBorrowed += b.Units
		}
	}
	if engBorrowed <= 0 {
		t.Errorf("engineering borrowed no tokens from acme: %+v", r.Borrowings)
	}
	guarantee := map[string]Guarantee{}
	for _, g := range r.Guarantees {
		guarantee[g.Account] = g
	}
	if g := guarantee["engineering"]; g.Admitted < int64(float64(g.RatePerS)*cfg.Duration.Seconds()) {
		t.Errorf("engineering was admitted %d tokens in %s, less than its guarantee of %d/s", g.Admitted, cfg.Duration, g.RatePerS)
	}
	if g := guarantee["marketing"]; g.Admitted == 0 || g.Refused != 0 {
		t.Errorf("marketing, within its guarantee, was admitted %d tokens and refused %d times for tokens by its limit or acme's", g.Admitted, g.Refused)
	}
	// Waiting: support's callers sent max_wait_ms; some waited and were then admitted.
	var sent, waited, admittedAfter int
	for _, w := range r.Waits {
		sent += w.Sent
		waited += w.Waited()
		admittedAfter += w.AdmittedAfterWait
		if w.AdmittedAtOnce+w.RefusedAtOnce+w.AdmittedAfterWait+w.OutOfTime != w.Sent {
			t.Errorf("waits of %s do not add up: %+v", w.Account, w)
		}
	}
	if len(r.Waits) != 2 || sent == 0 || waited == 0 || admittedAfter == 0 {
		t.Errorf("waiting requests: %+v; want oncall's and batch's, some admitted after waiting", r.Waits)
	}
	// Prepaid credits: the balance ran out (402 insufficient_balance at the org), the top-up
	// came after and let calls pass again, reconcile refunded the 5xx draws, and the ledger
	// ties out and equals Redis's balance.
	c := r.Credits
	if c.Refused == 0 || count(402, "org", prepaidOrg) != c.Refused || r.Insufficient != c.Refused {
		t.Errorf("prepaid 402s: caller %d, blocked_by %d, insufficient_balance %d; want equal and > 0",
			c.Refused, count(402, "org", prepaidOrg), r.Insufficient)
	}
	if len(c.Grants) != 2 || c.Grants[1].At <= c.FirstRefusal || c.AdmittedAfterTopUp == 0 {
		t.Errorf("top-up: grants %+v, first 402 at %s, admitted after the top-up %d; want a top-up after the first 402 and calls passing after it",
			c.Grants, c.FirstRefusal, c.AdmittedAfterTopUp)
	}
	if len(c.Grants) == 0 || c.RetryID != c.Grants[0].ID {
		t.Errorf("the retried grant was answered %q, the first grant is %+v", c.RetryID, c.Grants)
	}
	l := c.Ledger
	if !c.Read || !l.TiesOut() || l.Balance != c.Redis || l.Consumed != c.Charged || l.Consumed == 0 {
		t.Errorf("prepaid ledger %+v (read %v), Redis balance %d, charged %d: want it to tie out, equal Redis and the charges", l, c.Read, c.Redis, c.Charged)
	}
	if c.FiveXX == 0 || c.Refunds == 0 || c.Refunds > c.FiveXX || l.Refunded <= 0 || l.Refunded != c.RefundedUnits {
		t.Errorf("credit refunds: %d rows of %d units for %d 5xx, ledger refunded %d; want > 0", c.Refunds, c.RefundedUnits, c.FiveXX, l.Refunded)
	}
	if first, topUp := prepaidGrants(cfg.Duration); l.Granted != first+topUp {
		t.Errorf("granted %d in the ledger, want %d and a top-up of %d: grants %+v", l.Granted, first, topUp, c.Grants)
	}
	for _, want := range []string{"OK: ", "Refusals by blocking level", "Prepaid credits", "402 insufficient_balance",
		"the same grant, nothing granted again", "(top-up)", "agrees with the ledger", "(ties out)", "refund_5xx", "settle_tokens", "EUR 19.00",
		"overage_tier", "EUR 990.00", "Borrowing", "units borrowed", "Waiting", "out of time",
		"acme reserves tokens 20,000/s burst 80,000"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report does not say %q", want)
		}
	}
}

// The verdict fails when the books do not add up.
func TestCheck(t *testing.T) {
	good := Report{Admitted: 10, Rows: 10, OutcomesReported: 4, OutcomesMetered: 4, Credits: credits(nil), Alerts: alerts(nil)}
	if err := good.Check(); err != nil {
		t.Fatalf("good books: %v", err)
	}
	for name, r := range map[string]Report{
		"a row missing":    {Admitted: 10, Rows: 9, Missing: 1},
		"a row too many":   {Admitted: 10, Rows: 11, Unexpected: 1},
		"outcome missing":  {Admitted: 10, Rows: 10, OutcomesReported: 4, OutcomesMetered: 3},
		"nothing admitted": {},
		"invariant failed": {Admitted: 1, Rows: 1, Reconcile: Summary{InvariantFailures: []string{"x"}}},
		"a step failed":    {Admitted: 1, Rows: 1, Problems: []string{"bin/reconcile verify: exit 1"}},
		"view ≠ table":     {Admitted: 1, Rows: 1, BorrowedUnits: 10, BorrowedView: 9},
		"nothing borrowed": {Admitted: 1, Rows: 1, ExpectBorrowing: true},
		"credit ledger":    {Admitted: 1, Rows: 1, Credits: credits(func(c *Credits) { c.Ledger.Refunded++ })},
		"Redis ≠ ledger":   {Admitted: 1, Rows: 1, Credits: credits(func(c *Credits) { c.Redis-- })},
		"no 402":           {Admitted: 1, Rows: 1, Credits: credits(func(c *Credits) { c.Refused = 0 })},
		"no top-up":        {Admitted: 1, Rows: 1, Credits: credits(func(c *Credits) { c.Grants = c.Grants[:1] })},
		"none passed":      {Admitted: 1, Rows: 1, Credits: credits(func(c *Credits) { c.AdmittedAfterTopUp = 0 })},
		"retry regranted":  {Admitted: 1, Rows: 1, Credits: credits(func(c *Credits) { c.RetryID = "gr_other" })},
		"charged≠consumed": {Admitted: 1, Rows: 1, Credits: credits(func(c *Credits) { c.Charged++ })},
		"alert twice":      {Admitted: 1, Rows: 1, Credits: credits(nil), Alerts: alerts(func(a *Alerts) { a.Accepted[a.Fired[0].ID] = 2 })},
		"alert undelivered": {Admitted: 1, Rows: 1, Credits: credits(nil),
			Alerts: alerts(func(a *Alerts) { delete(a.Accepted, a.Fired[1].ID) })},
		"alert missing": {Admitted: 1, Rows: 1, Credits: credits(nil), Alerts: alerts(func(a *Alerts) {
			delete(a.Accepted, a.Fired[3].ID)
			a.Fired = a.Fired[:3]
		})},
		"alert by nobody": {Admitted: 1, Rows: 1, Credits: credits(nil), Alerts: alerts(func(a *Alerts) { a.Fired[0].TriggeredBy = "x" })},
		"bad signature":   {Admitted: 1, Rows: 1, Credits: credits(nil), Alerts: alerts(func(a *Alerts) { a.BadSignatures = 1 })},
		"alerts not read": {Admitted: 1, Rows: 1, Credits: credits(nil)},
	} {
		if err := r.Check(); err == nil {
			t.Errorf("%s: Check passed", name)
		}
	}
	var out bytes.Buffer
	bad := Report{Admitted: 10, Rows: 9, Missing: 1}
	bad.Print(&out)
	if !strings.Contains(out.String(), "FAIL: admitted 10 ≠ recorded 9") {
		t.Errorf("report of bad books:\n%s", out.String())
	}
}

// alerts returns the expected alerts, each fired by a request told 200 and delivered once,
// changed by change.
func alerts(change func(*Alerts)) Alerts {
	a := Alerts{Read: true, Accepted: map[string]int{}, told: map[string]bool{}}
	for i, e := range expectedAlerts {
		f := Fired{ID: "alert/" + e + "/2026-11", TriggeredBy: fmt.Sprintf("e%d", i), Admitted: true}
		a.Fired, a.Accepted[f.ID], a.told[f.TriggeredBy] = append(a.Fired, f), 1, true
	}
	if change != nil {
		change(&a)
	}
	return a
}

// credits returns a prepaid org's books that add up, changed by change.
func credits(change func(*Credits)) Credits {
	c := Credits{Account: prepaidOrg, Unit: prepaidUnit, Expect: true, Read: true,
		Grants:  []GrantMade{{ID: "gr_1", Amount: 100}, {ID: "gr_2", Amount: 300, At: time.Second}},
		RetryID: "gr_1", Sent: 50, Admitted: 40, Refused: 10, AdmittedAfterTopUp: 20, FiveXX: 3, Charged: 350,
		Ledger: CreditLedger{Granted: 400, Consumed: 350, Refunded: 30, Balance: 80}, Refunds: 3, RefundedUnits: 30, Redis: 80}
	if change != nil {
		change(&c)
	}
	return c
}

func TestMoney(t *testing.T) {
	for minor, want := range map[int64]string{4900: "EUR 49.00", 202805: "EUR 2,028.05", 5: "EUR 0.05", -150: "EUR -1.50", 0: "EUR 0.00"} {
		if got := money(minor, "EUR"); got != want {
			t.Errorf("money(%d) = %q, want %q", minor, got, want)
		}
	}
	if got := money(1234, "JPY"); got != "JPY 1,234" {
		t.Errorf("money(1234, JPY) = %q", got)
	}
}
