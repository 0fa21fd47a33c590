// Package security is metergate's black-box security suite: every probe drives the real
// binaries from outside (a running admit with its relay, meter, reconcile; real nginx and
// Caddy with the shipped configurations of deploy/gateways; the gRPC rate-limit service;
// PostgreSQL as the services' role) and checks one property of the threat model of
// docs/security.md: status codes, headers, bodies, what reaches the app behind a gateway,
// the size of a Redis key, the database's refusal.
//
// `make security` runs the full form (METERGATE_SECURITY=full: more requests, a longer
// fuzz); `make test` runs the short form. The run ends with "security: N passed, M failed".
package security_test

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

// bin holds the admit, meter and reconcile binaries built for this run.
var bin string

// full is the form of the suite: the full one (make security) or the short one (make test).
var full = os.Getenv("METERGATE_SECURITY") == "full"

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

// seed is METERGATE_SECURITY_SEED when set (to replay a fuzz run), the clock otherwise.
func seed(t *testing.T) int64 {
	v := os.Getenv("METERGATE_SECURITY_SEED")
	if v == "" {
		return time.Now().UnixNano()
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("METERGATE_SECURITY_SEED=%q: want a whole number", v)
	}
	return n
}

// P is the handle of one probe: a *testing.T that also keeps the failure messages, so
// that the closing board can say why a probe failed.
type P struct {
	*testing.T
	mu   sync.Mutex
	msgs []string
}

func (p *P) record(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, msg)
}

// Errorf records the failure and reports it.
func (p *P) Errorf(format string, args ...any) {
	p.Helper()
	p.record(fmt.Sprintf(format, args...))
	p.T.Errorf(format, args...)
}

// Fatalf records the failure, reports it and ends the probe.
func (p *P) Fatalf(format string, args ...any) {
	p.Helper()
	p.record(fmt.Sprintf(format, args...))
	p.T.Fatalf(format, args...)
}

// Error records the failure and reports it.
func (p *P) Error(args ...any) {
	p.Helper()
	p.record(fmt.Sprint(args...))
	p.T.Error(args...)
}

// Fatal records the failure, reports it and ends the probe.
func (p *P) Fatal(args ...any) {
	p.Helper()
	p.record(fmt.Sprint(args...))
	p.T.Fatal(args...)
}

// none fails the probe with what, then every item of list, unless the list is empty.
func none(p *P, list []string, what string, args ...any) {
	p.Helper()
	if len(list) > 0 {
		require.Failf(p, fmt.Sprintf(what, args...), "%s", strings.Join(list, "; "))
	}
}

// probe is one check of the suite.
type probe struct {
	name string // the finding it covers first: "F1a-nginx-replay"
	desc string // one line: the property checked
	// serial probes measure time (latencies, timeouts, a bounded pool) and run one at a
	// time before the others, which run in parallel.
	serial bool
	run    func(p *P, s *stack)
}

// result is a probe's line on the board.
type result struct {
	name, desc string
	pass       bool
	why        string
	took       time.Duration
}

type scoreboard struct {
	mu   sync.Mutex
	rows []result
}

var board scoreboard

func (b *scoreboard) add(r result) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rows = append(b.rows, r)
}

// runProbe runs pr as a subtest of t and records its result.
func runProbe(t *testing.T, s *stack, pr probe) {
	t.Run(pr.name, func(t *testing.T) {
		if !pr.serial {
			t.Parallel()
		}
		p := &P{T: t}
		start := time.Now()
		t.Cleanup(func() {
			r := result{name: pr.name, desc: pr.desc, pass: !t.Failed(), took: time.Since(start)}
			if !r.pass {
				p.mu.Lock()
				r.why = summarize(p.msgs)
				p.mu.Unlock()
				if r.why == "" {
					r.why = "failed (see the test's output)"
				}
			}
			board.add(r)
		})
		t.Logf("%s: %s", pr.name, pr.desc)
		pr.run(p, s)
	})
}

// notRun records every probe as failed without running it: the stack they need did not start.
func notRun(probes []probe, why string) {
	for _, pr := range probes {
		board.add(result{name: pr.name, desc: pr.desc, why: "not run: " + why})
	}
}

var spaces = regexp.MustCompile(`\s+`)

// summarize is a failure's message in one line: testify's "Error:" and "Messages:" fields
// (not its trace), or the message itself.
func summarize(msgs []string) string {
	var parts []string
	for _, m := range msgs {
		if i := strings.Index(m, "Error:"); i >= 0 && strings.Contains(m, "Error Trace:") {
			rest := m[i+len("Error:"):]
			text, messages := rest, ""
			if j := strings.Index(rest, "\tTest:"); j >= 0 {
				text = rest[:j]
				if k := strings.Index(rest, "Messages:"); k >= 0 {
					messages = rest[k+len("Messages:"):]
				}
			}
			m = text
			if strings.TrimSpace(messages) != "" {
				m = strings.TrimSpace(messages) + ": " + text
			}
		}
		parts = append(parts, strings.TrimSpace(spaces.ReplaceAllString(m, " ")))
	}
	s := strings.Join(parts, " | ")
	if len(s) > 500 {
		s = s[:500] + "…"
	}
	return s
}

// print writes the board and the closing line, and returns the number of failed probes.
func (b *scoreboard) print(w io.Writer) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.rows) == 0 {
		return 0
	}
	sort.SliceStable(b.rows, func(i, j int) bool { return findingLess(b.rows[i].name, b.rows[j].name) })
	form := "short"
	if full {
		form = "full"
	}
	fmt.Fprintf(w, "\nmetergate security suite (%s form)\n\n", form)
	width := 0
	for _, r := range b.rows {
		width = max(width, len(r.name))
	}
	passed, failed := 0, 0
	for _, r := range b.rows {
		verdict := "PASS"
		if r.pass {
			passed++
		} else {
			verdict = "FAIL"
			failed++
		}
		fmt.Fprintf(w, "%s  %-*s  %6.1fs  %s\n", verdict, width, r.name, r.took.Seconds(), r.desc)
		if !r.pass {
			fmt.Fprintf(w, "      %s\n", r.why)
		}
	}
	fmt.Fprintf(w, "\nsecurity: %d passed, %d failed\n", passed, failed)
	return failed
}

var findingNumber = regexp.MustCompile(`^F(\d+)`)

// findingLess orders probes by finding number ("F2" before "F10"), then by name.
func findingLess(a, b string) bool {
	na, nb := findingOf(a), findingOf(b)
	if na != nb {
		return na < nb
	}
	return a < b
}

func findingOf(name string) int {
	m := findingNumber.FindStringSubmatch(name)
	if m == nil {
		return 1 << 30
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// probes is the suite, in the order of the findings of docs/security.md.
func probes() []probe {
	var all []probe
	all = append(all, replayProbes()...)
	all = append(all, boundProbes()...)
	all = append(all, slowProbes()...)
	all = append(all, gatewayProbes()...)
	all = append(all, booksProbes()...)
	all = append(all, grpcProbes()...)
	all = append(all, inputProbes()...)
	all = append(all, fuzzProbes()...)
	all = append(all, staffProbes()...)
	all = append(all, consoleProbes()...)
	all = append(all, customerProbes()...)
	return all
}

// verifyProbe runs last, once every other probe is done and the pipeline can drain.
var verifyProbe = probe{name: "F3-reconcile-verify", serial: true,
	desc: "after every probe, `reconcile verify` exits 0 on the deployment (counters, counting-only quotas included, equal the billing log)",
	run:  reconcileVerify}

// TestSecurity runs every probe against one deployment: the serial probes first, then the
// others in parallel, then reconcile verify.
func TestSecurity(t *testing.T) {
	all := probes()
	started := false
	t.Cleanup(func() {
		if !started {
			notRun(append(all, verifyProbe), "the deployment did not start (see the test's output)")
		}
	})
	s := newStack(t)
	started = true
	for _, pr := range all {
		if pr.serial {
			runProbe(t, s, pr)
		}
	}
	t.Run("parallel", func(t *testing.T) {
		for _, pr := range all {
			if !pr.serial {
				runProbe(t, s, pr)
			}
		}
	})
	runProbe(t, s, verifyProbe)
}
