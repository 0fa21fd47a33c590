package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// goBenchmarks runs the Go benchmarks whose baselines are inside them (the meter against
// INSERT … SELECT, -rounds times; reconcile at several sizes; the decision path for its
// allocations) and takes their metrics.
func (s *stack) goBenchmarks(ctx context.Context, res *Results) error {
	// One sample per run of the benchmark, each its own interleaving (INSERT … SELECT, the
	// meter, INSERT … SELECT): the figure is their median, like the other ratios.
	runs, err := goBenchRuns(ctx, "./internal/meter/", "^BenchmarkMeterVsInsertSelect$", s.cfg.MeterEvents+"x", s.cfg.Rounds)
	if err != nil {
		return err
	}
	meter := runs["BenchmarkMeterVsInsertSelect"]
	res.Raw["go_bench_meter"] = meter
	var ratios, fromFirst, totals, bases []float64
	for _, m := range meter {
		total, base := m["meter-total-events/s"], m["baseline-events/s"]
		if total == 0 || base == 0 {
			return fmt.Errorf("BenchmarkMeterVsInsertSelect reported no meter-total-events/s or baseline-events/s: %v", m)
		}
		ratios, fromFirst = append(ratios, total/base), append(fromFirst, m["meter_vs_insert_select"])
		totals, bases = append(totals, total), append(bases, base)
	}
	if len(ratios) == 0 {
		return errors.New("BenchmarkMeterVsInsertSelect: no result")
	}
	// Both rates over all the events, each from its own start to its last row: the
	// benchmark's own meter_vs_insert_select takes the meter's from its first row on
	// (leaving out the group join and the first fetch), kept beside it.
	res.addSpread("meter_vs_insert_select", spreadOf(ratios), "×", "≥ 0.9",
		fmt.Sprintf("%s events Kafka → usage_events through the meter (dedupe, offsets after rows) from its start (joining the group, first fetch) to the last row ÷ INSERT … SELECT generate_series … ON CONFLICT of as many rows into the same table from its start to its end, one run of BenchmarkMeterVsInsertSelect per sample; medians %.0f/s against %.0f/s; from the meter's first row on: median %.3f×",
			s.cfg.MeterEvents, spreadOf(totals).Median, spreadOf(bases).Median, spreadOf(fromFirst).Median))

	rec, err := goBench(ctx, "./internal/reconcile/", "^BenchmarkReconcile$", s.cfg.ReconcileBenchtime)
	if err != nil {
		return err
	}
	res.Raw["go_bench_reconcile"] = rec
	if err := reconcileFigures(res, rec); err != nil {
		return err
	}

	dec, err := goBench(ctx, "./internal/admission/", "^BenchmarkDecide$", "1s")
	if err != nil {
		return err
	}
	res.Raw["go_bench_decide"] = dec
	return nil
}

// goBench runs `go test -run '^$' -bench pattern -benchtime t` in pkg and returns each
// benchmark's metrics by unit ("ns/op", "allocs/op", custom ones).
func goBench(ctx context.Context, pkg, pattern, benchtime string) (map[string]map[string]float64, error) {
	runs, err := goBenchRuns(ctx, pkg, pattern, benchtime, 1)
	if err != nil {
		return nil, err
	}
	res := map[string]map[string]float64{}
	for name, ms := range runs {
		res[name] = ms[len(ms)-1]
	}
	return res, nil
}

// goBenchRuns is goBench with -count n: each benchmark's metrics, one map per run.
func goBenchRuns(ctx context.Context, pkg, pattern, benchtime string, n int) (map[string][]map[string]float64, error) {
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", pattern, "-benchtime", benchtime, "-benchmem", "-count", strconv.Itoa(n), "-timeout", "30m", pkg)
	cmd.Env = append(os.Environ(), "METERGATE_REQUIRE_SERVICES=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go test -bench %s %s: %w\n%s", pattern, pkg, err, out.String())
	}
	res := parseBenchRuns(out.String())
	if len(res) == 0 {
		return nil, fmt.Errorf("go test -bench %s %s: no results\n%s", pattern, pkg, out.String())
	}
	return res, nil
}

// parseBench reads the result lines of go test -bench:
// "BenchmarkX/sub-2   1   123 ns/op   4.5 unit   …"; of a benchmark run more than once, the
// last run.
func parseBench(out string) map[string]map[string]float64 {
	res := map[string]map[string]float64{}
	for name, ms := range parseBenchRuns(out) {
		res[name] = ms[len(ms)-1]
	}
	return res
}

// parseBenchRuns reads the result lines of go test -bench -count n: each benchmark's
// metrics, one map per run, in order.
func parseBenchRuns(out string) map[string][]map[string]float64 {
	res := map[string][]map[string]float64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i] // the GOMAXPROCS suffix
			}
		}
		m := map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			m[f[i+1]] = v
		}
		res[name] = append(res[name], m)
	}
	return res
}
