package api_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/webhook"
)

// addOrg makes an org account of id (an endpoint's account filter names an existing account).
func (b *testBundle) addOrg(t *testing.T, id string) string {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, org) VALUES ($1, 'org', $1) ON CONFLICT DO NOTHING`, id)
	require.NoError(t, err)
	return id
}

// alert inserts a usage_alerts row under path at eventTime, as the meter does.
func (b *testBundle) alert(t *testing.T, name string, path []string, eventTime time.Time) string {
	t.Helper()
	id := "alert/" + b.id(name)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO usage_alerts (id, event_time, org, account, path, unit, kind, threshold,
		at_units, value, period, triggered_by, admitted, payload)
		VALUES ($1, $2, $3, $4, $5, 'requests', 'quota_percent', 80, 800, 800, '2026-11', 'ev-1', true, $6)
		ON CONFLICT DO NOTHING`, id, eventTime, path[0], path[len(path)-1], path,
		fmt.Sprintf(`{"id":%q,"type":"io.metergate.usage.threshold.v1"}`, id))
	require.NoError(t, err)
	return id
}

// The endpoint's life through the admin API: created with its secret (shown only then),
// read, listed, changed, disabled and enabled again, rotated, deleted; bad input is a 400
// with its code and an unknown id a 404.
func TestWebhookEndpointAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, webhooks: true})
	org := b.addOrg(t, b.id("org"))
	r := b.call(t, "POST", "/v1/admin/webhooks", adminToken, map[string]any{
		"url": "https://hooks.example.com/metergate", "event_types": []string{"usage.threshold.v1"}, "account": org})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	id, _ := r.Body["id"].(string)
	require.Regexp(t, `^wh_[0-9a-f]{32}$`, id)
	secret, _ := r.Body["secret"].(string)
	require.True(t, strings.HasPrefix(secret, webhook.SecretPrefix), r.Raw)
	require.Equal(t, org, r.Body["account"])
	require.Equal(t, true, r.Body["enabled"])

	r = b.call(t, "GET", "/v1/admin/webhooks/"+id, adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.NotContains(t, r.Body, "secret")
	r = b.call(t, "GET", "/v1/admin/webhooks", adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Contains(t, r.Raw, id)
	require.NotContains(t, r.Raw, secret)

	r = b.call(t, "PUT", "/v1/admin/webhooks/"+id, adminToken, map[string]any{
		"url": "https://hooks.example.com/v2", "event_types": []string{"usage.threshold.v1"}, "enabled": false})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Equal(t, "https://hooks.example.com/v2", r.Body["url"])
	require.NotContains(t, r.Body, "account", "left out: no filter")
	require.Equal(t, false, r.Body["enabled"])
	require.Equal(t, "disabled through the admin API", r.Body["disabled_reason"])
	_, err := b.pool.Exec(b.ctx, `UPDATE webhook_endpoints SET consecutive_failures = 7 WHERE id = $1`, id)
	require.NoError(t, err)
	r = b.call(t, "PUT", "/v1/admin/webhooks/"+id, adminToken, map[string]any{
		"url": "https://hooks.example.com/v2", "event_types": []string{"usage.threshold.v1"}, "account": org, "enabled": true})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Equal(t, true, r.Body["enabled"])
	require.NotContains(t, r.Body, "disabled_reason")
	require.InDelta(t, 0, r.Body["consecutive_failures"], 0, "enabling resets the run of failures")

	r = b.call(t, "POST", "/v1/admin/webhooks/"+id+"/rotate", adminToken, map[string]any{"overlap_s": 60})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	rotated, _ := r.Body["secret"].(string)
	require.True(t, strings.HasPrefix(rotated, webhook.SecretPrefix))
	require.NotEqual(t, secret, rotated)
	var valid []string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT array_agg(secret ORDER BY id) FROM webhook_secrets
		WHERE endpoint = $1 AND (expires_at IS NULL OR expires_at > now())`, id).Scan(&valid))
	require.Equal(t, []string{secret, rotated}, valid, "the old secret signs during the overlap")
	r = b.call(t, "POST", "/v1/admin/webhooks/"+id+"/rotate", adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "the body is optional: %s", r.Raw)

	bad := []struct {
		method, path string
		body         any
		code         string
	}{
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "ftp://hooks.example.com/", "event_types": []string{"usage.threshold.v1"}}, "invalid_url"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "https://hooks.example.com/", "event_types": []string{}}, "invalid_event_types"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "https://hooks.example.com/", "event_types": []string{"usage.admitted.v1"}}, "invalid_event_types"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "https://hooks.example.com/", "event_types": []string{"usage.threshold.v1"}, "account": "no spaces"}, "invalid_account"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "https://hooks.example.com/" + strings.Repeat("a", 2048), "event_types": []string{"usage.threshold.v1"}}, "invalid_url"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "https://hooks.example.com/", "event_types": []string{"usage.threshold.v1"}, "secret": "mine"}, "unknown_field"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "http://127.0.0.1:8080/", "event_types": []string{"usage.threshold.v1"}}, "forbidden_target"},
		{"PUT", "/v1/admin/webhooks/" + id, map[string]any{"url": "http://127.0.0.1:8080/", "event_types": []string{"usage.threshold.v1"}}, "forbidden_target"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "http://[::1]:8080/", "event_types": []string{"usage.threshold.v1"}}, "forbidden_target"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "http://10.1.2.3/", "event_types": []string{"usage.threshold.v1"}}, "forbidden_target"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "http://100.100.100.200/latest", "event_types": []string{"usage.threshold.v1"}}, "forbidden_target"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "http://[64:ff9b::a9fe:a9fe]/latest", "event_types": []string{"usage.threshold.v1"}}, "forbidden_target"},
		{"PUT", "/v1/admin/webhooks/" + id, map[string]any{"url": "https://[2002:a9fe:a9fe::1]/", "event_types": []string{"usage.threshold.v1"}}, "forbidden_target"},
		{"POST", "/v1/admin/webhooks", map[string]any{"url": "https://hooks.example.com/", "event_types": []string{"usage.threshold.v1"}, "account": b.id("nobody")}, "unknown_account"},
		{"PUT", "/v1/admin/webhooks/" + id, map[string]any{"url": "https://hooks.example.com/", "event_types": []string{"usage.threshold.v1"}, "account": b.id("nobody")}, "unknown_account"},
		{"POST", "/v1/admin/webhooks", `{"url":"https://hooks.example.com/","event_types":["usage.threshold.v1"],"url":"http://10.1.2.3/"}`, "duplicate_key"},
		{"POST", "/v1/admin/webhooks/" + id + "/rotate", map[string]any{"overlap_s": -1}, "invalid_overlap"},
		{"POST", "/v1/admin/webhooks/" + id + "/rotate", map[string]any{"overlap_s": 1.5}, "invalid_field"},
		{"GET", "/v1/admin/webhooks/" + id + "/deliveries?status=lost", nil, "invalid_status"},
		{"GET", "/v1/admin/webhooks/" + id + "/deliveries?limit=0", nil, "invalid_limit"},
		{"GET", "/v1/admin/webhooks/" + id + "/deliveries/abc", nil, "invalid_delivery"},
		{"POST", "/v1/admin/webhooks/" + id + "/deliveries/abc/replay", nil, "invalid_delivery"},
		{"POST", "/v1/admin/webhooks/" + id + "/replay", map[string]any{"from": "yesterday", "to": "2026-12-01T00:00:00Z"}, "invalid_from"},
		{"POST", "/v1/admin/webhooks/" + id + "/replay", map[string]any{"from": "2026-12-01T00:00:00Z", "to": "2026-11-01T00:00:00Z"}, "invalid_range"},
	}
	for _, c := range bad {
		r := b.call(t, c.method, c.path, adminToken, c.body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s %s: %s", c.method, c.path, r.Raw)
		require.Equal(t, c.code, r.Body["error"].(map[string]any)["code"], "%s %s: %s", c.method, c.path, r.Raw)
	}

	unknown := "wh_00000000000000000000000000000000"
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/v1/admin/webhooks/" + unknown, nil},
		{"PUT", "/v1/admin/webhooks/" + unknown, map[string]any{"url": "https://hooks.example.com/", "event_types": []string{"usage.threshold.v1"}}},
		{"DELETE", "/v1/admin/webhooks/" + unknown, nil},
		{"POST", "/v1/admin/webhooks/" + unknown + "/rotate", nil},
		{"GET", "/v1/admin/webhooks/" + unknown + "/deliveries", nil},
		{"GET", "/v1/admin/webhooks/" + id + "/deliveries/999999999", nil},
		{"POST", "/v1/admin/webhooks/" + id + "/deliveries/999999999/replay", nil},
		{"POST", "/v1/admin/webhooks/" + unknown + "/replay", map[string]any{"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}},
		// Ids no endpoint can have (a NUL, invalid UTF-8) name none: never a 5xx.
		{"GET", "/v1/admin/webhooks/a%00b", nil},
		{"GET", "/v1/admin/webhooks/%c3%28/deliveries", nil},
		{"DELETE", "/v1/admin/webhooks/wh_x", nil},
		{"POST", "/v1/admin/webhooks/%ff/deliveries/1/replay", nil},
	} {
		r := b.call(t, c.method, c.path, adminToken, c.body)
		require.Equal(t, http.StatusNotFound, r.Status, "%s %s: %s", c.method, c.path, r.Raw)
	}
	require.Equal(t, http.StatusUnauthorized, b.call(t, "GET", "/v1/admin/webhooks", "", nil).Status)
	require.Equal(t, http.StatusForbidden, b.call(t, "GET", "/v1/admin/webhooks", serviceToken, nil).Status)

	r = b.call(t, "DELETE", "/v1/admin/webhooks/"+id, adminToken, nil)
	require.Equal(t, http.StatusNoContent, r.Status, r.Raw)
	require.Equal(t, http.StatusNotFound, b.call(t, "GET", "/v1/admin/webhooks/"+id, adminToken, nil).Status)
}

// Private targets are taken when the deployment allows them (WEBHOOK_ALLOW_PRIVATE), and a
// server without a webhook store answers 503.
func TestWebhookAPIPrivateAllowedAndUnconfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, webhooks: true, allowPrivate: true})
	r := b.call(t, "POST", "/v1/admin/webhooks", adminToken, map[string]any{"url": "http://127.0.0.1:9/h",
		"event_types": []string{"usage.threshold.v1"}, "account": b.addOrg(t, b.id("org")), "enabled": false}) // no other test's alert reaches it
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)

	none := setup(t, setupOpts{bare: true})
	r = none.call(t, "GET", "/v1/admin/webhooks", adminToken, nil)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, r.Raw)
	require.Equal(t, "unavailable", r.Body["error"].(map[string]any)["code"])
}

// The delivery log and replay through the admin API, with a deliverer POSTing to a real
// receiver that verifies every signature: a delivery shows its attempts (status, latency);
// a replayed delivery arrives again with the same webhook-id; a replayed range queues the
// matching alerts of that time, those from before the endpoint included.
func TestWebhookDeliveryLogAndReplayAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, webhooks: true})
	var mu sync.Mutex
	var secret string
	got := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if webhook.Verify(secret, body, r.Header) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		got[r.Header.Get(webhook.HeaderID)]++
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	received := func(id string) int { mu.Lock(); defer mu.Unlock(); return got[id] }

	org := b.addOrg(t, b.id("org"))
	t0 := time.Now().UTC().Truncate(time.Second)
	early := b.alert(t, "early", []string{org, "team"}, t0.Add(-time.Hour)) // before the endpoint
	// A name, not a literal address: the store takes it, the deliverer is allowed to dial it.
	r := b.call(t, "POST", "/v1/admin/webhooks", adminToken, map[string]any{
		"url": strings.Replace(srv.URL, "127.0.0.1", "localhost", 1), "event_types": []string{"usage.threshold.v1"}, "account": org})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	id := r.Body["id"].(string)
	mu.Lock()
	secret = r.Body["secret"].(string)
	mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- webhook.NewDeliverer(b.pool, webhook.DelivererOptions{AllowPrivate: true, Poll: 10 * time.Millisecond}).Run(ctx)
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	alert := b.alert(t, "now", []string{org}, t0)
	poll := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-b.ctx.Done():
				t.Fatalf("never: %s", what)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	var delivery map[string]any
	poll("the alert delivered", func() bool {
		r := b.call(t, "GET", "/v1/admin/webhooks/"+id+"/deliveries?status=delivered&limit=10", adminToken, nil)
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		ds := r.Body["deliveries"].([]any)
		if len(ds) == 1 {
			delivery = ds[0].(map[string]any)
		}
		return len(ds) == 1
	})
	require.Equal(t, alert, delivery["alert"])
	did := fmt.Sprint(int64(delivery["id"].(float64)))

	r = b.call(t, "POST", "/v1/admin/webhooks/"+id+"/deliveries/"+did+"/replay", adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Equal(t, "pending", r.Body["status"])
	poll("the replay received", func() bool { return received(alert) == 2 })
	poll("the replay logged", func() bool {
		r = b.call(t, "GET", "/v1/admin/webhooks/"+id+"/deliveries/"+did, adminToken, nil)
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		return r.Body["status"] == "delivered" && len(r.Body["log"].([]any)) == 2
	})
	for _, a := range r.Body["log"].([]any) {
		at := a.(map[string]any)
		require.InDelta(t, 200, at["status"], 0)
		require.Equal(t, "delivered", at["outcome"])
		require.Positive(t, at["latency_us"])
		require.NotEmpty(t, at["started_at"])
	}

	r = b.call(t, "POST", "/v1/admin/webhooks/"+id+"/replay", adminToken, map[string]any{
		"from": t0.Add(-2 * time.Hour).Format(time.RFC3339), "to": t0.Add(time.Second).Format(time.RFC3339)})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.InDelta(t, 2, r.Body["queued"], 0, "the early alert and the one delivered")
	poll("the range received", func() bool { return received(early) == 1 && received(alert) == 3 })
}
