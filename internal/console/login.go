package console

import (
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"

	"github.com/metergate/metergate/internal/staff"
)

// loginCookie holds the login form's CSRF token (a double submit: the form's hidden field
// must match it), as there is no session yet to hold one.
const loginCookie = "mg_console_login"

// loginForm is the sign-in page's data.
type loginForm struct{ Token, Next, Error string }

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	token := random(32)
	http.SetCookie(w, c.cookie(loginCookie, token, 3600))
	v := &view{c: c, Title: "Sign in"}
	c.render(w, r, v, http.StatusOK, "login", loginForm{Token: token, Next: safeNext(r.URL.Query().Get("next"))})
}

// safeNext is where to go after signing in: a console page, never another site.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/console/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/console/"
	}
	return next
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	ck, err := r.Cookie(loginCookie)
	form := r.PostFormValue("csrf")
	if err != nil || form == "" || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(form)) != 1 || !sameOrigin(r) {
		c.fail(w, r, nil, http.StatusForbidden, "This sign-in form has expired. Reload the page and try again.")
		return
	}
	m, err := c.signIn(r.Context(), strings.TrimSpace(r.PostFormValue("token")))
	if errors.Is(err, errNoSession) {
		v := &view{c: c, Title: "Sign in"}
		token := random(32)
		http.SetCookie(w, c.cookie(loginCookie, token, 3600))
		c.render(w, r, v, http.StatusUnauthorized, "login", loginForm{Token: token, Next: safeNext(r.PostFormValue("next")),
			Error: "That token is not a live staff or admin token."})
		return
	}
	if err == nil {
		err = c.startSession(r.Context(), w, m)
	}
	if err != nil {
		c.unavailable(w, r, nil, err)
		return
	}
	c.audit(r, m, http.StatusSeeOther)
	http.SetCookie(w, c.cookie(loginCookie, "", -1))
	seeOther(w, r, safeNext(r.PostFormValue("next")))
}

// logout ends the session (its CSRF token checked when it is still live).
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	s, hash, err := c.session(r)
	if err == nil && sameOrigin(r) && validCSRF(s, r) {
		if _, err := c.endSession(r.Context(), hash); err != nil {
			c.unavailable(w, r, nil, err)
			return
		}
		c.audit(r, s.Member, http.StatusSeeOther)
	}
	http.SetCookie(w, c.cookie(c.cookieName(), "", -1))
	seeOther(w, r, "/console/login")
}

// audit records a write of the console itself (signing in and out, ending a session) in
// the admin API's audit log; a row that cannot be written is logged, not undone.
func (c *Console) audit(r *http.Request, who staff.Member, status int) {
	method, route, _ := strings.Cut(r.Pattern, " ")
	if _, err := c.cfg.Staff.Record(r.Context(), staff.Entry{Actor: who.ID, Role: who.Role, Method: method,
		Route: route, Path: r.URL.Path, Status: status}); err != nil {
		c.cfg.Log.Error("audit row not written", "actor", who.ID, "path", r.URL.Path, "err", err)
	}
}

// sessionPages are the pages of staff and sessions (an admin's).
func (c *Console) sessionPages() map[string]page {
	return map[string]page{
		"GET /console/staff":                 c.staffPage,
		"POST /console/staff":                c.createStaff,
		"POST /console/staff/{id}/revoke":    c.revokeStaff,
		"GET /console/sessions":              c.sessionsPage,
		"POST /console/sessions/{id}/revoke": c.revokeSession,
	}
}

func (c *Console) staffPage(w http.ResponseWriter, r *http.Request, v *view) {
	c.staffView(w, r, v, http.StatusOK, nil)
}

// createdStaff is a member just created, with its token: shown once.
type createdStaff struct {
	staff.Member
	Token string `json:"token"`
}

func (c *Console) createStaff(w http.ResponseWriter, r *http.Request, v *view) {
	var m createdStaff
	body := map[string]string{"name": r.PostFormValue("name"), "role": r.PostFormValue("role")}
	if err := v.call(r.Context(), http.MethodPost, "/v1/admin/staff", body, &m); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	c.staffView(w, r, v, http.StatusCreated, &m)
}

// staffView renders the staff page, with the member just created (its token) if any.
func (c *Console) staffView(w http.ResponseWriter, r *http.Request, v *view, status int, created *createdStaff) {
	var list struct {
		Staff []staff.Member `json:"staff"`
	}
	if err := v.call(r.Context(), http.MethodGet, "/v1/admin/staff", nil, &list); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	v.Title, v.Nav = "Staff", "staff"
	c.render(w, r, v, status, "staff", struct {
		Staff   []staff.Member
		Roles   []staff.Role
		Created *createdStaff
	}{list.Staff, staff.Roles, created})
}

func (c *Console) revokeStaff(w http.ResponseWriter, r *http.Request, v *view) {
	if err := v.call(r.Context(), http.MethodDelete, "/v1/admin/staff/"+r.PathValue("id"), nil, nil); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/console/staff")
}

func (c *Console) sessionsPage(w http.ResponseWriter, r *http.Request, v *view) {
	if !v.Can("POST /console/sessions/{id}/revoke") {
		c.fail(w, r, v, http.StatusForbidden, "Only an admin sees the sessions.")
		return
	}
	list, err := c.liveSessions(r.Context())
	if err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	v.Title, v.Nav = "Sessions", "staff"
	c.render(w, r, v, http.StatusOK, "sessions", struct {
		Sessions []liveSession
		Mine     string
	}{list, hex.EncodeToString(v.hash)})
}

func (c *Console) revokeSession(w http.ResponseWriter, r *http.Request, v *view) {
	hash, err := hex.DecodeString(r.PathValue("id"))
	if err != nil || len(hash) != 32 {
		c.fail(w, r, v, http.StatusNotFound, "There is no such session.")
		return
	}
	ended, err := c.endSession(r.Context(), hash)
	if err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	if !ended {
		c.fail(w, r, v, http.StatusNotFound, "There is no such live session.")
		return
	}
	c.audit(r, v.Me(), http.StatusSeeOther)
	seeOther(w, r, "/console/sessions")
}
