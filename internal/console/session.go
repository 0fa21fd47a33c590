package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/credential"
	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/staff"
)

// DefaultSessionTTL is how long a console session lasts from its login.
const DefaultSessionTTL = 8 * time.Hour

// session is a signed-in console user: the staff member it acts as and its CSRF token.
type session struct {
	Member  staff.Member
	CSRF    string
	Started time.Time
	Expires time.Time
}

// liveSession is a row of the sessions page.
type liveSession struct {
	ID      string // the hex of the cookie id's SHA-256: names the session, opens nothing
	Member  staff.Member
	Started time.Time
	Expires time.Time
}

var (
	//go:embed sql/insert_session.sql
	insertSessionSQL string
	//go:embed sql/session_by_id.sql
	sessionByIDSQL string
	//go:embed sql/revoke_session.sql
	revokeSessionSQL string
	//go:embed sql/live_sessions.sql
	liveSessionsSQL string
	//go:embed sql/delete_ended_sessions.sql
	deleteEndedSessionsSQL string
)

// errNoSession is a request without a live session: its cookie is missing, unknown,
// expired or revoked, or its member was revoked.
var errNoSession = errors.New("no live console session")

// random returns n random bytes as base64url.
func random(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// cookieName is the session cookie's: "__Host-" binds it to this host, path / and HTTPS,
// which a loopback console without TLS (Config.InsecureCookies) cannot have.
func (c *Console) cookieName() string {
	if c.cfg.InsecureCookies {
		return "mg_console"
	}
	return "__Host-mg_console"
}

func (c *Console) cookie(name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: maxAge, HttpOnly: true, //nolint:gosec // G124: Secure unless configured for loopback
		Secure: !c.cfg.InsecureCookies, SameSite: http.SameSiteStrictMode}
}

// signIn is the member behind token: a live staff member's token, or the admin token (an
// admin); errNoSession for anything else.
func (c *Console) signIn(ctx context.Context, token string) (staff.Member, error) {
	if c.cfg.AdminToken != "" && ops.Bearer("Bearer "+token, c.cfg.AdminToken) {
		return staff.Member{ID: staff.AdminToken, Name: staff.AdminToken, Role: staff.Admin}, nil
	}
	if !strings.HasPrefix(token, staff.TokenPrefix) {
		return staff.Member{}, errNoSession
	}
	m, err := c.cfg.Staff.Authenticate(ctx, token)
	if errors.Is(err, staff.ErrNotFound) {
		return staff.Member{}, errNoSession
	}
	return m, err
}

// startSession writes a new session of m and sets its cookie on w.
func (c *Console) startSession(ctx context.Context, w http.ResponseWriter, m staff.Member) error {
	// Sessions that ended a day ago are forgotten here: a login is rare, and the table
	// stays the size of a day of logins.
	if _, err := c.cfg.Pool.Exec(ctx, deleteEndedSessionsSQL); err != nil {
		return fmt.Errorf("forget ended sessions: %w", err)
	}
	id := random(32)
	hash := credential.Hash(id)
	expires := c.now().Add(c.cfg.SessionTTL)
	var created time.Time
	if err := c.cfg.Pool.QueryRow(ctx, insertSessionSQL, pgx.StrictNamedArgs{
		"id_hash": hash, "staff_id": m.ID, "role": string(m.Role), "csrf": random(32), "expires_at": expires,
	}).Scan(&created); err != nil {
		return fmt.Errorf("start a console session: %w", err)
	}
	http.SetCookie(w, c.cookie(c.cookieName(), id, int(c.cfg.SessionTTL/time.Second)))
	return nil
}

// session returns r's live session.
func (c *Console) session(r *http.Request) (session, []byte, error) {
	ck, err := r.Cookie(c.cookieName())
	if err != nil || len(ck.Value) != 43 {
		return session{}, nil, errNoSession
	}
	hash := credential.Hash(ck.Value)
	var s session
	var role string
	err = c.cfg.Pool.QueryRow(r.Context(), sessionByIDSQL, pgx.StrictNamedArgs{
		"id_hash": hash, "admin_token": staff.AdminToken,
	}).Scan(&s.Member.ID, &s.Member.Name, &role, &s.CSRF, &s.Started, &s.Expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return session{}, nil, errNoSession
	}
	if err != nil {
		return session{}, nil, fmt.Errorf("read the console session: %w", err)
	}
	s.Member.Role = staff.Role(role)
	return s, hash, nil
}

// endSession revokes the session whose id hash is hash (hex-encoded when from a page);
// false when there is no live one.
func (c *Console) endSession(ctx context.Context, hash []byte) (bool, error) {
	var who string
	err := c.cfg.Pool.QueryRow(ctx, revokeSessionSQL, pgx.StrictNamedArgs{"id_hash": hash}).Scan(&who)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("end a console session: %w", err)
	}
	return true, nil
}

// liveSessions lists the sessions not ended.
func (c *Console) liveSessions(ctx context.Context) ([]liveSession, error) {
	rows, err := c.cfg.Pool.Query(ctx, liveSessionsSQL, pgx.StrictNamedArgs{"admin_token": staff.AdminToken})
	if err != nil {
		return nil, fmt.Errorf("list console sessions: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (liveSession, error) {
		var s liveSession
		var hash []byte
		var role string
		err := r.Scan(&hash, &s.Member.ID, &s.Member.Name, &role, &s.Started, &s.Expires)
		s.ID, s.Member.Role = hex.EncodeToString(hash), staff.Role(role)
		return s, err
	})
}

// validCSRF reports whether a form carries the session's CSRF token.
func validCSRF(s session, r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.CSRF)) == 1
}

// sameOrigin refuses a write a browser says comes from another site: Sec-Fetch-Site
// (sent by every current browser) when present, else Origin against Host. A request
// with neither (curl) relies on the CSRF token and SameSite cookie alone.
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		host, ok := strings.CutPrefix(o, "https://")
		if !ok {
			host, ok = strings.CutPrefix(o, "http://")
		}
		return ok && host == r.Host
	}
	return true
}
