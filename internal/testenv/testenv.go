// Package testenv finds the real Redis, Redis Cluster, PostgreSQL and Kafka that
// integration tests run against, isolates tests from each other on them, and starts the
// commands a test runs as child processes.
//
// Services are found through REDIS_URL, METERGATE_TEST_REDIS_CLUSTER_ADDRS,
// METERGATE_TEST_SENTINEL_ADDRS, DATABASE_URL and KAFKA_BROKERS (`make up && . .run/env`
// sets them). When a variable is unset and a Docker daemon answers,
// testcontainers-go starts the service for the test process. Otherwise the test is skipped
// with a message naming `make up`, except under METERGATE_REQUIRE_SERVICES=1 (set by
// `make test` and CI), where it fails.
//
// Isolation: Postgres gives each test package its own schema with every migration applied;
// Topic gives each test its own Kafka topic; Prefix gives each test its own Redis key prefix.
// Packages that use Postgres call Run from TestMain so the schema is dropped at the end.
//
// What a few tests need lives apart: servers of one test alone, which it may stop, crash
// and stall (testenv/private), and the stack's Sentinel and Kafka cluster, whose nodes a
// test kills (testenv/failover).
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequireServices reports whether a missing service fails tests instead of skipping them.
func RequireServices() bool { return os.Getenv("METERGATE_REQUIRE_SERVICES") == "1" }

// Unavailable skips the test because service cannot be reached (why), with a message
// naming `make up` and env, the variable that names the service; under
// METERGATE_REQUIRE_SERVICES=1 it fails the test instead.
func Unavailable(tb testing.TB, service, env, why string) {
	tb.Helper()
	SkipOrFail(tb, fmt.Sprintf("%s unavailable (%s): run `make up` (and `make up-cluster` for the cluster, `make up-sentinel` for Sentinel) and `. .run/env`, or set %s", service, why, env))
}

// SkipOrFail skips the test for want of what msg names (a service, a tool); under
// METERGATE_REQUIRE_SERVICES=1 (make test, CI) it fails the test instead.
func SkipOrFail(tb testing.TB, msg string) {
	tb.Helper()
	if RequireServices() {
		tb.Fatalf("METERGATE_REQUIRE_SERVICES=1: %s", msg)
	}
	tb.Skip(msg)
}

// Random returns n random bytes as lowercase hex.
func Random(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}

var unsafeChars = regexp.MustCompile(`[^a-z0-9]+`)

// Name returns a short identifier unique to this test and safe in Redis keys, SQL
// identifiers and Kafka topic names: the test's name, lowercased, plus random hex.
func Name(tb testing.TB) string {
	base := strings.Trim(unsafeChars.ReplaceAllString(strings.ToLower(tb.Name()), "_"), "_")
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	return base + "_" + Random(4)
}

// cleanups run once at process end through Run (dropping schemas, stopping containers).
var (
	cleanupMu sync.Mutex
	cleanups  []func(context.Context)
)

func atExit(f func(context.Context)) {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	cleanups = append(cleanups, f)
}

// Run runs the package's tests, then drops what the package created for all its tests (the
// Postgres schema, containers). Call it from TestMain: os.Exit(testenv.Run(m)).
func Run(m *testing.M) int {
	code := m.Run()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i](ctx)
	}
	return code
}

// Context returns a context ended by the test's deadline (or after d, whichever is first)
// and cancelled when the test ends.
func Context(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	if t, ok := tb.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := t.Deadline(); ok {
			var cancelDL context.CancelFunc
			ctx, cancelDL = context.WithDeadline(ctx, dl.Add(-5*time.Second))
			tb.Cleanup(cancelDL)
		}
	}
	return ctx
}

// StackScript returns the path of deploy/local/stack.sh, found upwards from the test's
// directory: what restarts the stack's servers a test killed.
func StackScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		script := filepath.Join(dir, "deploy/local/stack.sh")
		if _, err := os.Stat(script); err == nil {
			return script, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no deploy/local/stack.sh above the test's directory")
		}
		dir = parent
	}
}
