package demo

import (
	"bytes"
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
// refunds 5xx and settles tokens, the close issues one invoice per org, verify passes.
func TestDemo(t *testing.T) {
	name := testenv.Name(t)
	ctx := testenv.Context(t, 3*time.Minute)
	cfg := Config{
		BinDir:      bin,
		RedisURL:    testenv.RedisURL(t),
		DatabaseURL: testenv.DatabaseURL(t),
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
	if err != nil {
		t.Fatalf("demo failed: %v", err)
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
		if sum != inv.TotalMinor {
			t.Errorf("invoice of %s: total %d, lines sum to %d", inv.Org, inv.TotalMinor, sum)
		}
		if inv.Org == "acme" && overage <= 0 {
			t.Errorf("acme's invoice has no priced usage past the team plan's included units: %+v", inv.Lines)
		}
	}
	if len(orgs) != 3 || orgs["acme"] != 1 || orgs["tinyco"] != 1 || orgs["bigcorp"] != 1 {
		t.Errorf("invoices by org: %v, want one each for acme, tinyco and bigcorp", orgs)
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
	for _, want := range []string{"OK: ", "Refusals by blocking level", "refund_5xx", "settle_tokens", "EUR 19.00",
		"overage_tier", "EUR 990.00", "Borrowing", "units borrowed", "Waiting", "out of time",
		"acme reserves tokens 20,000/s burst 80,000"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report does not say %q", want)
		}
	}
}

// The verdict fails when the books do not add up.
func TestCheck(t *testing.T) {
	good := Report{Admitted: 10, Rows: 10, OutcomesReported: 4, OutcomesMetered: 4}
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
