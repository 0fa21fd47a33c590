// Package chaos is metergate's fault and bad-input suite: each scenario runs the real
// binaries (admit with its relay, meter, reconcile) against real Redis, PostgreSQL and
// Kafka, injects its fault itself (signals to the processes it started, stopping and
// starting its own services) and checks the books: every event id a caller got a 200 for
// is in PostgreSQL exactly once.
//
// `make chaos` runs the full form (METERGATE_CHAOS=full) and prints the scoreboard;
// `make test` runs the short form (fewer requests, one round of each fault).
package chaos_test

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/metergate/metergate/internal/testenv"
)

// bin holds the admit, meter and reconcile binaries built for this run.
var bin string

// full is the form of the suite: the full one (make chaos) or the short one (make test).
var full = os.Getenv("METERGATE_CHAOS") == "full"

// pick is short in the short form and long in the full one.
func pick[T any](short, long T) T {
	if full {
		return long
	}
	return short
}

func TestMain(m *testing.M) {
	code := testenv.RunWithBinaries(m, &bin, "../cmd/admit", "../cmd/meter", "../cmd/reconcile")
	if board.print(os.Stdout) > 0 && code == 0 {
		code = 1
	}
	os.Exit(code)
}

// chaosSeed is METERGATE_CHAOS_SEED when set (to replay a run), def otherwise.
func chaosSeed(t *testing.T, def int64) int64 {
	v := os.Getenv("METERGATE_CHAOS_SEED")
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		t.Fatalf("METERGATE_CHAOS_SEED=%q: want a whole number >= 0", v)
	}
	return n
}

// Row is one line of the scoreboard.
type Row struct {
	Scenario string
	// Requests the callers made, Admitted of them answered 200.
	Requests, Admitted int
	// Rows in usage_events for the scenario's admissions (the warm-up requests of 0 units
	// that wait for a new API key to reach every node not counted); Lost: admitted ids
	// without a row; Duplicated: rows beyond one per admitted request, and rows of ids no
	// caller was given.
	Rows, Lost, Duplicated int
	// FiveXX counts responses >= 500 the callers got.
	FiveXX int
	// Note says what else the scenario checked or measured.
	Note string
	pass bool
}

type scoreboard struct {
	mu   sync.Mutex
	rows []Row
}

var board scoreboard

// scenario is one scenario's line, recorded when its test ends: PASS unless the test failed.
type scenario struct {
	Row
}

// begin starts the scenario of test t; its row goes to the scoreboard when t ends.
func begin(t *testing.T, name string) *scenario {
	t.Helper()
	sc := &scenario{Row: Row{Scenario: name}}
	t.Cleanup(func() {
		sc.pass = !t.Failed()
		board.mu.Lock()
		board.rows = append(board.rows, sc.Row)
		board.mu.Unlock()
	})
	return sc
}

// print writes the table and the closing line, and returns the number of failures.
func (b *scoreboard) print(w io.Writer) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.rows) == 0 {
		return 0
	}
	// By number ("10 …" after "9 …"), then name.
	number := func(s string) int { n, _ := strconv.Atoi(strings.Fields(s + " x")[0]); return n }
	sort.SliceStable(b.rows, func(i, j int) bool {
		ni, nj := number(b.rows[i].Scenario), number(b.rows[j].Scenario)
		return ni < nj || ni == nj && b.rows[i].Scenario < b.rows[j].Scenario
	})
	form := "short"
	if full {
		form = "full"
	}
	fmt.Fprintf(w, "\nmetergate chaos suite (%s form)\n\n", form)
	head := []string{"scenario", "requests", "admitted", "rows in Postgres", "lost", "duplicated", "5xx returned", "result"}
	width := make([]int, len(head))
	cells := [][]string{head}
	for _, r := range b.rows {
		result := "PASS"
		if !r.pass {
			result = "FAIL"
		}
		cells = append(cells, []string{r.Scenario, fmt.Sprint(r.Requests), fmt.Sprint(r.Admitted), fmt.Sprint(r.Rows),
			fmt.Sprint(r.Lost), fmt.Sprint(r.Duplicated), fmt.Sprint(r.FiveXX), result})
	}
	for _, c := range cells {
		for i, v := range c {
			width[i] = max(width[i], len(v))
		}
	}
	passed, failed := 0, 0
	for n, c := range cells {
		for i, v := range c {
			if i == 0 {
				fmt.Fprintf(w, "%-*s", width[i], v)
			} else {
				fmt.Fprintf(w, "  %*s", width[i], v)
			}
		}
		fmt.Fprintln(w)
		if n == 0 {
			fmt.Fprintln(w, strings.Repeat("-", sum(width)+2*(len(width)-1)))
		}
	}
	fmt.Fprintln(w)
	for _, r := range b.rows {
		if r.pass {
			passed++
		} else {
			failed++
		}
		if r.Note != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Scenario, r.Note)
		}
	}
	fmt.Fprintf(w, "\n%d passed, %d failed\n", passed, failed)
	return failed
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
