package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/webhook"
	"github.com/metergate/metergate/pkg/event"
)

// receiver is a webhook endpoint that verifies every signature and answers the first
// attempt of each webhook-id 503: it records what it accepted, by webhook-id.
type receiver struct {
	secret atomic.Pointer[string]
	mu     sync.Mutex
	tries  map[string]int              // attempts by webhook-id
	got    map[string]event.CloudEvent // accepted, by webhook-id
	dups   int                         // accepted again after an acceptance
	bad    []string                    // why a request was refused (a bad signature)
}

func newReceiver(t *testing.T) (*receiver, string) {
	rc := &receiver{tries: map[string]int{}, got: map[string]event.CloudEvent{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		secret := rc.secret.Load()
		if secret == nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if err := webhook.Verify(*secret, body, r.Header); err != nil {
			rc.bad = append(rc.bad, err.Error())
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		id := r.Header.Get("webhook-id")
		rc.tries[id]++
		if rc.tries[id] == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // the retry must bring it again, same id
			return
		}
		if _, ok := rc.got[id]; ok {
			rc.dups++
		}
		var ce event.CloudEvent
		if err := json.Unmarshal(body, &ce); err != nil {
			rc.bad = append(rc.bad, err.Error())
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		rc.got[id] = ce
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return rc, srv.URL
}

func (rc *receiver) accepted() map[string]event.CloudEvent {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[string]event.CloudEvent, len(rc.got))
	for k, v := range rc.got {
		out[k] = v
	}
	return out
}

// Thresholds through the whole pipeline, real binaries: 200 requests at once cross a team's
// 50 and 100 % of its requests quota; each threshold is one usage_alerts row, fired by a
// request its caller was told 200 (the 100 %: the one that reached it), and reaches a real
// receiver that verifies the signature exactly once, after a 503 and a retry with the same
// webhook-id. Refunds of 5xx (reconcile) take the counter back below 100 %; crossing it
// again fires nothing, and nothing more is delivered.
func TestThresholdsThroughThePipeline(t *testing.T) {
	t.Parallel()
	s := newStack(t, 4, "WEBHOOK_ALLOW_PRIVATE=true", "WEBHOOK_POLL=100ms", "WEBHOOK_BACKOFF_BASE=200ms", "WEBHOOK_BACKOFF_CAP=1s")
	ctx := testenv.Context(t, 4*time.Minute)
	team := s.org + "-team"
	s.account(t, team, "team", s.org, "", map[string]any{"requests": map[string]any{"quota": 100}})

	rc, url := newReceiver(t)
	status, out, err := call("POST", s.admit+"/v1/admin/webhooks", adminToken,
		map[string]any{"url": url, "event_types": []string{"usage.threshold.v1"}, "account": s.org})
	require.NoError(t, err)
	require.Equal(t, 201, status, "%v", out)
	secret := out["secret"].(string)
	rc.secret.Store(&secret)
	status, out, err = call("POST", s.admit+"/v1/admin/alerts", adminToken,
		map[string]any{"account": team, "kind": "quota_percent", "unit": "requests", "thresholds": []int{50, 100}})
	require.NoError(t, err)
	require.Equal(t, 201, status, "%v", out)
	for { // the rule reaches admit's cache within 1 s
		status, out, err := call("GET", s.admit+"/v1/admin/accounts/"+team, adminToken, nil)
		require.NoError(t, err)
		require.Equal(t, 200, status, "%v", out)
		if eff, ok := out["effective"].(map[string]any); ok {
			path := eff["path"].([]any)
			if _, ok := path[len(path)-1].(map[string]any)["alerts"]; ok {
				break
			}
		}
		require.NoError(t, ctx.Err(), "the rule never reached admit")
		time.Sleep(10 * time.Millisecond)
	}

	// 200 at once: 100 are told 200, 100 are told 402.
	told := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	refused := atomic.Int64{}
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, out, err := call("POST", s.admit+"/v1/admit", serviceToken, map[string]any{"account": team})
			if err != nil {
				t.Error(err)
				return
			}
			switch status {
			case 200:
				mu.Lock()
				told[out["event_id"].(string)] = true
				mu.Unlock()
			case 402:
				refused.Add(1)
			default:
				t.Errorf("status %d: %v", status, out)
			}
		}()
	}
	wg.Wait()
	require.Len(t, told, 100)
	require.EqualValues(t, 100, refused.Load())

	type alert struct {
		ID, Account, Unit, Kind string
		Threshold, At, Value    int64
		TriggeredBy             string
		Admitted                bool
	}
	alerts := func() []alert {
		rows, err := s.db.Query(ctx, `SELECT id, account, unit, kind, threshold, at_units, value, triggered_by, admitted
			FROM usage_alerts WHERE org = $1 ORDER BY threshold`, s.org)
		require.NoError(t, err)
		defer rows.Close()
		var out []alert
		for rows.Next() {
			var a alert
			require.NoError(t, rows.Scan(&a.ID, &a.Account, &a.Unit, &a.Kind, &a.Threshold, &a.At, &a.Value, &a.TriggeredBy, &a.Admitted))
			out = append(out, a)
		}
		require.NoError(t, rows.Err())
		return out
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			require.NoError(t, ctx.Err(), "waiting for %s", what)
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("both thresholds delivered", func() bool { return len(rc.accepted()) == 2 })
	got := alerts()
	require.Len(t, got, 2)
	month := time.Now().UTC().Format("2006-01")
	for i, pct := range []int64{50, 100} {
		a := got[i]
		require.Equal(t, alert{ID: "alert/" + team + "/requests/p" + itoa(pct) + "/" + month, Account: team, Unit: "requests",
			Kind: "quota_percent", Threshold: pct, At: pct, Value: pct, TriggeredBy: a.TriggeredBy, Admitted: true}, a)
		require.True(t, told[a.TriggeredBy], "fired by a request its caller was told 200")
		ce, ok := rc.accepted()[a.ID]
		require.True(t, ok, "%s delivered under its id", a.ID)
		require.Equal(t, event.TypeThreshold, ce.Type)
		require.Equal(t, a.ID, ce.ID)
	}

	// Ten of the admitted end in a 503: reconcile gives their quota back (counter 90). Ten
	// more requests take it to 100 again: nothing fires, nothing more is delivered.
	n := 0
	for id := range told {
		if n == 10 {
			break
		}
		status, out, err := call("POST", s.admit+"/v1/outcomes", serviceToken, map[string]any{"event_id": id, "status": 503})
		require.NoError(t, err)
		require.Equal(t, 202, status, "%v", out)
		n++
	}
	waitFor("the outcomes metered", func() bool {
		var k int
		require.NoError(t, s.db.QueryRow(ctx, `SELECT count(*) FROM usage_outcomes WHERE status = 503`).Scan(&k))
		return k == 10
	})
	code, res := s.reconcile(t, "-json")
	require.Equal(t, 0, code, res)
	again := 0
	for range 12 {
		status, _, err := call("POST", s.admit+"/v1/admit", serviceToken, map[string]any{"account": team})
		require.NoError(t, err)
		if status == 200 {
			again++
		}
	}
	require.Equal(t, 10, again, "the refunded quota is there again")
	// The next threshold event, were there one, would be behind these admissions: once their
	// rows are in, so would it be.
	waitFor("the new admissions metered", func() bool {
		var k int
		require.NoError(t, s.db.QueryRow(ctx, `SELECT count(*) FROM usage_events WHERE account = $1`, team).Scan(&k))
		return k == 110
	})
	require.Len(t, alerts(), 2, "crossing 100 % again after a refund fires nothing")
	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Empty(t, rc.bad, "every signature verified")
	require.Zero(t, rc.dups, "each threshold accepted once")
	for id, n := range rc.tries {
		require.Equal(t, 2, n, "%s: the 503, then the retry", id)
	}
	var attempts int
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT count(*) FROM webhook_attempts`).Scan(&attempts))
	require.Equal(t, 4, attempts, "each attempt logged")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
