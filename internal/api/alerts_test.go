package api_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/pkg/event"
)

// Alert rules through the admin API: added (201), read, listed, changed, refused twice for
// one owner, kind, unit and period (409), removed (204). A rule reaches admit within a
// second, and the request that crosses a threshold through POST /v1/admit fires it, once.
func TestAlertAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org, plan := b.id("org"), b.id("plan")
	r := b.call(t, "POST", "/v1/admin/plans", adminToken, map[string]any{"id": plan, "rank": planRank(),
		"limits": map[string]any{"tokens": map[string]any{"quota": 1000, "quota_period": "month"}}})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": plan})
	key := b.apiKey(t, org)

	r = b.call(t, "POST", "/v1/admin/alerts", adminToken, map[string]any{"plan": plan, "kind": "quota_percent", "unit": "tokens",
		"thresholds": []int{90, 50}})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	byPlan := r.Body["id"].(string)
	require.Equal(t, []any{50.0, 90.0}, r.Body["thresholds"])
	require.Equal(t, "month", r.Body["period"])
	r = b.call(t, "POST", "/v1/admin/alerts", adminToken, map[string]any{"account": org, "kind": "quota_percent", "unit": "tokens",
		"thresholds": []int{10}})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	own := r.Body["id"].(string)
	r = b.call(t, "POST", "/v1/admin/alerts", adminToken, map[string]any{"account": org, "kind": "quota_percent", "unit": "tokens",
		"thresholds": []int{20}})
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "alert_exists", errCode(r))

	got := b.call(t, "GET", "/v1/admin/alerts/"+own, adminToken, nil)
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Equal(t, org, got.Body["account"])
	list := b.call(t, "GET", "/v1/admin/alerts?plan="+plan, adminToken, nil)
	require.Equal(t, http.StatusOK, list.Status, list.Raw)
	require.Len(t, list.Body["alerts"], 1)
	require.Equal(t, byPlan, list.Body["alerts"].([]any)[0].(map[string]any)["id"])

	// The account's own rule replaces the plan's; changed to 30 and 60 %.
	r = b.call(t, "PUT", "/v1/admin/alerts/"+own, adminToken, map[string]any{"kind": "quota_percent", "unit": "tokens",
		"thresholds": []int{60, 30}})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Equal(t, []any{30.0, 60.0}, r.Body["thresholds"])
	written := time.Now()
	for {
		pol, err := b.cache.Resolve(org)
		require.NoError(t, err)
		if al := pol.Path[0].Alerts; len(al) == 1 && len(al[0].Thresholds) == 2 && al[0].Thresholds[0] == 30 {
			break
		}
		require.Less(t, time.Since(written), time.Second, "a rule reaches the cache within 1 s")
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}

	acc := b.call(t, "GET", "/v1/admin/accounts/"+org, adminToken, nil)
	require.Equal(t, http.StatusOK, acc.Status, acc.Raw)
	level := acc.Body["effective"].(map[string]any)["path"].([]any)[0].(map[string]any)
	require.Equal(t, []any{map[string]any{"kind": "quota_percent", "unit": "tokens", "period": "month", "thresholds": []any{30.0, 60.0}}},
		level["alerts"], "the effective policy shows the rules that apply")

	// 7 requests of 100 tokens: the 3rd crosses 30 %, the 6th 60 %.
	var ids []string
	for range 7 {
		r := b.admit(t, map[string]any{"api_key": key, "units": map[string]any{"tokens": 100}})
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		ids = append(ids, r.Body["event_id"].(string))
	}
	keys := b.keys
	entries, err := b.rdb.XRange(testenv.Context(t, 10*time.Second), keys.Outbox(keys.Shard(org)), "-", "+").Result()
	require.NoError(t, err)
	var fired []event.Threshold
	for _, m := range outboxMessages(t, entries) {
		var ce event.CloudEvent
		require.NoError(t, json.Unmarshal(m.Value, &ce))
		if ce.Type != event.TypeThreshold {
			continue
		}
		var d event.Threshold
		require.NoError(t, json.Unmarshal(ce.Data, &d))
		fired = append(fired, d)
	}
	require.Len(t, fired, 2)
	require.Equal(t, []int64{30, 60}, []int64{fired[0].Threshold, fired[1].Threshold})
	require.Equal(t, []string{ids[2], ids[5]}, []string{fired[0].EventID, fired[1].EventID})
	require.Equal(t, []int64{300, 600}, []int64{fired[0].Value, fired[1].Value})

	require.Equal(t, http.StatusNoContent, b.call(t, "DELETE", "/v1/admin/alerts/"+own, adminToken, nil).Status)
	require.Equal(t, http.StatusNotFound, b.call(t, "DELETE", "/v1/admin/alerts/"+own, adminToken, nil).Status)
	require.Equal(t, http.StatusNotFound, b.call(t, "GET", "/v1/admin/alerts/"+own, adminToken, nil).Status)
	require.Equal(t, http.StatusNotFound, b.call(t, "PUT", "/v1/admin/alerts/al_0123", adminToken,
		map[string]any{"kind": "quota_percent", "unit": "tokens", "thresholds": []int{1}}).Status)
}

// Bad rules are 400 with a code naming the field, and write nothing.
func TestAlertAPIRefusesBadRules(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org := b.id("org")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	ok := func(m map[string]any) map[string]any {
		out := map[string]any{"account": org, "kind": "balance_below", "unit": "credits", "thresholds": []int{500}}
		for k, v := range m {
			if v == nil {
				delete(out, k)
			} else {
				out[k] = v
			}
		}
		return out
	}
	for _, c := range []struct {
		body any
		code string
	}{
		{ok(map[string]any{"account": nil}), "invalid_owner"},
		{ok(map[string]any{"plan": "pro"}), "invalid_owner"},
		{ok(map[string]any{"account": b.id("nobody")}), "invalid_owner"},
		{ok(map[string]any{"kind": "spend"}), "invalid_kind"},
		{ok(map[string]any{"unit": "dollars"}), "invalid_unit"},
		{ok(map[string]any{"period": "day"}), "invalid_period"},
		{ok(map[string]any{"thresholds": []any{}}), "invalid_thresholds"},
		{ok(map[string]any{"thresholds": []any{0}}), "invalid_thresholds"},
		{ok(map[string]any{"thresholds": []any{1.5}}), "invalid_thresholds"},
		{ok(map[string]any{"thresholds": []any{"5"}}), "invalid_thresholds"},
		{ok(map[string]any{"kind": "balance_percent", "thresholds": []any{101}}), "invalid_thresholds"},
		{ok(map[string]any{"colour": "red"}), "unknown_field"},
		{`{"account":`, "invalid_json"},
	} {
		r := b.call(t, "POST", "/v1/admin/alerts", adminToken, c.body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%v: %s", c.body, r.Raw)
		require.Equal(t, c.code, errCode(r), "%v: %s", c.body, r.Raw)
	}
	list := b.call(t, "GET", "/v1/admin/alerts?account="+org, adminToken, nil)
	require.Equal(t, http.StatusOK, list.Status, list.Raw)
	require.Empty(t, list.Body["alerts"])
	require.Equal(t, http.StatusBadRequest, b.call(t, "GET", "/v1/admin/alerts?account=bad%20id", adminToken, nil).Status)
	require.Equal(t, http.StatusUnauthorized, b.call(t, "GET", "/v1/admin/alerts", "", nil).Status)
	require.Equal(t, http.StatusForbidden, b.call(t, "GET", "/v1/admin/alerts", serviceToken, nil).Status)
}

// outboxMessages are the Kafka messages of outbox entries, in order (an entry may hold the
// events of one script call).
func outboxMessages(t *testing.T, entries []redis.XMessage) []wire.Message {
	t.Helper()
	var out []wire.Message
	for _, e := range entries {
		for _, m := range wire.OutboxMessages(e.Values) {
			require.NoError(t, m.Err)
			out = append(out, m)
		}
	}
	return out
}
