package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/reconcile"
)

// errDifferences is verify's failure: counters differ from their billable totals.
var errDifferences = errors.New("counters differ from their billable totals")

// errInvoices is verify's failure: issued invoices do not tie out.
var errInvoices = errors.New("invoice checks fail (finance_invoice_tieout)")

// errProblems is verify's failure: some accounts' counters or totals could not be checked.
var errProblems = errors.New("accounts' data could not be checked")

// runOnce is one reconcile run, then the invoice tie-out; it prints the summary and fails
// when an invariant check does, or when some accounts' data could not be reconciled (the
// others were).
func runOnce(ctx context.Context, e env) error {
	o, closeRedis, err := e.options(ctx)
	if err != nil {
		return err
	}
	defer closeRedis()
	s, err := reconcile.Run(ctx, o)
	if err != nil && !errors.Is(err, reconcile.ErrInvariant) && !errors.Is(err, reconcile.ErrProblems) {
		return err
	}
	if !s.DryRun {
		// The issued invoices must still tie out: a check of every run, cheap and lag-free.
		invoiceDiffs, err := invoice.TieOut(ctx, e.pool)
		if err != nil {
			return err
		}
		for _, d := range invoiceDiffs {
			s.InvariantFailures = append(s.InvariantFailures, d.String())
		}
	}
	if err := printSummary(e.out, s, e.cfg.JSON); err != nil {
		return err
	}
	var errs []error
	if len(s.InvariantFailures) > 0 {
		errs = append(errs, fmt.Errorf("%d %w", len(s.InvariantFailures), reconcile.ErrInvariant))
	}
	if len(s.Problems) > 0 {
		errs = append(errs, fmt.Errorf("%d %w", len(s.Problems), reconcile.ErrProblems))
	}
	return errors.Join(errs...)
}

// verify prints every counter that differs from its billable total, every account's data
// it could not check (a counter that is not an integer, a total past the largest counter)
// and every issued invoice that does not tie out, and fails when there is one. A bad
// account's data does not stop the others being checked.
func verify(ctx context.Context, e env) error {
	o, closeRedis, err := e.options(ctx)
	if err != nil {
		return err
	}
	defer closeRedis()
	diffs, problems, err := reconcile.Verify(ctx, o)
	if err != nil {
		return err
	}
	invoiceDiffs, err := invoice.TieOut(ctx, e.pool)
	if err != nil {
		return err
	}
	if err := printDifferences(e.out, diffs, problems, invoiceDiffs, e.cfg.JSON); err != nil {
		return err
	}
	var errs []error
	if len(diffs) > 0 {
		errs = append(errs, fmt.Errorf("verify: %d %w", len(diffs), errDifferences))
	}
	if len(problems) > 0 {
		errs = append(errs, fmt.Errorf("verify: %d %w", len(problems), errProblems))
	}
	if len(invoiceDiffs) > 0 {
		errs = append(errs, fmt.Errorf("verify: %d %w", len(invoiceDiffs), errInvoices))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	e.log.Info("verify passed")
	return nil
}

// printSummary prints a run's plan, failed invariants and counts, or (asJSON) the summary
// as one JSON object.
func printSummary(w io.Writer, s reconcile.Summary, asJSON bool) error {
	if asJSON {
		if err := json.NewEncoder(w).Encode(s); err != nil {
			return fmt.Errorf("print summary: %w", err)
		}
		return nil
	}
	for _, a := range s.Plan {
		fmt.Fprintf(w, "%s %s %s %s %s %+d (%s) %s\n", a.Kind, a.Org, a.Account, a.Unit, a.Period, a.Amount, a.Reason, a.SourceEvent)
	}
	for _, f := range s.InvariantFailures {
		fmt.Fprintln(w, "invariant failed:", f)
	}
	for _, p := range s.Problems {
		fmt.Fprintln(w, "problem:", p.String())
	}
	fmt.Fprintf(w, "run %s: dry_run=%t planned=%d applied=%d recovered=%d drift_found=%d events_skipped=%d invariant_failures=%d problems=%d\n",
		s.RunID, s.DryRun, s.AdjustmentsPlanned, s.AdjustmentsApplied, s.Recovered, s.DriftFound, s.EventsSkipped,
		len(s.InvariantFailures), len(s.Problems))
	return nil
}

// printDifferences prints verify's differences and problems one a line (a problem starts
// with "problem: "), or (asJSON) as one JSON object with the three lists (empty, not null,
// when there are none).
func printDifferences(w io.Writer, diffs []reconcile.Difference, problems []reconcile.Problem, invoiceDiffs []invoice.TieOutDifference, asJSON bool) error {
	if asJSON {
		if diffs == nil {
			diffs = []reconcile.Difference{}
		}
		if problems == nil {
			problems = []reconcile.Problem{}
		}
		if invoiceDiffs == nil {
			invoiceDiffs = []invoice.TieOutDifference{}
		}
		if err := json.NewEncoder(w).Encode(map[string]any{"differences": diffs, "problems": problems,
			"invoice_differences": invoiceDiffs}); err != nil {
			return fmt.Errorf("print differences: %w", err)
		}
		return nil
	}
	for _, d := range diffs {
		fmt.Fprintln(w, d.String())
	}
	for _, p := range problems {
		fmt.Fprintln(w, "problem:", p.String())
	}
	for _, d := range invoiceDiffs {
		fmt.Fprintln(w, d.String())
	}
	return nil
}
