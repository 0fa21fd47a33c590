package webhook_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/webhook"
	"github.com/metergate/metergate/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.MainOrTests(m, delivererMain)) }

// childDatabaseEnv carries the test's schema to a deliverer started as a child process.
const childDatabaseEnv = "WEBHOOK_TEST_DATABASE_URL"

// childOptions are the deliverer's options in a child process and in TestKilledDelivererResumes.
func childOptions() webhook.DelivererOptions {
	return webhook.DelivererOptions{AllowPrivate: true, Timeout: 2 * time.Second, LeaseMargin: 500 * time.Millisecond,
		Poll: 50 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffCap: 50 * time.Millisecond}
}

// delivererMain is this test binary started by testenv.StartMain: a deliverer on the
// schema of childDatabaseEnv until SIGTERM (or SIGKILL).
func delivererMain() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(childDatabaseEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer pool.Close()
	fmt.Println("deliverer running")
	if err := webhook.NewDeliverer(pool, childOptions()).Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// bundle is a test's own schema (deliverers claim every due delivery of a schema, so tests
// that run deliverers do not share one) and a store on it.
type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	store  *webhook.Store
	n      int
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := testenv.Context(t, 2*time.Minute)
	pool, schema := testenv.EmptySchema(t)
	_, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	return &bundle{ctx: ctx, pool: pool, schema: schema, store: webhook.NewStore(pool, true)}
}

// alert inserts a usage_alerts row of account, under path (org first), at eventTime, as the
// meter does (ON CONFLICT DO NOTHING), and returns its id and its payload as stored.
func (b *bundle) alert(t *testing.T, path []string, eventTime time.Time) (string, string) {
	t.Helper()
	b.n++
	account := path[len(path)-1]
	id := fmt.Sprintf("alert/%s/requests/p%d/2026-11", account, b.n)
	payload := fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"admit-1","type":"io.metergate.usage.threshold.v1",`+
		`"time":%q,"data":{"account":%q,"unit":"requests","threshold":%d}}`, id, eventTime.Format(time.RFC3339Nano), account, b.n)
	b.insertAlert(t, id, path, eventTime, payload)
	var stored string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT payload::text FROM usage_alerts WHERE id = $1`, id).Scan(&stored))
	return id, stored
}

func (b *bundle) insertAlert(t *testing.T, id string, path []string, eventTime time.Time, payload string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO usage_alerts (id, event_time, org, account, path, unit, kind, threshold,
		at_units, value, period, triggered_by, admitted, payload)
		VALUES ($1, $2, $3, $4, $5, 'requests', 'quota_percent', 80, 800, 800, '2026-11', 'ev-1', true, $6)
		ON CONFLICT DO NOTHING`, id, eventTime, path[0], path[len(path)-1], path, payload)
	require.NoError(t, err)
}

// endpoint makes an endpoint of the alerts (usage.threshold.v1) and returns it with its secret.
func (b *bundle) endpoint(t *testing.T, url, account string) (webhook.Endpoint, string) {
	t.Helper()
	return b.endpointOf(t, url, account, webhook.EventThreshold)
}

// endpointOf makes an endpoint of types and returns it with its secret.
func (b *bundle) endpointOf(t *testing.T, url, account string, types ...string) (webhook.Endpoint, string) {
	t.Helper()
	if account != "" {
		b.org(t, account)
	}
	e, secret, err := b.store.CreateEndpoint(b.ctx, webhook.EndpointRequest{URL: url, EventTypes: types, Account: account})
	require.NoError(t, err)
	return e, secret
}

// org makes an org account of id, if there is none: an endpoint's account filter names an
// existing account.
func (b *bundle) org(t *testing.T, id string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, org) VALUES ($1, 'org', $1) ON CONFLICT DO NOTHING`, id)
	require.NoError(t, err)
}

// run runs a deliverer until the test ends.
func (b *bundle) run(t *testing.T, o webhook.DelivererOptions) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	d := webhook.NewDeliverer(b.pool, o)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
}

// delivery reads the delivery of event (an alert's or a billing event's id) to endpoint.
func (b *bundle) delivery(t *testing.T, endpoint, event string) webhook.Delivery {
	t.Helper()
	var id int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id FROM webhook_deliveries WHERE endpoint = $1 AND event = $2`, endpoint, event).Scan(&id))
	d, err := b.store.Delivery(b.ctx, endpoint, id)
	require.NoError(t, err)
	return d
}

// waitStatus polls until the delivery of event to endpoint has status.
func (b *bundle) waitStatus(t *testing.T, endpoint, event, status string) webhook.Delivery {
	t.Helper()
	var d webhook.Delivery
	eventually(t, b.ctx, func() bool {
		d = b.delivery(t, endpoint, event)
		return d.Status == status
	}, "delivery of %s never became %s", event, status)
	return d
}

func eventually(t *testing.T, ctx context.Context, cond func() bool, format string, args ...any) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf(format, args...)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// received is one request a receiver got.
type received struct {
	header http.Header
	body   []byte
	status int // 0: the deliverer hung up before the reply
}

// receiver is a webhook endpoint: it verifies every request with its secret (webhook.Verify;
// 401 when it does not verify) and then answers what reply says for the n-th request (from
// 0).
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	secret string
	got    []received
	reply  func(n int, r *http.Request) int
}

func newReceiver(t *testing.T, reply func(n int, r *http.Request) int) *receiver {
	t.Helper()
	rc := &receiver{reply: reply}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		n, secret := len(rc.got), rc.secret
		rc.got = append(rc.got, received{header: r.Header.Clone(), body: body})
		rc.mu.Unlock()
		status := http.StatusUnauthorized
		if webhook.Verify(secret, body, r.Header) == nil {
			status = rc.reply(n, r)
		}
		rc.mu.Lock()
		if r.Context().Err() == nil {
			rc.got[n].status = status // else the deliverer hung up: it never saw the reply
		}
		rc.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) setSecret(s string) {
	rc.mu.Lock()
	rc.secret = s
	rc.mu.Unlock()
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// accepted counts the requests answered 2xx per webhook-id.
func (rc *receiver) accepted() map[string]int {
	out := map[string]int{}
	for _, r := range rc.requests() {
		if r.status >= 200 && r.status < 300 {
			out[r.header.Get(webhook.HeaderID)]++
		}
	}
	return out
}

func ok(int, *http.Request) int { return http.StatusNoContent }

// A 5xx and then a timeout (the receiver holds the request past the attempt timeout) are
// retried until the receiver accepts: one accepted request for the webhook-id, the same id
// and the stored payload byte for byte on every attempt, each verified by the receiver, and
// each attempt in the log with its status and latency.
func TestRetriesDeliverOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const timeout = 300 * time.Millisecond
	rc := newReceiver(t, func(n int, r *http.Request) int {
		switch n {
		case 0:
			return http.StatusServiceUnavailable
		case 1:
			select { // past the deliverer's timeout: it hangs up
			case <-r.Context().Done():
			case <-time.After(10 * timeout):
			}
			return http.StatusOK
		}
		return http.StatusOK
	})
	e, secret := b.endpoint(t, rc.srv.URL+"/hooks", "")
	rc.setSecret(secret)
	b.run(t, webhook.DelivererOptions{AllowPrivate: true, Timeout: timeout, LeaseMargin: 200 * time.Millisecond,
		Poll: 20 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffCap: 40 * time.Millisecond})

	id, payload := b.alert(t, []string{"acme", "team-a"}, time.Now())
	d := b.waitStatus(t, e.ID, id, webhook.StatusDelivered)

	require.Equal(t, map[string]int{id: 1}, rc.accepted())
	reqs := rc.requests()
	require.Len(t, reqs, 3)
	for i, r := range reqs {
		require.Equal(t, id, r.header.Get(webhook.HeaderID), "attempt %d", i)
		require.Equal(t, payload, string(r.body), "attempt %d: the payload as stored", i)
		require.Equal(t, "application/json", r.header.Get("Content-Type"))
		require.Equal(t, "metergate-webhooks/1", r.header.Get("User-Agent"))
		require.NoError(t, webhook.Verify(secret, r.body, r.header), "attempt %d", i)
	}
	require.Equal(t, 3, d.Attempts)
	require.NotNil(t, d.DeliveredAt)
	require.Len(t, d.Log, 3)
	require.Equal(t, http.StatusServiceUnavailable, *d.Log[0].Status)
	require.Equal(t, webhook.StatusFailed, d.Log[0].Outcome)
	require.Contains(t, d.Log[0].Error, "HTTP 503")
	require.Positive(t, d.Log[0].LatencyUS)
	require.Nil(t, d.Log[1].Status, "a timeout gets no status")
	require.Contains(t, d.Log[1].Error, "timeout after 300ms")
	require.GreaterOrEqual(t, d.Log[1].LatencyUS, timeout.Microseconds())
	require.Equal(t, http.StatusOK, *d.Log[2].Status)
	require.Equal(t, webhook.StatusDelivered, d.Log[2].Outcome)
	require.Positive(t, d.Log[2].LatencyUS)
	for i := 1; i < 3; i++ {
		require.False(t, d.Log[i].StartedAt.Before(d.Log[i-1].StartedAt))
	}
}

// Deliverers running side by side against a slow receiver POST each alert once: a claimed
// delivery's lease keeps the others off it while its attempt is in flight.
func TestConcurrentDeliverersPostOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, func(int, *http.Request) int {
		time.Sleep(50 * time.Millisecond) // a slow receiver: the attempt outlives other deliverers' polls
		return http.StatusOK
	})
	e, secret := b.endpoint(t, rc.srv.URL, "")
	rc.setSecret(secret)
	for range 3 {
		b.run(t, webhook.DelivererOptions{AllowPrivate: true, Timeout: 5 * time.Second, Poll: 5 * time.Millisecond, Concurrency: 4})
	}
	var ids []string
	for range 20 {
		id, _ := b.alert(t, []string{"acme", "team-b"}, time.Now())
		ids = append(ids, id)
	}
	for _, id := range ids {
		b.waitStatus(t, e.ID, id, webhook.StatusDelivered)
	}
	want := map[string]int{}
	for _, id := range ids {
		want[id] = 1
	}
	require.Equal(t, want, rc.accepted())
	require.Len(t, rc.requests(), len(ids), "one POST per alert")
}

// A deliverer killed with SIGKILL while it holds a delivery mid-retry loses nothing: the
// lease lapses, another deliverer retries, and the receiver accepts the delivery once, with
// the same webhook-id on every attempt.
func TestKilledDelivererResumes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hung := make(chan struct{})
	var hungOnce sync.Once
	rc := newReceiver(t, func(n int, r *http.Request) int {
		switch n {
		case 0:
			return http.StatusInternalServerError
		case 1: // the retry: held until the deliverer dies
			hungOnce.Do(func() { close(hung) })
			<-r.Context().Done()
			return http.StatusOK
		}
		return http.StatusOK
	})
	e, secret := b.endpoint(t, rc.srv.URL, "")
	rc.setSecret(secret)
	id, payload := b.alert(t, []string{"acme"}, time.Now())

	child := testenv.StartMain(t, []string{childDatabaseEnv + "=" + testenv.WithSearchPath(t, testenv.DatabaseURL(t), b.schema)})
	select {
	case <-hung:
	case <-b.ctx.Done():
		t.Fatalf("the retry never arrived; deliverer output:\n%s", child.Output())
	}
	d := b.delivery(t, e.ID, id)
	require.Equal(t, webhook.StatusPending, d.Status)
	require.Equal(t, 1, d.Attempts, "the failed first attempt is logged")
	var leased bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT lease_until > now() FROM webhook_deliveries WHERE id = $1`, d.ID).Scan(&leased))
	require.True(t, leased, "the retry in flight holds the lease")
	require.NoError(t, child.Signal(syscall.SIGKILL))
	_, err := child.Wait(10 * time.Second)
	require.NoError(t, err)

	b.run(t, childOptions())
	d = b.waitStatus(t, e.ID, id, webhook.StatusDelivered)
	require.Equal(t, map[string]int{id: 1}, rc.accepted())
	reqs := rc.requests()
	require.Len(t, reqs, 3, "the failure, the attempt cut by the kill, the retry")
	for _, r := range reqs {
		require.Equal(t, id, r.header.Get(webhook.HeaderID))
		require.Equal(t, payload, string(r.body))
	}
	require.Equal(t, 2, d.Attempts, "the attempt cut by the kill is not logged")
	require.Len(t, d.Log, 2)
	require.Equal(t, http.StatusInternalServerError, *d.Log[0].Status)
	require.Equal(t, http.StatusOK, *d.Log[1].Status)
}

// After a rotation, deliveries carry both signatures until the overlap ends: a receiver
// holding the old secret and one holding the new both verify. After it, only the new.
func TestRotatedSecretOverlap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, ok)
	e, oldSecret := b.endpoint(t, rc.srv.URL, "")
	_, newSecret, err := b.store.Rotate(b.ctx, e.ID, time.Hour)
	require.NoError(t, err)
	require.NotEqual(t, oldSecret, newSecret)
	rc.setSecret(newSecret)
	b.run(t, webhook.DelivererOptions{AllowPrivate: true, Poll: 10 * time.Millisecond})

	during, _ := b.alert(t, []string{"acme"}, time.Now())
	b.waitStatus(t, e.ID, during, webhook.StatusDelivered)
	r := rc.requests()[0]
	require.Len(t, strings.Fields(r.header.Get(webhook.HeaderSignature)), 2)
	require.NoError(t, webhook.Verify(oldSecret, r.body, r.header), "the old secret during the overlap")
	require.NoError(t, webhook.Verify(newSecret, r.body, r.header), "the new secret during the overlap")

	// The overlap ends.
	_, err = b.pool.Exec(b.ctx, `UPDATE webhook_secrets SET expires_at = now() WHERE endpoint = $1 AND expires_at IS NOT NULL`, e.ID)
	require.NoError(t, err)
	after, _ := b.alert(t, []string{"acme"}, time.Now())
	b.waitStatus(t, e.ID, after, webhook.StatusDelivered)
	r = rc.requests()[1]
	require.Equal(t, after, r.header.Get(webhook.HeaderID))
	require.Len(t, strings.Fields(r.header.Get(webhook.HeaderSignature)), 1)
	require.NoError(t, webhook.Verify(newSecret, r.body, r.header))
	require.Error(t, webhook.Verify(oldSecret, r.body, r.header), "the old secret after the overlap")
}

// Private targets: a literal private address is refused when the endpoint is made, and a
// name that resolves to loopback is refused when the deliverer connects, logged as a failed
// attempt with the guard's error; nothing reaches the receiver.
func TestPrivateTargetRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	guarded := webhook.NewStore(b.pool, false)
	for _, u := range []string{"http://127.0.0.1:8080/h", "https://10.0.0.7/h", "http://[::1]/h", "http://169.254.169.254/latest",
		"http://100.100.100.200/latest", "http://[64:ff9b::a9fe:a9fe]/latest", "https://240.0.0.1/h", "https://[2001:db8::1]/h"} {
		_, _, err := guarded.CreateEndpoint(b.ctx, webhook.EndpointRequest{URL: u, EventTypes: []string{webhook.EventThreshold}})
		require.ErrorIs(t, err, webhook.ErrForbiddenTarget, u)
	}
	rc := newReceiver(t, ok)
	port := rc.srv.URL[strings.LastIndex(rc.srv.URL, ":")+1:]
	e, _, err := guarded.CreateEndpoint(b.ctx, webhook.EndpointRequest{URL: "http://localhost:" + port + "/h", EventTypes: []string{webhook.EventThreshold}})
	require.NoError(t, err, "a name is checked when connecting")
	b.run(t, webhook.DelivererOptions{Poll: 10 * time.Millisecond, BackoffBase: time.Hour})

	id, _ := b.alert(t, []string{"acme"}, time.Now())
	var d webhook.Delivery
	eventually(t, b.ctx, func() bool { d = b.delivery(t, e.ID, id); return d.Attempts == 1 }, "no attempt logged")
	require.Equal(t, webhook.StatusPending, d.Status, "retried later, like any failed attempt")
	require.Nil(t, d.LastStatus)
	require.Contains(t, d.LastError, webhook.ErrForbiddenTarget.Error())
	require.Contains(t, d.LastError, "is not a public address")
	require.Len(t, d.Log, 1)
	require.Contains(t, d.Log[0].Error, webhook.ErrForbiddenTarget.Error())
	require.Empty(t, rc.requests(), "nothing reached the receiver")
}

// An endpoint that fails DisableAfter attempts in a row is disabled with a reason; its
// pending deliveries stay pending and are not claimed; enabling it again resets the run and
// delivers them.
func TestDisabledAfterFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	status := http.StatusBadGateway
	rc := newReceiver(t, func(int, *http.Request) int { mu.Lock(); defer mu.Unlock(); return status })
	e, secret := b.endpoint(t, rc.srv.URL, "")
	rc.setSecret(secret)
	opts := webhook.DelivererOptions{AllowPrivate: true, Poll: 10 * time.Millisecond, DisableAfter: 3, Concurrency: 1,
		BackoffBase: time.Millisecond, BackoffCap: 5 * time.Millisecond}
	b.run(t, opts)
	a1, _ := b.alert(t, []string{"acme"}, time.Now())
	a2, _ := b.alert(t, []string{"acme"}, time.Now())

	eventually(t, b.ctx, func() bool {
		got, err := b.store.Endpoint(b.ctx, e.ID)
		require.NoError(t, err)
		e = got
		return !e.Enabled
	}, "the endpoint was never disabled")
	require.Equal(t, 3, e.ConsecutiveFailures)
	require.Contains(t, e.DisabledReason, "3 consecutive failed attempts")
	require.Contains(t, e.DisabledReason, "HTTP 502")
	var attempts int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM webhook_attempts`).Scan(&attempts))
	require.Equal(t, 3, attempts)
	for _, a := range []string{a1, a2} {
		require.Equal(t, webhook.StatusPending, b.delivery(t, e.ID, a).Status)
	}
	// Due now, and still nobody takes them.
	_, err := b.pool.Exec(b.ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 minute'`)
	require.NoError(t, err)
	n, err := webhook.NewDeliverer(b.pool, opts).Claim(b.ctx, 10)
	require.NoError(t, err)
	require.Zero(t, n, "a disabled endpoint's deliveries are not attempted")

	mu.Lock()
	status = http.StatusOK
	mu.Unlock()
	enabled := true
	e, err = b.store.UpdateEndpoint(b.ctx, e.ID, webhook.EndpointRequest{URL: e.URL, EventTypes: e.EventTypes, Enabled: &enabled})
	require.NoError(t, err)
	require.True(t, e.Enabled)
	require.Zero(t, e.ConsecutiveFailures)
	require.Empty(t, e.DisabledReason)
	for _, a := range []string{a1, a2} {
		b.waitStatus(t, e.ID, a, webhook.StatusDelivered)
	}
	require.Equal(t, map[string]int{a1: 1, a2: 1}, rc.accepted())
}

// A delivered delivery replayed is sent again with the same webhook-id, its attempts
// appended to its log; a replayed range queues the alerts of that time the endpoint
// matches, those from before the endpoint existed included, and no others.
func TestReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, ok)
	t0 := time.Date(2026, 11, 3, 12, 0, 0, 0, time.UTC)
	before, _ := b.alert(t, []string{"acme", "team-a"}, t0.Add(-time.Hour)) // before the endpoint
	other, _ := b.alert(t, []string{"globex"}, t0.Add(-time.Hour))          // another account
	outside, _ := b.alert(t, []string{"acme"}, t0.Add(-3*time.Hour))        // outside the range
	e, secret := b.endpoint(t, rc.srv.URL, "acme")
	rc.setSecret(secret)
	b.run(t, webhook.DelivererOptions{AllowPrivate: true, Poll: 10 * time.Millisecond})

	id, _ := b.alert(t, []string{"acme", "team-a"}, t0)
	d := b.waitStatus(t, e.ID, id, webhook.StatusDelivered)
	d, err := b.store.Replay(b.ctx, e.ID, d.ID)
	require.NoError(t, err)
	require.Equal(t, webhook.StatusPending, d.Status)
	eventually(t, b.ctx, func() bool { return rc.accepted()[id] == 2 }, "the replay never arrived")
	d = b.waitStatus(t, e.ID, id, webhook.StatusDelivered)
	require.Equal(t, 2, d.Attempts)
	require.Len(t, d.Log, 2)
	for _, r := range rc.requests() {
		require.Equal(t, id, r.header.Get(webhook.HeaderID))
	}
	_, err = b.store.Replay(b.ctx, e.ID, d.ID+1000)
	require.ErrorIs(t, err, webhook.ErrNotFound)

	n, err := b.store.ReplayRange(b.ctx, e.ID, t0.Add(-2*time.Hour), t0.Add(time.Second))
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the alert from before the endpoint and the one delivered")
	b.waitStatus(t, e.ID, before, webhook.StatusDelivered)
	eventually(t, b.ctx, func() bool { return rc.accepted()[id] == 3 }, "the range's replay never arrived")
	for _, a := range []string{other, outside} {
		var count int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM webhook_deliveries WHERE alert = $1`, a).Scan(&count))
		require.Zero(t, count, a)
	}
	_, err = b.store.ReplayRange(b.ctx, e.ID, t0, t0)
	var inv *webhook.InvalidError
	require.ErrorAs(t, err, &inv)
	_, err = b.store.ReplayRange(b.ctx, "wh_00000000000000000000000000000000", t0, t0.Add(time.Hour))
	require.ErrorIs(t, err, webhook.ErrNotFound)
}

// The trigger queues a delivery, in the meter's transaction, for every enabled endpoint
// whose account filter is on the alert's path, and none for a duplicate insert or a
// rolled-back one.
func TestTriggerQueuesMatchingEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	all, _ := b.endpoint(t, "https://example.com/all", "")
	org, _ := b.endpoint(t, "https://example.com/org", "acme")
	team, _ := b.endpoint(t, "https://example.com/team", "team-a")
	otherTeam, _ := b.endpoint(t, "https://example.com/other-team", "team-b")
	otherOrg, _ := b.endpoint(t, "https://example.com/other", "globex")
	off := false
	disabled, _, err := b.store.CreateEndpoint(b.ctx, webhook.EndpointRequest{URL: "https://example.com/off",
		EventTypes: []string{webhook.EventThreshold}, Enabled: &off})
	require.NoError(t, err)

	queued := func(alert string) []string {
		rows, err := b.pool.Query(b.ctx, `SELECT endpoint FROM webhook_deliveries WHERE alert = $1 AND status = 'pending' ORDER BY endpoint`, alert)
		require.NoError(t, err)
		var out []string
		for rows.Next() {
			var e string
			require.NoError(t, rows.Scan(&e))
			out = append(out, e)
		}
		require.NoError(t, rows.Err())
		return out
	}
	id, payload := b.alert(t, []string{"acme", "team-a", "user-1"}, time.Now())
	want := []string{all.ID, org.ID, team.ID}
	require.ElementsMatch(t, want, queued(id))
	b.insertAlert(t, id, []string{"acme", "team-a", "user-1"}, time.Now(), payload) // redelivered
	require.ElementsMatch(t, want, queued(id), "a duplicate insert queues nothing more")
	for _, e := range []string{otherTeam.ID, otherOrg.ID, disabled.ID} {
		require.NotContains(t, queued(id), e)
	}

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `INSERT INTO usage_alerts (id, event_time, org, account, path, unit, kind, threshold,
		at_units, value, period, triggered_by, admitted, payload)
		VALUES ('alert/rolled-back', now(), 'acme', 'acme', '{acme}', 'requests', 'quota_percent', 50, 1, 1, '2026-11', 'e', true, '{}')`)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(b.ctx))
	var count int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM webhook_deliveries WHERE alert = 'alert/rolled-back'`).Scan(&count))
	require.Zero(t, count)
}

// With DisableOnGone, an endpoint that answers 410 Gone is disabled at its first such
// attempt; without it, a 410 is a failed attempt like any other.
func TestGoneDisables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, func(int, *http.Request) int { return http.StatusGone })
	e, secret := b.endpoint(t, rc.srv.URL, "")
	rc.setSecret(secret)
	b.run(t, webhook.DelivererOptions{AllowPrivate: true, Poll: 10 * time.Millisecond, DisableOnGone: true, BackoffBase: time.Hour})
	id, _ := b.alert(t, []string{"acme"}, time.Now())
	eventually(t, b.ctx, func() bool {
		got, err := b.store.Endpoint(b.ctx, e.ID)
		require.NoError(t, err)
		e = got
		return !e.Enabled
	}, "a 410 never disabled the endpoint")
	require.Equal(t, "the endpoint answered 410 Gone", e.DisabledReason)
	d := b.delivery(t, e.ID, id)
	require.Equal(t, 1, d.Attempts)
	require.Equal(t, webhook.StatusPending, d.Status)
}
