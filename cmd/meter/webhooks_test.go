package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/webhook"
)

// The meter runs the webhook deliverer by default: it reports it in /readyz, exposes its
// metrics, and delivers an alert recorded in usage_alerts to a receiver that verifies its
// signature. With METER_WEBHOOKS=false it runs none.
func TestMeterDeliversWebhooks(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	var mu sync.Mutex
	var secret string
	var verified []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if err := webhook.Verify(secret, body, r.Header); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		verified = append(verified, r.Header.Get(webhook.HeaderID))
	}))
	t.Cleanup(srv.Close)
	c.env = append(c.env, "WEBHOOK_ALLOW_PRIVATE=true", "WEBHOOK_POLL=50ms")

	addr := testenv.FreeAddr(t)
	testenv.StartMain(t, append(append([]string{}, c.env...), "METER_ADDR="+addr), "-migrate")
	body, err := testenv.WaitHTTP(c.ctx, "http://"+addr+"/readyz", 200)
	require.NoError(t, err)
	require.Contains(t, body, `{"name":"webhooks","ok":true}`)

	store := webhook.NewStore(c.pool, true)
	e, s, err := store.CreateEndpoint(c.ctx, webhook.EndpointRequest{URL: srv.URL, EventTypes: []string{webhook.EventThreshold}})
	require.NoError(t, err)
	mu.Lock()
	secret = s
	mu.Unlock()
	const id = "alert/acme/requests/p80/2026-11"
	_, err = c.pool.Exec(c.ctx, `INSERT INTO usage_alerts (id, event_time, org, account, path, unit, kind, threshold,
		at_units, value, period, triggered_by, admitted, payload)
		VALUES ($1, now(), 'acme', 'acme', '{acme}', 'requests', 'quota_percent', 80, 800, 800, '2026-11', 'ev-1', true, '{"id":"x"}')`, id)
	require.NoError(t, err)
	for { // the receiver answers before the meter records the attempt: wait for the record
		ds, err := store.Deliveries(c.ctx, e.ID, webhook.StatusDelivered, 10)
		require.NoError(t, err)
		if len(ds) == 1 {
			break
		}
		select {
		case <-c.ctx.Done():
			t.Fatal("the meter never delivered the alert")
		case <-time.After(20 * time.Millisecond):
		}
	}
	mu.Lock()
	require.Equal(t, []string{id}, verified)
	mu.Unlock()
	metrics, err := testenv.WaitHTTP(c.ctx, "http://"+addr+"/metrics", 200)
	require.NoError(t, err)
	require.Contains(t, metrics, `metergate_webhook_attempts_total{result="delivered"} 1`)

	off := testenv.FreeAddr(t)
	testenv.StartMain(t, append(append([]string{}, c.env...), "METER_ADDR="+off, "METER_WEBHOOKS=false"))
	body, err = testenv.WaitHTTP(c.ctx, "http://"+off+"/readyz", 200)
	require.NoError(t, err)
	require.NotContains(t, body, "webhooks")
}
