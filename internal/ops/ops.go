// Package ops serves what operators and orchestrators ask of every long-running binary:
// /healthz (the process is alive), /readyz (every dependency answers) and /metrics
// (Prometheus); and it bounds what a client may hold of its listeners: the deadlines and
// header limit of the HTTP servers (HTTP), the connections, streams, messages and
// keepalives of a gRPC server (GRPC, LimitListener) and its streaming calls (StreamGuard).
package ops

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check reports whether one dependency is usable; nil means ready.
type Check func(ctx context.Context) error

// Probes holds the named readiness checks of a binary.
type Probes struct {
	// Timeout bounds every check of one /readyz call; 2 s when zero.
	Timeout time.Duration

	mu       sync.RWMutex
	checks   map[string]Check
	degraded map[string]bool
}

// Add registers (or replaces) the readiness check called name.
func (p *Probes) Add(name string, c Check) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.checks == nil {
		p.checks = make(map[string]Check)
	}
	p.checks[name] = c
	delete(p.degraded, name)
}

// AddDegraded registers a check whose failure is reported by /readyz but leaves the
// binary ready ("status": "degraded", still 200): for a dependency it can serve without,
// as admit serves rate-only accounts fail-open while Redis is down.
func (p *Probes) AddDegraded(name string, c Check) {
	p.Add(name, c)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.degraded == nil {
		p.degraded = make(map[string]bool)
	}
	p.degraded[name] = true
}

func (p *Probes) isDegraded(name string) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.degraded[name]
}

// Run runs every check concurrently and returns each one's error text ("" when ready).
func (p *Probes) Run(ctx context.Context) map[string]string {
	timeout := p.Timeout
	if timeout == 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	p.mu.RLock()
	defer p.mu.RUnlock()
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = make(map[string]string, len(p.checks))
	)
	for name, check := range p.checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := ""
			if err := check(ctx); err != nil {
				msg = err.Error()
			}
			mu.Lock()
			out[name] = msg
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// Mount adds /healthz, /readyz and /metrics (from gatherer) to mux.
func (p *Probes) Mount(mux *http.ServeMux, gatherer prometheus.Gatherer) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", p.serveReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
}

type checkResult struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Degraded marks a check whose failure does not make the binary unready.
	Degraded bool `json:"degraded,omitempty"`
}

func (p *Probes) serveReady(w http.ResponseWriter, r *http.Request) {
	results := p.Run(r.Context())
	body := struct {
		Status string        `json:"status"`
		Checks []checkResult `json:"checks"`
	}{Status: "ready"}
	code := http.StatusOK
	for name, msg := range results {
		degraded := p.isDegraded(name)
		body.Checks = append(body.Checks, checkResult{Name: name, OK: msg == "", Error: msg, Degraded: degraded})
		switch {
		case msg == "":
		case degraded && code == http.StatusOK:
			body.Status = "degraded"
		case !degraded:
			body.Status, code = "not ready", http.StatusServiceUnavailable
		}
	}
	sort.Slice(body.Checks, func(i, j int) bool { return body.Checks[i].Name < body.Checks[j].Name })
	writeJSON(w, code, body)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // the client went away; nothing to do
}
