package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metergate/metergate/internal/sandbox"
)

// buildBinaries builds the main packages pkgs (as `go build` takes them, relative to the
// test's directory) into a new temporary directory and returns it; the caller removes it.
// A directory that is a module of its own (it holds a go.mod) is built in it, into a
// binary named after the directory.
func buildBinaries(pkgs ...string) (string, error) {
	dir, err := os.MkdirTemp("", "metergate-bin-")
	if err != nil {
		return "", err
	}
	type build struct {
		cmd  *exec.Cmd
		what []string
	}
	var builds []build
	var ours []string
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(p, "go.mod")); err != nil {
			ours = append(ours, p)
			continue
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, filepath.Base(p)), ".")
		cmd.Dir = p
		builds = append(builds, build{cmd, []string{p}})
	}
	if len(ours) > 0 {
		builds = append(builds, build{exec.Command("go", append([]string{"build", "-o", dir + "/"}, ours...)...), ours})
	}
	for _, b := range builds {
		if out, err := b.cmd.CombinedOutput(); err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("build %v: %w\n%s", b.what, err, out)
		}
	}
	return dir, nil
}

// RunWithBinaries is Run for a TestMain whose tests start binaries: it builds pkgs
// (buildBinaries) into a directory it stores in *bin, runs the tests and removes the
// directory. A failed build fails the run (status 1) without running a test.
func RunWithBinaries(m *testing.M, bin *string, pkgs ...string) int {
	dir, err := buildBinaries(pkgs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	*bin = dir
	return Run(m)
}

// ReexecEnv is set in the environment of a test binary started by StartMain: the test's
// TestMain then runs the command's main instead of the tests (see MainOrTests).
const ReexecEnv = "METERGATE_TEST_RUN_MAIN"

// MainOrTests runs main when this test binary was started by StartMain and m's tests
// otherwise. Call it from the TestMain of a command: os.Exit(testenv.MainOrTests(m, main)).
func MainOrTests(m *testing.M, main func()) int {
	if os.Getenv(ReexecEnv) == "1" {
		main()
		return 0
	}
	return Run(m)
}

// Process is a child process started by Start or StartMain: sandbox's runner.
type Process = sandbox.Proc

// SyncBuffer is a bytes.Buffer that goroutines may write to while another reads it (logs
// written in the background).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// StartMain starts this test binary again as the command (see MainOrTests) with args and
// the extra environment variables env ("K=V") on top of the test's own. The process is
// killed when the test ends if it still runs.
func StartMain(tb testing.TB, env []string, args ...string) *Process {
	tb.Helper()
	return Start(tb, os.Args[0], append([]string{ReexecEnv + "=1"}, env...), args...)
}

// Start starts the program at path with args and the extra environment variables env
// ("K=V") on top of the test's own. The process is killed when the test ends if it still
// runs, and its output is logged if the test failed.
func Start(tb testing.TB, path string, env []string, args ...string) *Process {
	tb.Helper()
	p, err := sandbox.StartCommand(sandbox.Command{Name: filepath.Base(path), Path: path, Args: args,
		Env: append(append([]string(nil), env...), migrateEnv(env)...), Log: filepath.Join(tb.TempDir(), "output.log")})
	if err != nil {
		tb.Fatalf("start %s: %v", path, err)
	}
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() {
			tb.Logf("output of %s %v:\n%s", filepath.Base(path), args, p.Output())
		}
	})
	return p
}

// FreeAddr returns a loopback address with a port that was free a moment ago, and that no
// earlier call of this process returned (sandbox.FreeAddr).
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	addr, err := sandbox.FreeAddr()
	if err != nil {
		tb.Fatalf("free address: %v", err)
	}
	return addr
}

// WaitHTTP polls url until it answers with status want or ctx ends, and returns the body.
func WaitHTTP(ctx context.Context, url string, want int) (string, error) {
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				return b.String(), nil
			}
			last = fmt.Sprintf("status %d: %s", resp.StatusCode, b.String())
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("GET %s: want %d, last: %s: %w", url, want, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WithSearchPath returns the database URL with its search_path set to schema, so a process
// given it works inside that schema.
func WithSearchPath(tb testing.TB, dbURL, schema string) string {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("DATABASE_URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// migrateEnv returns the DATABASE_MIGRATE_URL a child given env needs when env sets
// DATABASE_URL and not DATABASE_MIGRATE_URL (see childMigrateURL): the test's own would
// migrate another schema than the child's.
func migrateEnv(env []string) []string {
	dbURL, set := "", false
	for _, kv := range env {
		switch {
		case strings.HasPrefix(kv, "DATABASE_MIGRATE_URL="):
			return nil
		case strings.HasPrefix(kv, "DATABASE_URL="):
			dbURL, set = strings.TrimPrefix(kv, "DATABASE_URL="), true
		}
	}
	if !set {
		return nil
	}
	return []string{"DATABASE_MIGRATE_URL=" + childMigrateURL(dbURL)}
}

// FailpointEnv names the failpoint of a command's test build (its failpoint_test.go, run
// through StartMain): "<point>:<n>", the n-th time the command reaches point.
const FailpointEnv = "METERGATE_FAILPOINT"

// Failpoint reads FailpointEnv: set is false when it is empty. A malformed value ends the
// process with status 2, as a bad flag would.
func Failpoint() (point string, n int, set bool) {
	v := os.Getenv(FailpointEnv)
	if v == "" {
		return "", 0, false
	}
	point, nth, ok := strings.Cut(v, ":")
	n, err := strconv.Atoi(nth)
	if !ok || err != nil || n < 1 {
		fmt.Fprintf(os.Stderr, "%s=%q: want <point>:<n>\n", FailpointEnv, v)
		os.Exit(2)
	}
	return point, n, true
}
