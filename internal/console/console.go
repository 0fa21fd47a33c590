// Package console is admit's web console (docs/console.md): server-rendered pages at
// /console/ for operators, support and finance, from the same binary, with every asset
// embedded and no script at all.
//
// The console reads what it shows from PostgreSQL, Redis and this node's metrics, and does
// every write by calling the admin API in this process as the member of its session
// (api.AsStaff): the API's validation, role checks and audit log apply to the console's
// writes unchanged. Sessions are cookies (HttpOnly, SameSite=Strict, Secure unless
// configured for loopback) looked up on every page; every form carries the session's CSRF
// token; every page is sent with a Content-Security-Policy that allows no script and no
// framing.
package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/staff"
)

// Staff authenticates staff tokens (staff.Store).
type Staff interface {
	Authenticate(ctx context.Context, token string) (staff.Member, error)
	Record(ctx context.Context, e staff.Entry) (staff.Entry, error)
}

// Policies resolves an account's effective policy (policy.Cache).
type Policies interface {
	Resolve(account string) (policy.Resolved, error)
}

// Counters reads an account's live quota counters (admission.Admitter).
type Counters interface {
	Usage(ctx context.Context, p policy.Resolved) (map[policy.Unit]admission.UnitUsage, error)
}

// Balances reads an account's prepaid credit balances and grants (credit.Store).
type Balances interface {
	Balance(ctx context.Context, account string) (credit.Balance, error)
}

// Config assembles a Console.
type Config struct {
	Log *slog.Logger
	// API is the admin API (api.Server): every write of the console is a call to it, in
	// this process, as the member of the session.
	API http.Handler
	// Staff signs staff in by their tokens and audits the console's own writes (sessions).
	Staff Staff
	// AdminToken signs in as an admin too (ADMIT_ADMIN_TOKEN); empty: staff tokens only.
	AdminToken string
	Pool       *pgxpool.Pool
	Policies   Policies
	Counters   Counters
	// Balances shows the account page's credit balances and grants; nil: not shown.
	Balances Balances
	// Refusals is the refusal log (the "Why?" page and the account page's recent
	// refusals); nil: refusals are not shown.
	Refusals Refusals
	// Metrics is this node's registry: the overview's decisions and refusals.
	Metrics prometheus.Gatherer
	// InsecureCookies sends the session cookie without Secure, for a console on loopback
	// over plain HTTP (CONSOLE_INSECURE_COOKIES); never across a network.
	InsecureCookies bool
	// SessionTTL is how long a session lasts from its login (DefaultSessionTTL when 0).
	SessionTTL time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Console serves the pages.
type Console struct {
	cfg Config
	mux *http.ServeMux

	minutes minuteSamples // this node's counters per minute (overview.go)

	mu   sync.Mutex
	last sample // this node's counters at the overview's last sample (overview.go)
}

// New returns a Console; mount it with Mount.
func New(cfg Config) *Console {
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := &Console{cfg: cfg, mux: http.NewServeMux()}
	c.routes()
	return c
}

func (c *Console) now() time.Time { return c.cfg.Now() }

// Mount serves the console below /console/ on mux.
func (c *Console) Mount(mux *http.ServeMux) {
	mux.Handle("/console/", c)
	mux.Handle("GET /console", http.RedirectHandler("/console/", http.StatusMovedPermanently))
}

// ServeHTTP serves a console page with the console's security headers; a panic in a page
// is a logged 500, never a crash.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	servePage(w, r, c.mux, c.cfg.Log, "console")
}

// servePage serves a page of mux (the console's or the portal's, named what in the log)
// with the pages' security headers, a bounded form, and a panic made a logged 500.
func servePage(w http.ResponseWriter, r *http.Request, mux *http.ServeMux, log *slog.Logger, what string) {
	pageHeaders(w.Header())
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler { //nolint:errorlint // a sentinel panic value, compared as net/http does
				panic(v)
			}
			log.Error(what+" page panicked", "path", r.URL.Path, "panic", v)
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
	}()
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	mux.ServeHTTP(&timed{ResponseWriter: w, start: time.Now()}, r)
}

// pageHeaders sets the security headers of every page of the console and the portal: no
// script at all, no framing, forms posting only here, nothing cached.
func pageHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// timed tells the browser, and make bench, how long the server took to make a page: a
// Server-Timing header ("app;dur=12.3", in milliseconds) set when the reply starts.
type timed struct {
	http.ResponseWriter
	start time.Time
	sent  bool
}

func (t *timed) WriteHeader(status int) {
	if !t.sent {
		t.sent = true
		t.Header().Set("Server-Timing", fmt.Sprintf("app;dur=%.1f", float64(time.Since(t.start).Microseconds())/1000))
	}
	t.ResponseWriter.WriteHeader(status)
}

func (t *timed) Write(b []byte) (int, error) {
	if !t.sent {
		t.WriteHeader(http.StatusOK)
	}
	return t.ResponseWriter.Write(b)
}

// maxForm bounds a form's body: every form of the console is a few fields.
const maxForm = 64 << 10

// page is a console page's handler: v is the request's signed-in view.
type page func(w http.ResponseWriter, r *http.Request, v *view)

// view is what a page knows of its request: the session, and what it renders with.
type view struct {
	c       *Console
	s       session
	hash    []byte // the session's id hash
	Title   string
	Nav     string
	Flash   string
	Refresh int // seconds between reloads of the page; 0: none
}

// Me is the signed-in member.
func (v *view) Me() staff.Member { return v.s.Member }

// CSRF is the session's CSRF token, for every form.
func (v *view) CSRF() string { return v.s.CSRF }

// Can reports whether the signed-in member's role allows the admin API route pattern
// ("POST /v1/admin/api-keys"): a page shows only the forms its viewer may submit.
func (v *view) Can(pattern string) bool { return v.s.Member.Role.Allows(pattern) }

// signedIn wraps a page: a request without a live session is sent to the login page (a
// 401 for a write), and a write must carry the session's CSRF token from the same site.
func (c *Console) signedIn(p page) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, hash, err := c.session(r)
		if errors.Is(err, errNoSession) {
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				http.Redirect(w, r, "/console/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			c.fail(w, r, nil, http.StatusUnauthorized, "Your session has ended. Sign in again.")
			return
		}
		if err != nil {
			c.cfg.Log.Error("console session", "err", err)
			c.fail(w, r, nil, http.StatusServiceUnavailable, "The console cannot reach its database; retry shortly.")
			return
		}
		v := &view{c: c, s: s, hash: hash}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && (!sameOrigin(r) || !validCSRF(s, r)) {
			c.fail(w, r, v, http.StatusForbidden, "This form has expired or came from another site. Reload the page and try again.")
			return
		}
		p(w, r, v)
	}
}

// apiError is an error reply of the admin API.
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// reply is a reply of the admin API, kept in memory.
type reply struct {
	status int
	header http.Header
	body   bytes.Buffer
}

func (r *reply) Header() http.Header         { return r.header }
func (r *reply) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *reply) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

// raw calls the admin API as the signed-in member and returns its reply.
func (v *view) raw(ctx context.Context, method, path string, body any) (*reply, error) {
	// Served in this process, never sent: path is one of the admin API's.
	return inProcess(api.AsStaff(ctx, v.s.Member), v.c.cfg.API, method, path, body, nil)
}

// call calls the admin API as the signed-in member and decodes its JSON reply into out
// (when not nil); an error reply is an *apiError.
func (v *view) call(ctx context.Context, method, path string, body, out any) error {
	rep, err := v.raw(ctx, method, path, body)
	return decodeReply(rep, err, method, path, out)
}

// inProcess serves method path with a JSON body (nil: none) by api, in this process, and
// returns its reply; prepare (when not nil) adds to the request (its credentials).
func inProcess(ctx context.Context, api http.Handler, method, path string, body any, prepare func(*http.Request)) (*reply, error) {
	var in io.Reader = http.NoBody
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		in = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, path, in) //nolint:gosec // G704: served in process, not sent over a network
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if prepare != nil {
		prepare(req)
	}
	rep := &reply{header: http.Header{}}
	api.ServeHTTP(rep, req)
	if rep.status == 0 {
		rep.status = http.StatusOK
	}
	return rep, nil
}

// decodeReply decodes rep, the reply of method path (or err, the call's failure), into
// out (when not nil); an error reply is an *apiError (replyError).
func decodeReply(rep *reply, err error, method, path string, out any) error {
	if err != nil {
		return err
	}
	if rep.status >= 300 {
		return replyError(rep)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(rep.body.Bytes(), out); err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return nil
}

// apiFailed renders the page for an admin API call that failed: its status and message
// for an error reply, a 503 for anything else.
func (c *Console) apiFailed(w http.ResponseWriter, r *http.Request, v *view, err error) {
	var e *apiError
	if errors.As(err, &e) {
		c.fail(w, r, v, e.Status, e.Message)
		return
	}
	c.cfg.Log.Error("console", "path", r.URL.Path, "err", err)
	c.fail(w, r, v, http.StatusServiceUnavailable, "That cannot be done right now; retry shortly.")
}

// unavailable renders a 503 for a read that failed.
func (c *Console) unavailable(w http.ResponseWriter, r *http.Request, v *view, err error) {
	c.cfg.Log.Error("console", "path", r.URL.Path, "err", err)
	c.fail(w, r, v, http.StatusServiceUnavailable, "This page cannot be read right now; retry shortly.")
}

// fail renders an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, v *view, status int, msg string) {
	if v == nil {
		v = &view{c: c}
	}
	v.Title = http.StatusText(status)
	c.render(w, r, v, status, "error", struct {
		Status  int
		Message string
	}{status, msg})
}

// seeOther redirects after a write (POST, redirect, GET) to a page: to is a console or
// portal path the caller built, or safeNext's.
func seeOther(w http.ResponseWriter, r *http.Request, to string) {
	http.Redirect(w, r, to, http.StatusSeeOther) //nolint:gosec // G710: to is always a /console/ or /portal/ path (see above)
}
