package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/metergate/metergate/internal/staff"
)

// Staff authenticates staff tokens and keeps the audit log (staff.Store).
type Staff interface {
	Authenticate(ctx context.Context, token string) (staff.Member, error)
	Record(ctx context.Context, e staff.Entry) (staff.Entry, error)
}

// staffOf is who calls the admin API: the admin token (an Admin), or a live staff member;
// a 401 for anything else (a 403 for the service token, which opens the other API).
func (s *Server) staffOf(r *http.Request) (staff.Member, *Error) {
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
// status and, when it succeeded, what the reply says the thing is now (after), secrets
// left out. A write refused (4xx) is recorded too, without an after.
func (s *Server) audited(w http.ResponseWriter, r *http.Request, who staff.Member, h http.HandlerFunc) {
	rec := &recorder{ResponseWriter: w}
	h(rec, r)
	if s.cfg.Staff == nil {
		return
	}
	method, route, _ := strings.Cut(r.Pattern, " ")
	e := staff.Entry{Actor: who.ID, Role: who.Role, Method: method, Route: route, Path: r.URL.Path, Status: rec.status}
	if rec.status < 300 && rec.body.Len() < maxAudited && json.Valid(rec.body.Bytes()) {
		e.After = redact(rec.body.Bytes())
	}
	// The write is done: an audit row that cannot be written is logged loudly, not undone.
	if _, err := s.cfg.Staff.Record(context.WithoutCancel(r.Context()), e); err != nil {
		s.cfg.Log.Error("audit row not written", "actor", who.ID, "route", r.Pattern, "path", r.URL.Path, "err", err)
	}
}

// secretFields are the fields of replies that carry a secret shown once: an API key, a
// webhook's secret, a staff token. The audit log never keeps them.
var secretFields = []string{"key", "api_key", "secret", "token"}

// redact is a JSON reply without its secrets (at any depth).
func redact(raw []byte) json.RawMessage {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil
	}
	var walk func(any)
	walk = func(v any) {
		switch t := v.(type) {
		case map[string]any:
			for k, c := range t {
				for _, f := range secretFields {
					if k == f {
						t[k] = "(redacted)"
					}
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
