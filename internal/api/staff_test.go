package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/staff"
)

// TestEveryAdminRouteEnforcesItsRole walks every route of the admin API with a token of
// every role: a role the route does not allow gets 403 forbidden_role and changes nothing
// (no audit row); a role it allows gets past the role check (whatever the handler answers
// to a made-up id or body), and each of its writes is an audit row. Unknown and revoked
// staff tokens get 401.
func TestEveryAdminRouteEnforcesItsRole(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{staff: true, invoices: true, webhooks: true, credits: true, customers: true})
	store := staff.NewStore(b.pool)
	tokens := map[staff.Role]string{}
	for _, role := range staff.Roles {
		_, token, err := store.Create(b.ctx, "test "+string(role), role, "test")
		require.NoError(t, err)
		tokens[role] = token
	}
	audited := func() int64 {
		var n int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) from audit_log`).Scan(&n))
		return n
	}
	fill := strings.NewReplacer("{id}", "x1", "{grant}", "gr_x", "{delivery}", "1", "{account}", "x1")
	walked := 0
	for _, route := range api.Routes {
		method, path, ok := strings.Cut(route, " ")
		if !ok || !strings.HasPrefix(path, "/v1/admin/") {
			continue
		}
		walked++
		for _, role := range staff.Roles {
			before := audited()
			r := b.call(t, method, fill.Replace(path), tokens[role], "{}")
			if !role.Allows(route) {
				require.Equal(t, http.StatusForbidden, r.Status, "%s as %s: %s", route, role, r.Raw)
				require.Equal(t, "forbidden_role", errCode(r), "%s as %s", route, role)
				require.Equal(t, before, audited(), "%s as %s: a refused call is not audited", route, role)
				continue
			}
			require.NotEqual(t, "forbidden_role", errCode(r), "%s as %s: %s", route, role, r.Raw)
			require.NotEqual(t, http.StatusUnauthorized, r.Status, "%s as %s: %s", route, role, r.Raw)
			if staff.IsWrite(route) {
				require.Equal(t, before+1, audited(), "%s as %s: every write is an audit row", route, role)
			}
		}
	}
	require.Greater(t, walked, 30, "every admin route")

	r := b.call(t, "GET", "/v1/admin/plans", staff.TokenPrefix+"unknown", nil)
	require.Equal(t, http.StatusUnauthorized, r.Status)
}

// A staff member's write is an audit row naming it, with what the reply says is there
// now, its secrets left out; once revoked, its token is refused.
func TestStaffWritesAreAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{staff: true})
	store := staff.NewStore(b.pool)
	m, token, err := store.Create(b.ctx, "Sam Support", staff.Support, "test")
	require.NoError(t, err)
	r := b.call(t, "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": "acme", "kind": "org", "plan": "pro"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	r = b.call(t, "POST", "/v1/admin/api-keys", token, map[string]any{"account": "acme"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)

	entries, err := store.Entries(b.ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	key := entries[0]
	require.Equal(t, m.ID, key.Actor)
	require.Equal(t, staff.Support, key.Role)
	require.Equal(t, "/v1/admin/api-keys", key.Route)
	require.Equal(t, http.StatusCreated, key.Status)
	require.Contains(t, string(key.After), `"(redacted)"`)
	secret := strings.Split(strings.Split(r.Raw, `"api_key":"`)[1], `"`)[0]
	require.NotContains(t, string(key.After), secret, "the key's secret is not kept")
	require.Equal(t, staff.AdminToken, entries[1].Actor)

	require.NoError(t, store.Revoke(b.ctx, m.ID, "test"))
	r = b.call(t, "GET", "/v1/admin/plans", token, nil)
	require.Equal(t, http.StatusUnauthorized, r.Status, "a revoked token is refused at once")
}

// staffMember is a member as the staff routes reply it; Token only from POST.
type staffMember struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Role      staff.Role `json:"role"`
	CreatedBy string     `json:"created_by"`
	RevokedAt *time.Time `json:"revoked_at"`
	RevokedBy string     `json:"revoked_by"`
	Token     string     `json:"token"`
}

// addStaff adds a member through POST /v1/admin/staff as token, wanting 201.
func (b *testBundle) addStaff(t *testing.T, token, name string, role staff.Role) staffMember {
	t.Helper()
	r := b.call(t, "POST", "/v1/admin/staff", token, map[string]any{"name": name, "role": role})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	var m staffMember
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &m))
	return m
}

// audit reads a page of the audit log through GET /v1/admin/audit (query: "actor=…&…").
func (b *testBundle) audit(t *testing.T, query string) (entries []staff.Entry, next *int64) {
	t.Helper()
	var page struct {
		Entries    []staff.Entry `json:"entries"`
		NextBefore *int64        `json:"next_before"`
	}
	b.getJSON(t, "/v1/admin/audit?"+query, &page)
	return page.Entries, page.NextBefore
}

// The staff routes add members (the token once, made by the caller), list them without
// any token or hash, and revoke them (the caller itself too); the errors are the API's.
func TestStaffRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, staff: true})
	fiona := b.addStaff(t, adminToken, "Fiona Finance", staff.Finance)
	require.Regexp(t, `^st_[0-9a-f]{16}$`, fiona.ID)
	require.Regexp(t, `^mgs_[A-Za-z0-9_-]{43}$`, fiona.Token)
	require.Equal(t, staff.Finance, fiona.Role)
	require.Equal(t, staff.AdminToken, fiona.CreatedBy)
	ada := b.addStaff(t, adminToken, "Ada Admin", staff.Admin)
	sam := b.addStaff(t, ada.Token, "Sam Support", staff.Support)
	require.Equal(t, ada.ID, sam.CreatedBy, "created_by is the caller")

	for _, tt := range []struct {
		name string
		body any
		code string
	}{
		{"no name", map[string]any{"role": "viewer"}, "invalid_name"},
		{"spaces", map[string]any{"name": "   ", "role": "viewer"}, "invalid_name"},
		{"control character", map[string]any{"name": "a\u0007b", "role": "viewer"}, "invalid_name"},
		{"101 characters", map[string]any{"name": strings.Repeat("x", 101), "role": "viewer"}, "invalid_name"},
		{"no role", map[string]any{"name": "Nobody"}, "invalid_role"},
		{"unknown role", map[string]any{"name": "Nobody", "role": "root"}, "invalid_role"},
		{"unknown field", map[string]any{"name": "Nobody", "role": "viewer", "token": "mgs_mine"}, "unknown_field"},
	} {
		r := b.call(t, "POST", "/v1/admin/staff", adminToken, tt.body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", tt.name, r.Raw)
		require.Equal(t, tt.code, errCode(r), tt.name)
	}
	r := b.call(t, "POST", "/v1/admin/staff", ada.Token, map[string]any{"name": "Fiona Finance", "role": "viewer"})
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "exists", errCode(r))
	r = b.call(t, "POST", "/v1/admin/staff", fiona.Token, map[string]any{"name": "Vic Viewer", "role": "viewer"})
	require.Equal(t, http.StatusForbidden, r.Status, r.Raw)
	require.Equal(t, "forbidden_role", errCode(r), "only an admin adds staff")

	// Every role reads the list; it holds no token and no hash.
	r = b.call(t, "GET", "/v1/admin/staff", fiona.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	var list struct {
		Staff []staffMember `json:"staff"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &list))
	require.Len(t, list.Staff, 3)
	for _, secret := range []string{`"token"`, "hash", "mgs_", fiona.Token, ada.Token, sam.Token} {
		require.NotContains(t, r.Raw, secret)
	}

	// A revocation replies the member revoked, by the caller; its token is refused next.
	r = b.call(t, "DELETE", "/v1/admin/staff/"+fiona.ID, ada.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	var revoked staffMember
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &revoked))
	require.Equal(t, fiona.ID, revoked.ID)
	require.NotNil(t, revoked.RevokedAt)
	require.Equal(t, ada.ID, revoked.RevokedBy)
	require.Equal(t, http.StatusUnauthorized, b.call(t, "GET", "/v1/admin/staff", fiona.Token, nil).Status)
	for _, id := range []string{fiona.ID, "st_0000000000000000", "nonsense", "st_%00", "st_%ff%fe"} { // NUL, bad UTF-8: 404, not 503
		r = b.call(t, "DELETE", "/v1/admin/staff/"+id, adminToken, nil)
		require.Equal(t, http.StatusNotFound, r.Status, "%s: %s", id, r.Raw)
		require.Equal(t, "not_found", errCode(r), id)
	}
	b.addStaff(t, adminToken, "Fiona Finance", staff.Viewer) // a revoked member's name is free again

	// A member may revoke itself; its next request is refused.
	r = b.call(t, "DELETE", "/v1/admin/staff/"+ada.ID, ada.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &revoked))
	require.Equal(t, ada.ID, revoked.RevokedBy)
	require.Equal(t, http.StatusUnauthorized, b.call(t, "GET", "/v1/admin/staff", ada.Token, nil).Status)

	r = b.call(t, "GET", "/v1/admin/staff", adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &list))
	require.Len(t, list.Staff, 4, "revoked members are listed")
	require.Equal(t, fiona.ID, list.Staff[0].ID, "oldest first")
	require.NotNil(t, list.Staff[0].RevokedAt)
	require.Nil(t, list.Staff[2].RevokedAt, "Sam is live")
}

// GET /v1/admin/audit pages the log newest first, of one actor or everyone's; the audit
// row of POST /v1/admin/staff keeps the member but not its token.
func TestAuditRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, staff: true})
	ada := b.addStaff(t, adminToken, "Ada Admin", staff.Admin)
	var made []staffMember
	for _, name := range []string{"One", "Two", "Three"} {
		made = append(made, b.addStaff(t, ada.Token, name, staff.Viewer))
	}

	all, next := b.audit(t, "")
	require.Len(t, all, 4)
	require.Nil(t, next, "a page that is not full is the last")
	require.Equal(t, ada.ID, all[0].Actor, "newest first")
	require.Equal(t, staff.AdminToken, all[3].Actor)
	for i, e := range all[:3] {
		require.Equal(t, staff.Admin, e.Role)
		require.Equal(t, "POST", e.Method)
		require.Equal(t, "/v1/admin/staff", e.Route)
		require.Equal(t, http.StatusCreated, e.Status)
		require.Empty(t, e.Before, "a create has no before")
		var after map[string]any
		require.NoError(t, json.Unmarshal(e.After, &after))
		m := made[2-i]
		require.Equal(t, m.ID, after["id"])
		require.Equal(t, "(redacted)", after["token"], "the token is not kept")
		require.NotContains(t, string(e.After), m.Token)
	}

	// Ada's entries, two at a time.
	page, next := b.audit(t, "actor="+ada.ID+"&limit=2")
	require.Len(t, page, 2)
	require.NotNil(t, next)
	require.Equal(t, page[1].ID, *next)
	rest, last := b.audit(t, fmt.Sprintf("actor=%s&limit=2&before=%d", ada.ID, *next))
	require.Len(t, rest, 1)
	require.Nil(t, last)
	require.Equal(t, all[2].ID, rest[0].ID)
	mine, _ := b.audit(t, "actor="+staff.AdminToken)
	require.Len(t, mine, 1)
	nobody, _ := b.audit(t, "actor=st_ffffffffffffffff")
	require.Empty(t, nobody)

	r := b.call(t, "GET", "/v1/admin/audit?limit=2", adminToken, nil)
	require.Contains(t, r.Raw, `"next_before":`)
	r = b.call(t, "GET", "/v1/admin/audit?limit=500", adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.NotContains(t, r.Raw, `"next_before"`, "absent after the last page")
	for _, q := range []string{"limit=0", "limit=501", "limit=x", "before=0", "before=-1", "before=x"} {
		r := b.call(t, "GET", "/v1/admin/audit?"+q, adminToken, nil)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", q, r.Raw)
		require.Equal(t, "invalid_"+strings.Split(q, "=")[0], errCode(r), q)
	}
	viewer := b.addStaff(t, adminToken, "Vic Viewer", staff.Viewer)
	r = b.call(t, "GET", "/v1/admin/audit", viewer.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, "every role reads the log: %s", r.Raw)
}

// An audit row holds the thing before the write (its GET route's reply) and after: a
// limit's change shows the old and the new limit, a void the issued and the void invoice,
// and a create has no before.
func TestAuditBeforeAndAfter(t *testing.T) {
	t.Parallel()
	t.Run("account", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{staff: true})
		sam := b.addStaff(t, adminToken, "Sam Support", staff.Support)
		org := b.id("org")
		b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro", "limits": map[string]any{"requests": map[string]any{"quota": 100}}})
		r := b.call(t, "PUT", "/v1/admin/accounts/"+org, sam.Token,
			map[string]any{"plan": "pro", "limits": map[string]any{"requests": map[string]any{"quota": 200}}})
		require.Equal(t, http.StatusOK, r.Status, r.Raw)

		entries, _ := b.audit(t, "")
		require.Len(t, entries, 3)
		put, create := entries[0], entries[1]
		quota := func(raw json.RawMessage) any {
			var a struct {
				Limits map[string]map[string]any `json:"limits"`
			}
			require.NoError(t, json.Unmarshal(raw, &a), string(raw))
			return a.Limits["requests"]["quota"]
		}
		require.Equal(t, sam.ID, put.Actor)
		require.Equal(t, "/v1/admin/accounts/{id}", put.Route)
		require.Equal(t, "/v1/admin/accounts/"+org, put.Path)
		require.NotEmpty(t, put.Before, "a change has a before")
		require.EqualValues(t, 100, quota(put.Before))
		require.EqualValues(t, 200, quota(put.After))

		require.Equal(t, staff.AdminToken, create.Actor)
		require.Equal(t, "/v1/admin/accounts", create.Route)
		require.Empty(t, create.Before, "a create has no before")
		require.EqualValues(t, 100, quota(create.After))
	})
	t.Run("invoice", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{bare: true, invoices: true, staff: true})
		f := b.invoiceFixture(t)
		fiona := b.addStaff(t, adminToken, "Fiona Finance", staff.Finance)
		path := "/v1/admin/invoices/" + strconv.FormatInt(f.invoices[f.beta].ID, 10) + "/void"
		r := b.call(t, "POST", path, fiona.Token, map[string]any{"reason": "billed in error"})
		require.Equal(t, http.StatusOK, r.Status, r.Raw)

		entries, _ := b.audit(t, "actor="+fiona.ID)
		require.Len(t, entries, 1)
		void := entries[0]
		require.Equal(t, staff.Finance, void.Role)
		require.Equal(t, path, void.Path)
		var before struct {
			ID     int64  `json:"id"`
			Status string `json:"status"`
		}
		require.NoError(t, json.Unmarshal(void.Before, &before), string(void.Before))
		require.Equal(t, f.invoices[f.beta].ID, before.ID)
		require.Equal(t, "issued", before.Status)
		var after struct {
			Invoice struct {
				Status string `json:"status"`
			} `json:"invoice"`
		}
		require.NoError(t, json.Unmarshal(void.After, &after), string(void.After))
		require.Equal(t, "void", after.Invoice.Status)
	})
}
