package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/staff"
)

// Staff authenticates staff tokens, keeps the staff members and the audit log
// (staff.Store).
type Staff interface {
	Authenticate(ctx context.Context, token string) (staff.Member, error)
	Record(ctx context.Context, e staff.Entry) (staff.Entry, error)
	Create(ctx context.Context, name string, role staff.Role, by string) (staff.Member, string, error)
	Revoke(ctx context.Context, id, by string) error
	Member(ctx context.Context, id string) (staff.Member, error)
	List(ctx context.Context) ([]staff.Member, error)
	Audit(ctx context.Context, f staff.AuditFilter) ([]staff.Entry, error)
}

// staffKey carries the staff member of an in-process call (AsStaff).
type staffKey struct{}

// AsStaff returns a context whose admin API calls, served in this process (Server.ServeHTTP
// with no Authorization header), act as m: the console calls the admin API so, on behalf of
// the member of its session, and the API's role checks and audit log apply unchanged. A
// request from the network cannot carry a context value.
func AsStaff(ctx context.Context, m staff.Member) context.Context {
	return context.WithValue(ctx, staffKey{}, m)
}

// staffOf is who calls the admin API: the member of an in-process call (AsStaff), the admin
// token (an Admin), or a live staff member; a 401 for anything else (a 403 for the service
// token, which opens the other API).
func (s *Server) staffOf(r *http.Request) (staff.Member, *Error) {
	if m, ok := r.Context().Value(staffKey{}).(staff.Member); ok {
		return m, nil
	}
	if bearer(r, s.cfg.AdminToken) {
		return staff.Member{ID: staff.AdminToken, Name: staff.AdminToken, Role: staff.Admin}, nil
	}
	if token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && s.cfg.Staff != nil &&
		strings.HasPrefix(token, staff.TokenPrefix) {
		m, err := s.cfg.Staff.Authenticate(r.Context(), token)
		switch {
		case err == nil:
			return m, nil
		case !errors.Is(err, staff.ErrNotFound):
			s.cfg.Log.Error("authenticate staff", "err", err)
			return staff.Member{}, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
				Message: "staff credentials cannot be checked now; retry later"}
		}
	}
	code := http.StatusUnauthorized
	if bearer(r, s.cfg.ServiceToken) {
		code = http.StatusForbidden // the service token does not open the admin API
	}
	return staff.Member{}, authError(code, "a valid admin or staff token is required (Authorization: Bearer …)")
}

// maxAudited bounds what of a reply the audit log keeps.
const maxAudited = 64 << 10

// recorder keeps a reply's status and the start of its body for the audit log.
type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (w *recorder) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if room := maxAudited - w.body.Len(); room > 0 {
		w.body.Write(b[:min(len(b), room)])
	}
	return w.ResponseWriter.Write(b)
}

// audited runs a write h as who and records it in the audit log: the route, the reply's
// status, what the thing was before (before) and, when the write succeeded, what the reply
// says it is now (after), secrets left out. A write refused (4xx) is recorded too, without
// an after.
func (s *Server) audited(w http.ResponseWriter, r *http.Request, who staff.Member, h http.HandlerFunc) {
	if s.cfg.Staff == nil {
		h(w, r)
		return
	}
	before := s.before(r, who)
	rec := &recorder{ResponseWriter: w}
	// The handler runs as who (AsStaff): one that names its caller (createStaff) asks
	// staffOf without a second lookup of the token.
	r = r.WithContext(AsStaff(r.Context(), who))
	h(rec, r)
	method, route, _ := strings.Cut(r.Pattern, " ")
	e := staff.Entry{Actor: who.ID, Role: who.Role, Method: method, Route: route, Path: auditable(r.URL.Path), Status: rec.status,
		Before: before}
	if rec.status < 300 && rec.body.Len() < maxAudited && json.Valid(rec.body.Bytes()) {
		e.After = redact(rec.body.Bytes(), routeSecrets[r.Pattern]...)
	}
	// The write is done: an audit row that cannot be written is logged loudly, not undone.
	if _, err := s.cfg.Staff.Record(context.WithoutCancel(r.Context()), e); err != nil {
		s.cfg.Log.Error("audit row not written", "actor", who.ID, "route", r.Pattern, "path", r.URL.Path, "err", err)
	}
}

// auditable is path as PostgreSQL's text keeps it: valid UTF-8 without NUL (a request
// refused for such a path is still an audit row).
func auditable(path string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(path, "\uFFFD"), "\x00", "\uFFFD")
}

// before is what a write to r's path finds there: the reply of the admin API's GET of the
// thing it changes, read as who just before the write (secrets left out); nil when the
// thing has no GET route (an API key, a grant) or does not exist yet. The thing is the
// path itself for a PUT or DELETE, and the path without its last segment for a POST to an
// action (/invoices/{id}/void reads /invoices/{id}); a POST that creates has none. A write
// of the customer API (/v1/portal/…) reads the admin API's thing of the same path.
func (s *Server) before(r *http.Request, who staff.Member) json.RawMessage {
	path := r.URL.Path
	if rest, ok := strings.CutPrefix(path, "/v1/portal/"); ok {
		// A customer's write: the thing as the admin API shows it, read in process, and
		// only when it is the customer's own (no other customer's data in its audit row).
		tok, _ := r.Context().Value(customerKey{}).(customer.Token)
		if id := r.PathValue("id"); id != "" && !strings.HasPrefix(rest, "api-keys/") {
			if _, e := s.within(tok, id); e != nil {
				return nil
			}
		}
		path, who = "/v1/admin/"+rest, staff.Member{ID: who.ID, Name: who.Name, Role: staff.Admin}
	}
	if r.Method == http.MethodPost {
		if strings.Count(path, "/") < 5 { // /v1/admin/accounts: a create
			return nil
		}
		path = path[:strings.LastIndexByte(path, '/')]
	}
	get, err := http.NewRequestWithContext(AsStaff(r.Context(), who), http.MethodGet, path, nil) //nolint:gosec // served in process by s.mux, never sent
	if err != nil {
		return nil
	}
	if _, pattern := s.mux.Handler(get); pattern == "" || !strings.HasPrefix(pattern, "GET ") {
		return nil
	}
	rec := &recorder{ResponseWriter: discard{header: http.Header{}}}
	s.mux.ServeHTTP(rec, get)
	if rec.status != http.StatusOK || rec.body.Len() >= maxAudited || !json.Valid(rec.body.Bytes()) {
		return nil
	}
	return redact(rec.body.Bytes())
}

// discard is a ResponseWriter that keeps nothing (recorder keeps what the audit needs).
type discard struct{ header http.Header }

func (d discard) Header() http.Header         { return d.header }
func (d discard) Write(b []byte) (int, error) { return len(b), nil }
func (d discard) WriteHeader(int)             {}

// secretFields are the fields of replies that carry a secret shown once: an API key, a
// webhook's secret, a staff token. The audit log never keeps them.
var secretFields = []string{"key", "api_key", "secret", "token"}

// routeSecrets are the fields of one route's replies that carry a secret besides
// secretFields: a portal session's url holds the link's one-time code (a webhook's url is
// no secret).
var routeSecrets = map[string][]string{"POST /v1/admin/portal-sessions": {"url"}}

// redact is a JSON reply without its secrets (at any depth): secretFields and extra.
func redact(raw []byte, extra ...string) json.RawMessage {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil
	}
	var walk func(any)
	walk = func(v any) {
		switch t := v.(type) {
		case map[string]any:
			for k, c := range t {
				if slices.Contains(secretFields, k) || slices.Contains(extra, k) {
					t[k] = "(redacted)"
				}
				walk(c)
			}
		case []any:
			for _, c := range t {
				walk(c)
			}
		}
	}
	walk(v)
	out, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return out
}

// staffStore wraps a handler of the staff routes and the audit log, opened by admin: 503
// when no staff store is configured.
func (s *Server) staffStore(h func(w http.ResponseWriter, r *http.Request, store Staff)) http.HandlerFunc {
	return s.admin(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Staff == nil {
			s.staffError(w, "staff: no staff store configured", nil)
			return
		}
		h(w, r, s.cfg.Staff)
	})
}

// staffError answers err of the staff store; op names what failed in the log.
func (s *Server) staffError(w http.ResponseWriter, op string, err error) {
	var inv *staff.InvalidError
	switch {
	case errors.As(err, &inv):
		writeError(w, badRequest("invalid_"+inv.Field, "%s", inv.Message))
	case errors.Is(err, staff.ErrExists):
		writeError(w, &Error{Status: http.StatusConflict, Code: "exists",
			Message: err.Error() + " (names are unique among live members; revoke it first)"})
	case errors.Is(err, staff.ErrNotFound):
		writeError(w, &Error{Status: http.StatusNotFound, Code: "not_found", Message: err.Error() + " (or revoked already)"})
	default:
		if err != nil {
			s.cfg.Log.Error(op, "err", err)
		}
		writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
			Message: "staff members and the audit log are unavailable; retry later"})
	}
}

// newStaff is the reply of POST /v1/admin/staff: the member and its token, shown this once
// (the audit log keeps it redacted).
type newStaff struct {
	staff.Member
	Token string `json:"token"`
}

func (s *Server) createStaff(w http.ResponseWriter, r *http.Request, store Staff) {
	var b struct {
		Name string     `json:"name"`
		Role staff.Role `json:"role"`
	}
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	who, e := s.staffOf(r)
	if e != nil {
		writeError(w, e)
		return
	}
	m, token, err := store.Create(r.Context(), b.Name, b.Role, who.ID)
	if err != nil {
		s.staffError(w, "create staff member", err)
		return
	}
	writeJSON(w, http.StatusCreated, newStaff{Member: m, Token: token})
}

func (s *Server) listStaff(w http.ResponseWriter, r *http.Request, store Staff) {
	all, err := store.List(r.Context())
	if err != nil {
		s.staffError(w, "list staff", err)
		return
	}
	if all == nil {
		all = []staff.Member{}
	}
	writeJSON(w, http.StatusOK, map[string][]staff.Member{"staff": all})
}

// revokeStaff revokes a member, the caller itself included, and replies it as revoked.
func (s *Server) revokeStaff(w http.ResponseWriter, r *http.Request, store Staff) {
	who, e := s.staffOf(r)
	if e != nil {
		writeError(w, e)
		return
	}
	id := r.PathValue("id")
	if err := store.Revoke(r.Context(), id, who.ID); err != nil {
		s.staffError(w, "revoke staff member", err)
		return
	}
	m, err := store.Member(r.Context(), id) // revoked: nothing changes it any more
	if err != nil {
		s.staffError(w, "read revoked staff member", err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// auditPage is the reply of GET /v1/admin/audit: newest first, and the before of the next
// page (absent after the last, a page that is not full).
type auditPage struct {
	Entries    []staff.Entry `json:"entries"`
	NextBefore *int64        `json:"next_before,omitempty"`
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request, store Staff) {
	q := r.URL.Query()
	f := staff.AuditFilter{Actor: q.Get("actor"), Limit: staff.DefaultEntries}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			writeError(w, badRequest("invalid_before", "before must be the id that ended the previous page (next_before), a whole number from 1"))
			return
		}
		f.Before = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > staff.MaxEntries {
			writeError(w, badRequest("invalid_limit", "limit must be a whole number, 1-%d", staff.MaxEntries))
			return
		}
		f.Limit = n
	}
	es, err := store.Audit(r.Context(), f)
	if err != nil {
		s.staffError(w, "read the audit log", err)
		return
	}
	if es == nil {
		es = []staff.Entry{}
	}
	writeJSON(w, http.StatusOK, auditPage{Entries: es,
		NextBefore: nextAfter(len(es), f.Limit, func() int64 { return es[len(es)-1].ID })})
}
