package main

import "fmt"

// The sub-benchmarks of BenchmarkReconcile (internal/reconcile) that the figures read: the
// baseline, and one change of each size at a time.
const (
	recBase     = "BenchmarkReconcile/accounts=100000/corrections=1000"
	recFewer    = "BenchmarkReconcile/accounts=10000/corrections=1000"
	recMore     = "BenchmarkReconcile/accounts=100000/corrections=2000"
	recInactive = "BenchmarkReconcile/accounts=100000/corrections=1000/inactive=1000000"
)

// reconcileFigures takes reconcile_s_100k (seconds per run, the median of the benchtime's
// runs) and what it grows with: each other case's time ÷ the baseline's, same process.
func reconcileFigures(res *Results, rec map[string]map[string]float64) error {
	base, ok := rec[recBase]["s"]
	if !ok || base <= 0 {
		return fmt.Errorf("no %s s in %v", recBase, rec)
	}
	res.add("reconcile_s_100k", base, "s", "",
		fmt.Sprintf("one reconcile run: 100,000 active accounts (a request each in the open month, quotas on requests and tokens), 1 %% needing a correction (%.0f rows applied); median of the runs", rec[recBase]["adjustments"]))
	for _, c := range []struct{ key, name, what string }{
		{"reconcile_vs_100k_at_10k_active", recFewer, "10,000 active accounts, the same 1,000 corrections"},
		{"reconcile_vs_100k_at_2x_corrections", recMore, "100,000 active accounts, 2,000 corrections"},
		{"reconcile_vs_100k_with_1m_inactive", recInactive, "the baseline plus 1,000,000 accounts seen in earlier, closed months (an account row, a request, an outcome and an applied correction each)"},
	} {
		s, ok := rec[c.name]["s"]
		if !ok {
			return fmt.Errorf("no %s s in %v", c.name, rec)
		}
		res.add(c.key, s/base, "×", "", fmt.Sprintf("%s: %.2f s ÷ reconcile_s_100k", c.what, s))
	}
	return nil
}
