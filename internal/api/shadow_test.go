package api_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/pkg/event"
)

// shadowEvents returns the shadow_refusal of each admitted event of org's outbox.
func (b *testBundle) shadowEvents(t *testing.T, org string) []string {
	t.Helper()
	entries, err := b.rdb.XRange(testenv.Context(t, 10*time.Second), b.keys.Outbox(b.keys.Shard(org)), "-", "+").Result()
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		_, v, err := wire.OutboxMessage(e.Values)
		require.NoError(t, err)
		var ce event.CloudEvent
		require.NoError(t, json.Unmarshal(v, &ce))
		if ce.Type != event.TypeAdmitted {
			continue
		}
		var a event.Admitted
		require.NoError(t, json.Unmarshal(ce.Data, &a))
		out = append(out, a.ShadowRefusal)
	}
	return out
}

// An account put in shadow mode through the admin API: past its burst every request is
// 200, with the refusal it would have had in "shadow", the RateLimit fields of the limit,
// a flag on its event and a count by level and unit; out of shadow mode, it is refused.
func TestShadowAccount(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org, team := b.id("org"), b.id("team")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "enterprise"})
	b.account(t, map[string]any{"id": team, "kind": "team", "parent": org, "shadow": true,
		"limits": map[string]any{"requests": map[string]any{"rate_per_s": 0.01, "burst": 2}}})
	got := b.call(t, "GET", "/v1/admin/accounts/"+team, adminToken, nil)
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Equal(t, true, got.Body["shadow"])
	b.waitResolvable(t, team)
	for {
		pol, err := b.cache.Resolve(team)
		require.NoError(t, err)
		if pol.Shadow {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling interval: the write reaches the cache within 1 s
	}

	for i := range 5 {
		r := b.admit(t, map[string]any{"account": team})
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		sh, _ := r.Body["shadow"].(map[string]any)
		if i < 2 {
			require.Nil(t, sh, "within the burst: nothing to report")
			continue
		}
		require.Equal(t, "rate_limited", sh["decision"], r.Raw)
		require.Equal(t, map[string]any{"account": team, "level": "team", "unit": "requests"}, sh["blocked_by"])
		require.Positive(t, sh["retry_after_ms"])
		require.Contains(t, r.Header.Get("RateLimit"), ";r=0;", "the limit's fields say it is spent")
	}
	require.Equal(t, []string{"", "", "rate_limited", "rate_limited", "rate_limited"}, b.shadowEvents(t, org))
	require.EqualValues(t, 3, b.metric(t, "metergate_admit_shadow_refusals_total",
		map[string]string{"result": "rate_limited", "level": "team", "unit": "requests"}))

	r := b.call(t, "PUT", "/v1/admin/accounts/"+team, adminToken, map[string]any{"parent": org,
		"limits": map[string]any{"requests": map[string]any{"rate_per_s": 0.01, "burst": 2}}})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	for {
		pol, err := b.cache.Resolve(team)
		require.NoError(t, err)
		if !pol.Shadow {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
	r = b.admit(t, map[string]any{"account": team})
	require.Equal(t, http.StatusTooManyRequests, r.Status, "out of shadow mode, enforced: %s", r.Raw)
}

// ADMIT_SHADOW puts every account in shadow mode: a spent quota is a 200 saying
// quota_exceeded.
func TestShadowEverywhere(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{shadow: true})
	org := b.id("org")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "enterprise",
		"limits": map[string]any{"requests": map[string]any{"quota": 1}}})
	b.waitResolvable(t, org)
	require.Equal(t, http.StatusOK, b.admit(t, map[string]any{"account": org}).Status)
	r := b.admit(t, map[string]any{"account": org})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Equal(t, "quota_exceeded", r.Body["shadow"].(map[string]any)["decision"], r.Raw)
	require.Equal(t, []string{"", "quota_exceeded"}, b.shadowEvents(t, org))
}
