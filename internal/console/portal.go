package console

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/customer"
)

// The customer portal (docs/portal.md#the-portal-pages) is the second handler of this
// package: pages at /portal/ for the operator's customers, with the console's toolkit
// (templates, inline SVG charts, headers, CSRF) and its habits. A customer arrives by a
// portal session's one-time link; opening it makes a customer token of an hour, which the
// session cookie holds. Every page reads the customer API (/v1/portal/…) in this process
// with that token, so the API's scope and subtree checks apply to the pages unchanged: the
// portal has no data access of its own, only its sessions (customer.Store).

// PortalSessions opens portal session links and checks their tokens (customer.Store).
type PortalSessions interface {
	// OpenSession opens a link once: the session, its new customer token and the token's
	// secret; customer.ErrNotFound for a link unknown, opened already or expired.
	OpenSession(ctx context.Context, code string) (customer.Session, customer.Token, string, error)
	// SessionOf is the session whose opening made token tokenID.
	SessionOf(ctx context.Context, tokenID string) (customer.Session, error)
	Authenticate(ctx context.Context, secret string) (customer.Token, error)
	Revoke(ctx context.Context, id, by string) (customer.Token, error)
}

// DefaultPortalColor is the brand color of a portal configured without one.
const DefaultPortalColor = "#0a58ca"

// validColor is a brand color: #rrggbb.
var validColor = regexp.MustCompile(`^#[0-9a-fA-F]{6}$`)

// ValidColor reports whether s is a brand color the portal takes: #rrggbb.
func ValidColor(s string) bool { return validColor.MatchString(s) }

// PortalConfig assembles a Portal.
type PortalConfig struct {
	Log *slog.Logger
	// API is the customer API (api.Server): every page reads it, and every write goes
	// through it, in this process with the session's customer token.
	API http.Handler
	// Sessions opens the links and checks the session cookie's token.
	Sessions PortalSessions
	// InsecureCookies sends the session cookie without Secure, for a portal on loopback
	// over plain HTTP (CONSOLE_INSECURE_COOKIES, as the console's); never across a network.
	InsecureCookies bool
	// Brand is the operator's name in the pages ("Back to Acme Cloud"); empty: "your provider".
	Brand string
	// Color is the brand's color, #rrggbb (DefaultPortalColor when empty): the rule under
	// the pages' header.
	Color string
	// TopUpURL is where the balance's top-up link goes, "{account}" in it replaced by the
	// account's id; empty: no link.
	TopUpURL string
	// Now is the clock (time.Now when nil): the months the usage charts show.
	Now func() time.Time
}

// Portal serves the customer portal's pages.
type Portal struct {
	cfg PortalConfig
	mux *http.ServeMux
}

// NewPortal returns a Portal; mount it with Mount.
func NewPortal(cfg PortalConfig) *Portal {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Color == "" {
		cfg.Color = DefaultPortalColor
	}
	if !ValidColor(cfg.Color) {
		panic("console: portal color " + cfg.Color + " is not #rrggbb") // config.Portal.Validate refuses it first
	}
	p := &Portal{cfg: cfg, mux: http.NewServeMux()}
	p.routes()
	return p
}

// Mount serves the portal below /portal/ on mux.
func (p *Portal) Mount(mux *http.ServeMux) {
	mux.Handle("/portal/", p)
	mux.Handle("GET /portal", http.RedirectHandler("/portal/", http.StatusMovedPermanently))
}

// ServeHTTP serves a portal page with the console's security headers; a panic in a page
// is a logged 500, never a crash.
func (p *Portal) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	servePage(w, r, p.mux, p.cfg.Log, "portal")
}

// portalPage is a portal page's handler: v is the request's session.
type portalPage func(w http.ResponseWriter, r *http.Request, v *portalView)

// portalView is what a portal page knows of its request: the session's token, and what it
// renders with.
type portalView struct {
	p      *Portal
	secret string // the session's customer token
	// Token is the session's customer token (without its secret).
	Token customer.Token
	// Back is the session's return_url: the "Back to" link.
	Back  string
	Title string
	Nav   string
	Flash string
}

// Brand is the operator's name.
func (v *portalView) Brand() string { return v.p.cfg.Brand }

// Has reports whether the session's token has scope (usage:read, billing:read, keys:write,
// accounts:write): a page shows only what its token may read or do.
func (v *portalView) Has(scope string) bool { return v.Token.Has(customer.Scope(scope)) }

// CSRF is the session's CSRF token, for every form.
func (v *portalView) CSRF() string { return portalCSRF(v.secret) }

// SignedIn reports whether the page is of a live session (the error pages are not always).
func (v *portalView) SignedIn() bool { return v.secret != "" }

// portalCSRF is the CSRF token of the session whose cookie holds secret: a hash of it,
// which a page holds and another site cannot compute.
func portalCSRF(secret string) string {
	h := sha256.Sum256([]byte("metergate portal csrf\x00" + secret))
	return base64.RawURLEncoding.EncodeToString(h[:])
}

// portalCookieName is the session cookie's: "__Host-" binds it to this host, path / and
// HTTPS, which a loopback portal without TLS (InsecureCookies) cannot have.
func (p *Portal) portalCookieName() string {
	if p.cfg.InsecureCookies {
		return "mg_portal"
	}
	return "__Host-mg_portal"
}

// sessionCookie is the session cookie holding secret for maxAge seconds (-1: deleted). It
// is SameSite=Lax, not Strict as the console's: a customer comes to the portal by a link
// on the operator's site, and a Strict cookie would not be sent on that first visit. Lax
// still keeps it off every request another site makes but a top-level GET, and no GET of
// the portal changes anything.
func (p *Portal) sessionCookie(secret string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: p.portalCookieName(), Value: secret, Path: "/", MaxAge: maxAge, HttpOnly: true, //nolint:gosec // G124: Secure unless configured for loopback
		Secure: !p.cfg.InsecureCookies, SameSite: http.SameSiteLaxMode}
}

// signedIn wraps a page of the session's token, which must have scope ("" for any): a
// request without a live session gets the "session ended" page, a token without the scope
// a 403, and a write must carry the session's CSRF token from the same site.
func (p *Portal) signedIn(scope customer.Scope, pg portalPage) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := p.session(r)
		if errors.Is(err, customer.ErrNotFound) {
			p.ended(w, r)
			return
		}
		if err != nil {
			p.cfg.Log.Error("portal session", "err", err)
			p.fail(w, r, nil, http.StatusServiceUnavailable, "The portal cannot be reached right now; retry shortly.")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && (!sameOrigin(r) || !validPortalCSRF(v.secret, r)) {
			p.fail(w, r, v, http.StatusForbidden, "This form has expired or came from another site. Reload the page and try again.")
			return
		}
		if scope != "" && !v.Token.Has(scope) {
			p.fail(w, r, v, http.StatusForbidden, fmt.Sprintf("Your access does not include this page (it needs %s).", scope))
			return
		}
		pg(w, r, v)
	}
}

// session is r's live session: its cookie's token, live and made by a portal session's
// link (a token issued through the admin API does not sign into the portal); an error
// that is customer.ErrNotFound for none.
func (p *Portal) session(r *http.Request) (*portalView, error) {
	ck, err := r.Cookie(p.portalCookieName())
	if err != nil || !strings.HasPrefix(ck.Value, customer.TokenPrefix) {
		return nil, customer.ErrNotFound
	}
	tok, err := p.cfg.Sessions.Authenticate(r.Context(), ck.Value)
	if err != nil {
		return nil, err
	}
	sess, err := p.cfg.Sessions.SessionOf(r.Context(), tok.ID)
	if err != nil {
		return nil, err
	}
	return &portalView{p: p, secret: ck.Value, Token: tok, Back: sess.ReturnURL}, nil
}

// validPortalCSRF reports whether a form carries the CSRF token of the session of secret.
func validPortalCSRF(secret string, r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(portalCSRF(secret))) == 1
}

// ended answers a request without a live session: its cookie is cleared, and the page says
// how to come back.
func (p *Portal) ended(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, p.sessionCookie("", -1))
	p.fail(w, r, nil, http.StatusUnauthorized, "Your portal session has ended. Open the portal again from "+p.operator()+".")
}

// operator names the operator in a sentence: its brand, or "your provider's site".
func (p *Portal) operator() string {
	if p.cfg.Brand == "" {
		return "your provider's site"
	}
	return p.cfg.Brand
}

// fail renders an error page (v nil: without a session).
func (p *Portal) fail(w http.ResponseWriter, r *http.Request, v *portalView, status int, msg string) {
	if v == nil {
		v = &portalView{p: p}
	}
	v.Title = http.StatusText(status)
	p.render(w, r, v, status, "portal_error", struct {
		Status  int
		Message string
	}{status, msg})
}

// apiFailed renders the page of a customer API call that failed: its status and message
// for an error reply (401: the session has ended), a 503 for anything else.
func (p *Portal) apiFailed(w http.ResponseWriter, r *http.Request, v *portalView, err error) {
	var e *apiError
	switch {
	case errors.As(err, &e) && e.Status == http.StatusUnauthorized:
		p.ended(w, r)
	case errors.As(err, &e) && e.Code == "missing_scope":
		p.fail(w, r, v, e.Status, "Your access does not include this page.")
	case errors.As(err, &e):
		p.fail(w, r, v, e.Status, e.Message)
	default:
		p.cfg.Log.Error("portal", "path", r.URL.Path, "err", err)
		p.fail(w, r, v, http.StatusServiceUnavailable, "That cannot be done right now; retry shortly.")
	}
}

// raw calls the customer API with the session's token and returns its reply.
func (v *portalView) raw(ctx context.Context, method, path string, body any) (*reply, error) {
	// Served in this process, never sent: path is one of the customer API's.
	return inProcess(ctx, v.p.cfg.API, method, path, body, func(req *http.Request) {
		req.Header.Set("Authorization", "Bearer "+v.secret)
	})
}

// call calls the customer API with the session's token and decodes its JSON reply into
// out (when not nil); an error reply is an *apiError.
func (v *portalView) call(ctx context.Context, method, path string, body, out any) error {
	rep, err := v.raw(ctx, method, path, body)
	return decodeReply(rep, err, method, path, out)
}

// portalPages are the portal's templates, one per page: portal_layout.html with the page's
// "content" (and the console's partials: its chart).
var portalPages = parsePortalPages()

func parsePortalPages() map[string]*template.Template {
	layout := template.Must(template.New("portal_layout.html").Funcs(funcs).Funcs(template.FuncMap{"month": monthOf}).ParseFS(templateFiles,
		"templates/portal_layout.html", "templates/partials.html"))
	names, err := fs.Glob(templateFiles, "templates/portal_*.html")
	if err != nil {
		panic(err)
	}
	out := map[string]*template.Template{}
	for _, name := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(name, "templates/"), ".html")
		if base == "portal_layout" {
			continue
		}
		out[base] = template.Must(template.Must(layout.Clone()).ParseFS(templateFiles, name))
	}
	return out
}

// render writes portal page name with data, in the portal's layout, with status.
func (p *Portal) render(w http.ResponseWriter, _ *http.Request, v *portalView, status int, name string, data any) {
	t, ok := portalPages[name]
	if !ok {
		panic("console: no portal page " + name)
	}
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, "portal_layout.html", struct {
		*portalView
		Data any
	}{v, data}); err != nil {
		p.cfg.Log.Error("render portal page", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = b.WriteTo(w)
}

// portalStatic serves the portal's stylesheets: the console's, the portal's own, and the
// brand's color (made from the configuration).
func (p *Portal) portalStatic(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "public, max-age=3600")
	switch r.PathValue("file") {
	case "console.css":
		http.ServeFileFS(w, r, staticFiles, "static/console.css")
	case "portal.css":
		http.ServeFileFS(w, r, staticFiles, "static/portal.css")
	case "brand.css":
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		// The color is #rrggbb (NewPortal checks it): nothing else reaches the stylesheet.
		_, _ = fmt.Fprintf(w, ":root { --brand: %s; }\n", p.cfg.Color)
	default:
		http.NotFound(w, r)
	}
}

// openSession opens a portal session's link: once, within its minutes, it sets the session
// cookie of a new customer token and sends the customer to the overview. A link opened
// already, expired or unknown gets an error page and no session; a HEAD opens nothing.
func (p *Portal) openSession(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodHead {
		// A link checker's probe must not spend the link: only a GET opens it.
		w.WriteHeader(http.StatusOK)
		return
	}
	_, tok, secret, err := p.cfg.Sessions.OpenSession(r.Context(), r.PathValue("code"))
	if errors.Is(err, customer.ErrNotFound) {
		p.fail(w, r, nil, http.StatusNotFound, "This link has been opened already, or has expired: a link opens once, within "+
			strconv.Itoa(int(customer.LinkTTL/time.Minute))+" minutes. Open the portal again from "+p.operator()+".")
		return
	}
	if err != nil {
		p.cfg.Log.Error("open a portal session", "err", err)
		p.fail(w, r, nil, http.StatusServiceUnavailable, "The portal cannot be reached right now; retry shortly.")
		return
	}
	http.SetCookie(w, p.sessionCookie(secret, int(tok.ExpiresAt.Sub(p.cfg.Now())/time.Second)))
	http.Redirect(w, r, "/portal/", http.StatusSeeOther)
}

// signOut ends the session: its token is revoked (by itself) and its cookie cleared.
func (p *Portal) signOut(w http.ResponseWriter, r *http.Request, v *portalView) {
	if _, err := p.cfg.Sessions.Revoke(r.Context(), v.Token.ID, v.Token.ID); err != nil && !errors.Is(err, customer.ErrNotFound) {
		p.cfg.Log.Error("portal: sign out", "err", err)
		p.fail(w, r, v, http.StatusServiceUnavailable, "You could not be signed out right now; retry shortly.")
		return
	}
	http.SetCookie(w, p.sessionCookie("", -1))
	back := v.Back
	v = &portalView{p: p, Back: back, Title: "Signed out"}
	p.render(w, r, v, http.StatusOK, "portal_signed_out", nil)
}

// topUp is the top-up link of account: TopUpURL with its id; "" when none is configured.
func (p *Portal) topUp(account string) string {
	if p.cfg.TopUpURL == "" {
		return ""
	}
	return strings.ReplaceAll(p.cfg.TopUpURL, "{account}", url.PathEscape(account))
}
