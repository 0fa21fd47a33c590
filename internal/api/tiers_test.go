package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A ceiling on a limit and a priority on an account go through the admin API and back, in
// the account and in its effective policy (the parent's reservation included); a PUT
// that leaves them out removes them.
func TestCeilingAndPriorityRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org, team := b.id("org"), b.id("team")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	guarantee := map[string]any{"rate_per_s": 10, "burst": 100, "ceiling": 300}
	r := b.call(t, "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": team, "kind": "team", "parent": org,
		"priority": 70, "limits": map[string]any{"tokens": guarantee}})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	stored := map[string]any{"algorithm": "token_bucket", "rate_per_s": 10.0, "burst": 100.0, "ceiling": 300.0}
	require.Equal(t, 70.0, r.Body["priority"])
	require.Equal(t, map[string]any{"tokens": stored}, r.Body["limits"])
	eff := effective(t, r)
	require.Equal(t, 70.0, eff["priority"])
	path := eff["path"].([]any)
	require.Len(t, path, 2)
	require.Equal(t, stored, path[1].(map[string]any)["limits"].(map[string]any)["tokens"])
	require.Equal(t, map[string]any{"tokens": map[string]any{"rate_per_s": 10.0, "burst": 100.0}}, path[0].(map[string]any)["reserved"],
		"the team's guarantee is reserved at the org")

	g := b.call(t, "GET", "/v1/admin/accounts/"+team, adminToken, nil)
	require.Equal(t, http.StatusOK, g.Status, g.Raw)
	require.Equal(t, 70.0, g.Body["priority"])
	require.Equal(t, map[string]any{"tokens": stored}, g.Body["limits"])

	r = b.call(t, "PUT", "/v1/admin/accounts/"+team, adminToken, map[string]any{"limits": map[string]any{"tokens": map[string]any{"rate_per_s": 10, "burst": 100}}})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.NotContains(t, r.Body, "priority")
	require.NotContains(t, r.Body["limits"].(map[string]any)["tokens"], "ceiling")
	eff = effective(t, r)
	require.Equal(t, 0.0, eff["priority"], "pro's priority, the seeds' 0")
	require.NotContains(t, eff["path"].([]any)[0], "reserved", "no guarantee left")

	r = b.call(t, "PUT", "/v1/admin/accounts/"+org, adminToken, map[string]any{"plan": "pro", "priority": 0})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Equal(t, 0.0, r.Body["priority"], "0 is a priority, shown")
}

// Bad ceilings and priorities are 400 with the codes of the store's fields; nothing is
// written.
func TestCeilingAndPriorityInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org, team := b.id("org"), b.id("team")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	b.account(t, map[string]any{"id": team, "kind": "team", "parent": org, "priority": 10})
	limits := func(l map[string]any) map[string]any { return map[string]any{"tokens": l} }
	newTeam := b.id("new")
	for _, tt := range []struct {
		name   string
		method string
		path   string
		body   any
		code   string
	}{
		{"ceiling below the burst", "POST", "/v1/admin/accounts", map[string]any{"id": newTeam, "kind": "team", "parent": org,
			"limits": limits(map[string]any{"rate_per_s": 10, "burst": 100, "ceiling": 99})}, "invalid_limits"},
		{"ceiling without a bucket", "POST", "/v1/admin/accounts", map[string]any{"id": newTeam, "kind": "team", "parent": org,
			"limits": limits(map[string]any{"quota": 1000, "ceiling": 99})}, "invalid_limits"},
		{"ceiling on a sliding window", "PUT", "/v1/admin/accounts/" + team, map[string]any{
			"limits": limits(map[string]any{"algorithm": "sliding_window", "limit": 10, "window_s": 60, "ceiling": 20})}, "invalid_limits"},
		{"negative ceiling", "PUT", "/v1/admin/accounts/" + team, map[string]any{
			"limits": limits(map[string]any{"rate_per_s": 10, "burst": 100, "ceiling": -1})}, "invalid_limits"},
		{"ceiling on a new org", "POST", "/v1/admin/accounts", map[string]any{"id": b.id("neworg"), "kind": "org",
			"limits": limits(map[string]any{"rate_per_s": 10, "burst": 100, "ceiling": 200})}, "invalid_limits"},
		{"ceiling on an org", "PUT", "/v1/admin/accounts/" + org, map[string]any{"plan": "pro",
			"limits": limits(map[string]any{"rate_per_s": 10, "burst": 100, "ceiling": 200})}, "invalid_limits"},
		{"priority above 100", "POST", "/v1/admin/accounts", map[string]any{"id": newTeam, "kind": "team", "parent": org, "priority": 101}, "invalid_priority"},
		{"negative priority", "PUT", "/v1/admin/accounts/" + team, map[string]any{"priority": -1}, "invalid_priority"},
		{"fractional priority", "PUT", "/v1/admin/accounts/" + team, `{"priority":50.5}`, "invalid_field"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := b.call(t, tt.method, tt.path, adminToken, tt.body)
			require.Equal(t, http.StatusBadRequest, r.Status, r.Raw)
			require.Equal(t, tt.code, r.Body["error"].(map[string]any)["code"], r.Raw)
		})
	}
	require.Equal(t, http.StatusNotFound, b.call(t, "GET", "/v1/admin/accounts/"+newTeam, adminToken, nil).Status, "nothing was written")
	g := b.call(t, "GET", "/v1/admin/accounts/"+team, adminToken, nil)
	require.Equal(t, 10.0, g.Body["priority"], "the team is as it was")
	require.NotContains(t, g.Body, "limits")
}
