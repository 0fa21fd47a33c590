package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/staff"
)

// opsOrg creates an org through the admin API and waits until admit's policies know it.
func opsOrg(t *testing.T, b *testBundle, name string) string {
	t.Helper()
	org := b.id(name)
	status, body := b.api(t, http.MethodPost, "/v1/admin/accounts", adminToken, map[string]any{"id": org, "kind": "org"})
	require.Equal(t, http.StatusCreated, status, body)
	require.Eventually(t, func() bool { _, err := b.cache.Resolve(org); return err == nil }, 10*time.Second, 10*time.Millisecond)
	return org
}

// opsEvents inserts n admissions of org into the billing log at at, each written by the
// meter lag after.
func opsEvents(t *testing.T, b *testBundle, org string, at time.Time, lag time.Duration, n int) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `select usage_events_partition($1::date)`, at.UTC().Format("2006-01-02"))
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `insert into usage_events (event_id, billing_period, event_time, ingest_time, charged_period,
  org, account, account_kind, path, source, requests, kafka_partition, kafka_offset)
select $1 || '.' || i, date_trunc('month', $2::timestamptz at time zone 'UTC')::date, $2, $2::timestamptz + $3::interval,
  date_trunc('month', $2::timestamptz at time zone 'UTC')::date, $4, $4, 'org', array[$4], 'test', 1, 0, i
from generate_series(1, $5) i`, b.id("ev-"+at.Format("150405.000")), at, lag.String(), org, n)
	require.NoError(t, err)
}

// opsRun inserts a finished reconcile run started at started, with summary, and returns
// its id.
func opsRun(t *testing.T, b *testBundle, started time.Time, summary string) string {
	t.Helper()
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `insert into reconcile_runs (run_id, started_at, finished_at, summary)
values (gen_random_uuid(), $1, $1::timestamptz + interval '3 seconds', $2) returning run_id::text`, started, summary).Scan(&id))
	return id
}

// opsAdjustment inserts an applied adjustment of run.
func opsAdjustment(t *testing.T, b *testBundle, run, org, reason, event string, before, after int64) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `insert into adjustments (run_id, kind, org, account, level, unit, period, amount,
  redis_before, redis_after, reason, source_event, applied_at)
values ($1, 'refund_5xx', $2, $2, 'org', 'requests',
  date_trunc('month', now() at time zone 'UTC')::date, $3, $4, $5, $6, $7, now())`,
		run, org, after-before, before, after, reason, event)
	require.NoError(t, err)
}

// opsDeadLetter inserts a dead letter with value.
func opsDeadLetter(t *testing.T, b *testBundle, offset int64, value []byte, errText string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `insert into dead_letters (topic, partition, "offset", key, value, error)
values ('usage', 0, $1, $2, $3, $4)`,
		offset, []byte("k-"+strconv.FormatInt(offset, 10)), value, errText)
	require.NoError(t, err)
}

// opsAlert inserts a usage alert of account fired at at, as the meter does.
func opsAlert(t *testing.T, b *testBundle, id, account string, at time.Time) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `insert into usage_alerts (id, event_time, org, account, path, unit, kind, threshold,
  at_units, value, period, triggered_by, admitted, payload)
values ($1, $2, $3, $3, array[$3], 'requests', 'quota_percent', 80, 800, 812, '2026-11', 'ev-1', true, '{}')`, id, at, account)
	require.NoError(t, err)
}

var (
	admittedRow = regexp.MustCompile(`Admitted</th><td class="n">([^<]+)</td><td class="n">([^<]+)</td>`)
	unknownRow  = regexp.MustCompile(`unknown_account</th><td class="n">([^<]+)</td><td class="n">([^<]+)</td>`)
)

// The overview reloads itself; it shows this node's admissions and refusals with their
// rates since the last look, the billing log's lag, dead letters, the last reconcile run,
// today's alerts and a chart of the last hour, every value escaped.
func TestOverview(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, token := b.member(t, staff.Viewer)
	br := b.signedIn(t, token)

	r := br.get("/console/")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.NotContains(t, r.body, `http-equiv="refresh"`, "it reloads only when asked (WCAG 2.2.1)")
	r = br.get("/console/?refresh=on")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `<meta http-equiv="refresh" content="10">`)
	require.Contains(t, r.body, "Decisions at this node")
	require.Contains(t, r.body, "Refused 402: quota exceeded", "each refusal by the status admit answers it with")
	require.Contains(t, r.body, "Refused 429: rate limited")
	require.Contains(t, r.body, "Length: not in this node", "the test's admitter registers no outbox metrics")
	require.Contains(t, r.body, "No reconcile run yet.")
	require.Contains(t, r.body, "None today.")
	require.Contains(t, r.body, "No admission recorded in the last 30 seconds")
	require.Contains(t, r.body, "Admitted per minute at this node")
	require.NotContains(t, r.body, "<script")

	// Admissions through the API: this node's counters and, from the next sample on, rates.
	org := opsOrg(t, b, "org")
	for range 3 {
		status, body := b.api(t, http.MethodPost, "/v1/admit", serviceToken, map[string]any{"account": org})
		require.Equal(t, http.StatusOK, status, body)
	}
	status, body := b.api(t, http.MethodPost, "/v1/admit", serviceToken, map[string]any{"account": b.id("nobody")})
	require.Equal(t, http.StatusUnauthorized, status, body)
	var rate float64
	deadline := time.Now().Add(15 * time.Second)
	for {
		r = br.get("/console/")
		require.Equal(t, http.StatusOK, r.status, r.body)
		m := admittedRow.FindStringSubmatch(r.body)
		require.NotNil(t, m, r.body)
		require.Equal(t, "3", m[2], "admitted since start")
		if f, err := strconv.ParseFloat(m[1], 64); err == nil && f > 0 {
			rate = f
			break
		}
		require.True(t, time.Now().Before(deadline), "the rate never rose: %s", m[1])
		time.Sleep(100 * time.Millisecond)
	}
	require.Greater(t, rate, 0.0)
	m := unknownRow.FindStringSubmatch(r.body)
	require.NotNil(t, m, "a rejection before a decision is listed by its code")
	require.Equal(t, "1", m[2])
	require.NotEqual(t, "0.0", m[1])

	// The billing log: rows older than the lag's 30 seconds are not read.
	earlier := time.Now().Add(-20 * time.Minute).UTC().Truncate(time.Second)
	opsEvents(t, b, org, earlier, time.Second, 2)
	r = br.get("/console/")
	require.Contains(t, r.body, "No admission recorded in the last 30 seconds")

	// More of the log, a dead letter, a reconcile run and an alert.
	at := time.Now().Add(-5 * time.Second).UTC().Truncate(time.Second)
	opsEvents(t, b, org, at, 2*time.Second, 4)
	opsDeadLetter(t, b, 7, []byte("<script>alert(1)</script>"), `cannot parse <script>alert("dl")</script>`)
	run := opsRun(t, b, time.Now().Add(-time.Hour), `{"adjustments_applied": 2, "note": "<script>x</script>"}`)
	opsAdjustment(t, b, run, org, "refund", "ev-1", 10, 9)
	opsAdjustment(t, b, run, org, "refund", "ev-2", 9, 8)
	opsRun(t, b, time.Now().Add(-2*time.Hour), `{}`)
	opsAlert(t, b, "alert/"+b.id("today"), org, time.Now())
	opsAlert(t, b, "alert/"+b.id("yesterday"), org, time.Now().Add(-25*time.Hour))

	r = br.get("/console/")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.NotContains(t, r.body, "<script")
	require.Contains(t, r.body, "2.00 s</p><p class=\"label\">median; 95th percentile 2.00 s, over 4 rows", "the lag of the last 30 s")
	require.Contains(t, r.body, at.Format("2006-01-02 15:04:05 UTC"), "the newest row")
	require.Contains(t, r.body, `cannot parse &lt;script&gt;alert(&#34;dl&#34;)&lt;/script&gt;`, "the newest dead letter, escaped")
	require.Contains(t, r.body, `href="/console/runs/`+run+`"`, "the last run")
	require.Contains(t, r.body, "<dt>Adjustments</dt><dd>2</dd>")
	require.Contains(t, r.body, "<dt>adjustments_applied</dt><dd><code>2</code></dd>")
	require.Contains(t, r.body, "&lt;script&gt;x&lt;/script&gt;")
	require.Contains(t, r.body, "Alerts fired today (UTC): 1")
	require.Contains(t, r.body, "alert/"+b.id("today"))
	require.NotContains(t, r.body, "alert/"+b.id("yesterday"))
}

var runLink = regexp.MustCompile(`href="/console/runs/([0-9a-f-]{36})"`)

// The reconcile runs, newest first a page at a time, each with its summary and
// adjustments; a run's page lists its adjustments with links to "Why?"; an id that is not
// a run's is a 404.
func TestReconcileRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, token := b.member(t, staff.Viewer)
	br := b.signedIn(t, token)
	org := b.id("org")

	_, err := b.pool.Exec(b.ctx, `insert into reconcile_runs (run_id, started_at)
select gen_random_uuid(), now() - interval '1 day' - i * interval '1 minute' from generate_series(1, 52) i`)
	require.NoError(t, err)
	run := opsRun(t, b, time.Now().Add(-time.Minute), `{"adjustments_planned": 2, "by_kind": {"refund_5xx": 2}}`)
	opsAdjustment(t, b, run, org, `a 5xx <script>alert("adj")</script>`, "ev-"+b.id("1"), 100, 99)
	opsAdjustment(t, b, run, org, "a 5xx", "ev-"+b.id("2"), 99, 97)

	r := br.get("/console/runs")
	require.Equal(t, http.StatusOK, r.status, r.body)
	first := runLink.FindAllStringSubmatch(r.body, -1)
	require.Len(t, first, 50)
	require.Equal(t, run, first[0][1], "newest first")
	require.Contains(t, r.body, "did not finish")
	require.Contains(t, r.body, `by_kind: <code>{&#34;refund_5xx&#34;:2}</code>`)
	next := regexp.MustCompile(`<a href="(/console/runs\?[^"]+)">Older runs`).FindStringSubmatch(r.body)
	require.NotNil(t, next, "a link to the next page")
	r = br.get(strings.ReplaceAll(next[1], "&amp;", "&"))
	require.Equal(t, http.StatusOK, r.status, r.body)
	second := runLink.FindAllStringSubmatch(r.body, -1)
	require.Len(t, second, 3)
	seen := map[string]bool{}
	for _, m := range append(first, second...) {
		require.False(t, seen[m[1]], "run %s on two pages", m[1])
		seen[m[1]] = true
	}
	require.NotContains(t, r.body, "Older runs")

	r = br.get("/console/runs/" + run)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.NotContains(t, r.body, "<script")
	require.Contains(t, r.body, `a 5xx &lt;script&gt;alert(&#34;adj&#34;)&lt;/script&gt;`)
	require.Contains(t, r.body, `href="/console/why?q=ev-`+b.id("1")+`"`)
	require.Contains(t, r.body, `<td class="n">100</td><td class="n">99</td>`, "Redis before and after")
	require.Contains(t, r.body, `<td class="n">−2</td>`, "the amount")
	require.Contains(t, r.body, "<dt>adjustments_planned</dt><dd><code>2</code></dd>")

	require.Equal(t, http.StatusNotFound, br.get("/console/runs/not-a-uuid").status)
	require.Equal(t, http.StatusNotFound, br.get("/console/runs/0190a8e4-0000-7000-8000-000000000000").status)
	require.Equal(t, http.StatusBadRequest, br.get("/console/runs?at=yesterday&id=x").status)
}

var deadLetterID = regexp.MustCompile(`<h2 id="dl-(\d+)">`)

// Dead letters, newest first a page at a time: text shown escaped, binary as a hex dump,
// a long value cut at a character's boundary.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, token := b.member(t, staff.Support)
	br := b.signedIn(t, token)

	_, err := b.pool.Exec(b.ctx, `insert into dead_letters (topic, partition, "offset", value, error)
select 'usage', 0, 1000 + i, convert_to('{"filler":' || i || '}', 'UTF8'), 'filler' from generate_series(0, 99) i`)
	require.NoError(t, err)
	opsDeadLetter(t, b, 1, []byte{0x00, 0xff, 0xfe, 0x01, '<'}, "not JSON")
	opsDeadLetter(t, b, 2, []byte(`{"id":"<script>alert(1)</script>"}`), `unknown field "<b>"`)
	opsDeadLetter(t, b, 3, []byte("a"+strings.Repeat("é", 2500)), "too long")

	r := br.get("/console/dead-letters")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Len(t, deadLetterID.FindAllString(r.body, -1), 100)
	require.NotContains(t, r.body, "<script")
	require.NotContains(t, r.body, "<b>")
	require.Contains(t, r.body, `{&#34;id&#34;:&#34;&lt;script&gt;alert(1)&lt;/script&gt;&#34;}`)
	require.Contains(t, r.body, `unknown field &#34;&lt;b&gt;&#34;`)
	require.Contains(t, r.body, "00 ff fe 01 3c", "binary as a hex dump")
	require.Contains(t, r.body, "5 bytes, not text: a hex dump")
	require.Contains(t, r.body, "5\u202f001 bytes, the start shown")
	require.Contains(t, r.body, "a"+strings.Repeat("é", 1023)+"</pre>", "cut at a character's boundary")
	require.NotContains(t, r.body, strings.Repeat("é", 1024))
	require.Contains(t, r.body, "usage, partition 0, offset 2")
	require.Contains(t, r.body, "<code>k-2</code>", "the key")

	next := regexp.MustCompile(`href="(/console/dead-letters\?before=\d+)"`).FindStringSubmatch(r.body)
	require.NotNil(t, next, r.body)
	r = br.get(next[1])
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Len(t, deadLetterID.FindAllString(r.body, -1), 3)
	require.Contains(t, r.body, "offset 1000</dd>")
	require.Equal(t, http.StatusBadRequest, br.get("/console/dead-letters?before=x").status)
}

// Webhook endpoints and their deliveries: every role sees them, only an admin replays one
// (the button shown to an admin only, the write refused to support), and the replay is
// the admin API's, audited.
func TestWebhookReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(hook.Close)
	status, body := b.api(t, http.MethodPost, "/v1/admin/webhooks", adminToken, map[string]any{
		"url": hook.URL + "/hook?a=<b>", "event_types": []string{"usage.threshold.v1"}})
	require.Equal(t, http.StatusCreated, status, body)
	var ep struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(body), &ep))
	opsAlert(t, b, "alert/"+b.id("a"), b.id("org"), time.Now().Add(-time.Minute))
	status, body = b.api(t, http.MethodPost, "/v1/admin/webhooks/"+ep.ID+"/replay", adminToken, map[string]any{
		"from": time.Now().Add(-time.Hour).Format(time.RFC3339), "to": time.Now().Add(time.Hour).Format(time.RFC3339)})
	require.Equal(t, http.StatusOK, status, body)
	var delivery int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `update webhook_deliveries set status = 'failed', attempts = 3, last_status = 500,
  last_error = '<b>refused</b>' where endpoint = $1 returning id`, ep.ID).Scan(&delivery))
	deliveryStatus := func() string {
		var s string
		require.NoError(t, b.pool.QueryRow(b.ctx, `select status from webhook_deliveries where id = $1`, delivery).Scan(&s))
		return s
	}
	replay := fmt.Sprintf("/console/webhooks/%s/deliveries/%d/replay", ep.ID, delivery)

	_, token := b.member(t, staff.Support)
	support := b.signedIn(t, token)
	r := support.get("/console/webhooks")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `href="/console/webhooks/`+ep.ID+`"`)
	require.Contains(t, r.body, hook.URL+"/hook?a=&lt;b&gt;")
	r = support.get("/console/webhooks/" + ep.ID + "?status=failed")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "alert/"+b.id("a"))
	require.Contains(t, r.body, "HTTP 500 <code>&lt;b&gt;refused&lt;/b&gt;</code>")
	require.NotContains(t, r.body, `action="`+replay+`"`, "no replay button for support")
	r = support.post(replay, nil)
	require.Equal(t, http.StatusForbidden, r.status, r.body)
	require.Equal(t, "failed", deliveryStatus())

	admin := b.signedIn(t, adminToken)
	r = admin.get("/console/webhooks/" + ep.ID)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `action="`+replay+`"`)
	r = admin.post(replay, nil)
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	require.Equal(t, fmt.Sprintf("/console/webhooks/%s?replayed=%d", ep.ID, delivery), r.location)
	require.Equal(t, "pending", deliveryStatus())
	r = admin.get(r.location)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, fmt.Sprintf("Delivery %d is queued again", delivery))
	r = admin.get("/console/webhooks/" + ep.ID + "?status=failed")
	require.Contains(t, r.body, "No deliveries failed.")
	var audited int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) from audit_log where actor = $1 and route = $2`,
		staff.AdminToken, "/v1/admin/webhooks/{id}/deliveries/{delivery}/replay").Scan(&audited))
	require.Equal(t, 1, audited)

	require.Equal(t, http.StatusNotFound, admin.get("/console/webhooks/wh_nope").status)
	require.Equal(t, http.StatusBadRequest, admin.get("/console/webhooks/"+ep.ID+"?status=lost").status)
}

var auditRowPath = regexp.MustCompile(`<code>PUT (/v1/admin/accounts/p\d\d)</code>`)

// The audit log, newest first a page at a time, by actor: a write made through the console
// is there with its after, escaped.
func TestAuditLog(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	admin := b.signedIn(t, adminToken)
	admin.get("/console/staff")
	r := admin.post("/console/staff", url.Values{"name": {`<script>alert(1)</script> Eve`}, "role": {"viewer"}})
	require.Equal(t, http.StatusCreated, r.status, r.body)

	_, token := b.member(t, staff.Viewer)
	viewer := b.signedIn(t, token)
	r = viewer.get("/console/audit")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.NotContains(t, r.body, "<script")
	require.Contains(t, r.body, "<code>POST /v1/admin/staff</code>")
	require.Contains(t, r.body, `&#34;name&#34;: &#34;&lt;script&gt;alert(1)&lt;/script&gt; Eve&#34;`, "the after, pretty-printed")
	require.Contains(t, r.body, `href="/console/audit?actor=admin-token"`)

	r = viewer.get("/console/audit?actor=admin-token")
	require.Contains(t, r.body, "<code>POST /v1/admin/staff</code>")
	r = viewer.get("/console/audit?actor=nobody")
	require.NotContains(t, r.body, "<code>POST /v1/admin/staff</code>")
	require.Contains(t, r.body, "Nothing done by nobody.")

	for i := range 60 {
		_, err := b.staff.Record(b.ctx, staff.Entry{Actor: "pager", Role: staff.Support, Method: http.MethodPut,
			Route: "/v1/admin/accounts/{id}", Path: fmt.Sprintf("/v1/admin/accounts/p%02d", i), Status: http.StatusOK})
		require.NoError(t, err)
	}
	r = viewer.get("/console/audit?actor=pager")
	first := auditRowPath.FindAllStringSubmatch(r.body, -1)
	require.Len(t, first, 50)
	require.Equal(t, "/v1/admin/accounts/p59", first[0][1], "newest first")
	next := regexp.MustCompile(`<a href="(/console/audit\?[^"]+)">Older`).FindStringSubmatch(r.body)
	require.NotNil(t, next)
	r = viewer.get(strings.ReplaceAll(next[1], "&amp;", "&"))
	second := auditRowPath.FindAllStringSubmatch(r.body, -1)
	require.Len(t, second, 10, "the filter is kept")
	require.Equal(t, "/v1/admin/accounts/p00", second[9][1])
	require.Equal(t, http.StatusBadRequest, viewer.get("/console/audit?before=x").status)
}
