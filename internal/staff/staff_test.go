package staff_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/staff"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func TestRolesAllow(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		role    staff.Role
		pattern string
		want    bool
	}{
		{staff.Viewer, "GET /v1/admin/invoices", true},
		{staff.Viewer, "POST /v1/admin/invoices/{id}/void", false},
		{staff.Viewer, "POST /v1/admin/api-keys", false},
		{staff.Support, "POST /v1/admin/api-keys", true},
		{staff.Support, "PUT /v1/admin/accounts/{id}", true},
		{staff.Support, "POST /v1/admin/invoices/{id}/void", false},
		{staff.Support, "POST /v1/admin/customer-tokens", true},
		{staff.Support, "DELETE /v1/admin/customer-tokens/{id}", true},
		{staff.Finance, "POST /v1/admin/customer-tokens", false},
		{staff.Viewer, "DELETE /v1/admin/customer-tokens/{id}", false},
		{staff.Viewer, "GET /v1/admin/customer-tokens", true},
		{staff.Finance, "POST /v1/admin/invoices/{id}/void", true},
		{staff.Finance, "POST /v1/admin/amendments", true},
		{staff.Finance, "POST /v1/admin/accounts/{id}/grants", true},
		{staff.Finance, "POST /v1/admin/api-keys", false},
		{staff.Finance, "POST /v1/admin/plans", false},
		{staff.Admin, "POST /v1/admin/plans", true},
		{staff.Admin, "DELETE /v1/admin/webhooks/{id}", true},
		{staff.Role("root"), "GET /v1/admin/invoices", false},
	} {
		require.Equal(t, tt.want, tt.role.Allows(tt.pattern), "%s %s", tt.role, tt.pattern)
	}
}

func setup(t *testing.T) *staff.Store {
	t.Helper()
	pool, _ := testenv.EmptySchema(t)
	_, err := migrations.Up(testenv.Context(t, time.Minute), pool)
	require.NoError(t, err)
	return staff.NewStore(pool)
}

// A token is shown once, stored as its SHA-256, authenticates its member until revoked,
// and then nothing; names are unique among live members.
func TestStaffTokens(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := testenv.Context(t, time.Minute)
	m, token, err := s.Create(ctx, "Alice Finance", staff.Finance, "admin-token")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(token, staff.TokenPrefix))
	require.Regexp(t, `^st_[0-9a-f]{16}$`, m.ID)

	got, err := s.Authenticate(ctx, token)
	require.NoError(t, err)
	require.Equal(t, m.ID, got.ID)
	require.Equal(t, staff.Finance, got.Role)
	for _, bad := range []string{"", token + "x", strings.TrimPrefix(token, staff.TokenPrefix), staff.TokenPrefix + "nope"} {
		_, err := s.Authenticate(ctx, bad)
		require.ErrorIs(t, err, staff.ErrNotFound, "%q", bad)
	}

	_, _, err = s.Create(ctx, "Alice Finance", staff.Viewer, "admin-token")
	require.ErrorIs(t, err, staff.ErrExists)
	_, _, err = s.Create(ctx, strings.Repeat("é", 100), staff.Viewer, "admin-token")
	require.NoError(t, err, "100 characters, 200 bytes")
	for _, bad := range []struct {
		name  string
		role  staff.Role
		field string
	}{
		{"", staff.Viewer, "name"}, {"  ", staff.Viewer, "name"}, {strings.Repeat("x", 101), staff.Viewer, "name"},
		{"a\nb", staff.Viewer, "name"}, {"Bob", "root", "role"},
	} {
		_, _, err := s.Create(ctx, bad.name, bad.role, "admin-token")
		require.ErrorIs(t, err, staff.ErrInvalid, "%+v", bad)
		var inv *staff.InvalidError
		require.ErrorAs(t, err, &inv, "%+v", bad)
		require.Equal(t, bad.field, inv.Field, "%+v", bad)
	}

	require.NoError(t, s.Revoke(ctx, m.ID, "admin-token"))
	revoked, err := s.Member(ctx, m.ID)
	require.NoError(t, err)
	require.NotNil(t, revoked.RevokedAt)
	require.Equal(t, "admin-token", revoked.RevokedBy)
	_, err = s.Member(ctx, "st_0000000000000000")
	require.ErrorIs(t, err, staff.ErrNotFound)
	_, err = s.Authenticate(ctx, token)
	require.ErrorIs(t, err, staff.ErrNotFound, "a revoked token is refused")
	require.ErrorIs(t, s.Revoke(ctx, m.ID, "admin-token"), staff.ErrNotFound)
	_, _, err = s.Create(ctx, "Alice Finance", staff.Viewer, "admin-token")
	require.NoError(t, err, "a revoked member's name is free again")

	all, err := s.List(ctx)
	require.NoError(t, err)
	require.Len(t, all, 3)
	require.NotNil(t, all[0].RevokedAt)
	require.Equal(t, "admin-token", all[0].RevokedBy)
}

// The audit log keeps every entry, newest first, a page of one actor's or everyone's.
func TestAuditLog(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := testenv.Context(t, time.Minute)
	const fiona = "st_0123456789abcdef"
	for i, path := range []string{"/v1/admin/accounts/acme", "/v1/admin/invoices/1/void", "/v1/admin/plans"} {
		actor := fiona
		if i == 2 {
			actor = staff.AdminToken
		}
		_, err := s.Record(ctx, staff.Entry{Actor: actor, Role: staff.Finance, Method: "POST", Route: path,
			Path: path, Status: 200 + i, Before: json.RawMessage(`{"limits":{}}`), After: json.RawMessage(`{"limits":{"requests":5}}`)})
		require.NoError(t, err)
	}
	got, err := s.Entries(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Equal(t, "/v1/admin/plans", got[0].Path, "newest first")
	require.JSONEq(t, `{"limits":{"requests":5}}`, string(got[2].After))
	older, err := s.Entries(ctx, got[0].ID, 10)
	require.NoError(t, err)
	require.Len(t, older, 2)

	hers, err := s.Audit(ctx, staff.AuditFilter{Actor: fiona})
	require.NoError(t, err)
	require.Len(t, hers, 2)
	for _, e := range hers {
		require.Equal(t, fiona, e.Actor)
	}
	page, err := s.Audit(ctx, staff.AuditFilter{Actor: fiona, Before: hers[0].ID, Limit: 1})
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Equal(t, "/v1/admin/accounts/acme", page[0].Path)
	none, err := s.Audit(ctx, staff.AuditFilter{Actor: "st_ffffffffffffffff"})
	require.NoError(t, err)
	require.Empty(t, none)
}
