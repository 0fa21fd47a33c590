// Package gatewaytest runs the shipped forward-auth configurations of deploy/gateways
// (nginx.conf, Caddyfile) with the real nginx and Caddy in front of an app that records
// what reaches it, for tests (deploy/gateways' own tests and the security suite).
package gatewaytest

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/metergate/metergate/deploy/gateways"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/testenv"
)

// Reply is what the Upstream answers every request it gets.
const Reply = "hello from the app\n"

// Upstream is the app behind a gateway: it records the headers of every request that
// reaches it (the event id api.EventIDHeader and the account api.AccountHeader among them).
type Upstream struct {
	Addr    string // host:port
	mu      sync.Mutex
	headers []http.Header
}

// StartUpstream starts an Upstream, stopped when the test ends.
func StartUpstream(tb testing.TB) *Upstream {
	tb.Helper()
	u := &Upstream{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.headers = append(u.headers, r.Header.Clone())
		u.mu.Unlock()
		_, _ = io.WriteString(w, Reply)
	}))
	tb.Cleanup(hs.Close)
	u.Addr = hs.Listener.Addr().String()
	return u
}

// Seen returns the event id of every request that reached the app so far, in order (""
// for a request without one), and the headers of the last one.
func (u *Upstream) Seen() ([]string, http.Header) {
	u.mu.Lock()
	defer u.mu.Unlock()
	events := make([]string, len(u.headers))
	for i, h := range u.headers {
		events[i] = h.Get(api.EventIDHeader)
	}
	var last http.Header
	if len(u.headers) > 0 {
		last = u.headers[len(u.headers)-1]
	}
	return events, last
}

// Requests returns the headers of every request that reached the app so far, in order.
func (u *Upstream) Requests() []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.headers...)
}

// Binary finds a gateway's program on PATH (or in /usr/sbin, nginx's home): missing, the
// test skips, or fails under METERGATE_REQUIRE_SERVICES=1 (make test, CI).
func Binary(tb testing.TB, name string) string {
	tb.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := filepath.Join("/usr/sbin", name); isExec(p) {
		return p
	}
	testenv.SkipOrFail(tb, name+" is not installed: run `make up` (deploy/local/stack.sh installs nginx and caddy) or apt-get install "+name)
	return ""
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Shipped reads a configuration of deploy/gateways as shipped.
func Shipped(tb testing.TB, name string) string {
	tb.Helper()
	raw, err := gateways.Files.ReadFile(name)
	if err != nil {
		tb.Fatalf("read the shipped %s: %v", name, err)
	}
	return string(raw)
}

// Target is what a gateway is put in front of: admit's address and service token, and the
// app's address.
type Target struct {
	AdmitAddr, ServiceToken, UpstreamAddr string
}

var unrendered = regexp.MustCompile(`\$\{[A-Z_]+\}`)

// Nginx runs the shipped nginx.conf, rendered for target, with real nginx on a free port,
// waits until it answers and returns its base URL.
func Nginx(tb testing.TB, target Target) string {
	tb.Helper()
	_, port := freePort(tb)
	conf := gateways.Render(Shipped(tb, "nginx.conf"), map[string]string{"METERGATE_LISTEN": port,
		"ADMIT_ADDR": target.AdmitAddr, "UPSTREAM_ADDR": target.UpstreamAddr, "ADMIT_SERVICE_TOKEN": target.ServiceToken})
	if m := unrendered.FindString(conf); m != "" {
		tb.Fatalf("nginx.conf: %s is not rendered", m)
	}
	StartNginx(tb, conf)
	url := "http://127.0.0.1:" + port
	WaitServing(tb, url)
	return url
}

// Caddy runs the shipped Caddyfile, its {$...} values from target, with real Caddy on a
// free port, waits until it answers and returns its base URL.
func Caddy(tb testing.TB, target Target) string {
	tb.Helper()
	_, port := freePort(tb)
	StartCaddy(tb, []string{"METERGATE_LISTEN=" + port, "ADMIT_ADDR=" + target.AdmitAddr,
		"UPSTREAM_ADDR=" + target.UpstreamAddr, "ADMIT_SERVICE_TOKEN=" + target.ServiceToken})
	url := "http://127.0.0.1:" + port
	WaitServing(tb, url)
	return url
}

func freePort(tb testing.TB) (host, port string) {
	tb.Helper()
	host, port, err := net.SplitHostPort(testenv.FreeAddr(tb))
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	return host, port
}

// StartNginx runs nginx with conf (nginx.conf rendered) in a directory of its own; its
// error.log is logged if the test failed.
func StartNginx(tb testing.TB, conf string) {
	tb.Helper()
	bin := Binary(tb, "nginx")
	dir := tb.TempDir()
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		tb.Fatalf("write nginx.conf: %v", err)
	}
	global := "daemon off;"
	if os.Geteuid() == 0 {
		global += " user root;" // the workers read the test's private directory
	}
	Run(tb, bin, nil, "-p", dir, "-c", path, "-g", global)
	tb.Cleanup(func() {
		if tb.Failed() {
			if raw, err := os.ReadFile(filepath.Join(dir, "error.log")); err == nil {
				tb.Logf("nginx error.log:\n%s", raw)
			}
		}
	})
}

// StartCaddy runs Caddy with the shipped Caddyfile, its {$...} values from env.
func StartCaddy(tb testing.TB, env []string) {
	tb.Helper()
	bin := Binary(tb, "caddy")
	dir := tb.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(Shipped(tb, "Caddyfile")), 0o600); err != nil {
		tb.Fatalf("write Caddyfile: %v", err)
	}
	env = append(env, "CADDY_STORAGE="+filepath.Join(dir, "storage"), "HOME="+dir,
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"))
	Run(tb, bin, env, "run", "--config", path, "--adapter", "caddyfile")
}

// Run starts a gateway in a process group of its own, its output in a file (nginx's
// workers outlive a killed master and would hold a pipe open), and stops it when the test
// ends: SIGTERM, then SIGKILL to the group after 10 s. Its output is logged if the test
// failed.
func Run(tb testing.TB, bin string, env []string, args ...string) {
	tb.Helper()
	out, err := os.CreateTemp(tb.TempDir(), filepath.Base(bin)+"-*.log")
	if err != nil {
		tb.Fatalf("log of %s: %v", bin, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }() // the exit status of a stopped gateway says nothing
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		_ = out.Close()
		if tb.Failed() {
			raw, _ := os.ReadFile(out.Name())
			tb.Logf("output of %s %v:\n%s", filepath.Base(bin), args, raw)
		}
	})
}

// WaitServing polls the gateway until it answers (anything: a 401 for no key is fine).
func WaitServing(tb testing.TB, url string) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the gateway never answered at %s: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
