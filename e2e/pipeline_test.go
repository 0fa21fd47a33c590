// Package e2e tests the pipeline end to end with the real binaries: admissions through
// admit's HTTP API, its relay to Kafka, the meter's rows in PostgreSQL.
package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
	"github.com/metergate/metergate/internal/topic"
)

// bin holds the admit and meter binaries built for this run.
var bin string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithBinaries(m, &bin, "../cmd/admit", "../cmd/meter", "../cmd/reconcile"))
}

const (
	serviceToken = "svc-e2e-0123456789abcdef"
	adminToken   = "adm-e2e-0123456789abcdef"
)

// start starts one of this run's binaries (see testenv.Start).
func start(t *testing.T, name string, env []string, args ...string) *testenv.Process {
	t.Helper()
	return testenv.Start(t, filepath.Join(bin, name), env, args...)
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}

func call(method, url, token string, body any) (int, map[string]any, error) {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	_ = json.Unmarshal(raw, &out) // a non-JSON body leaves out nil
	return resp.StatusCode, out, nil
}

// stack is one admit and one meter on this test's schema, topic and Redis keys, with an
// org (enterprise plan) and an API key of it.
type stack struct {
	admit, meter string // base URLs
	db           *pgxpool.Pool
	org, key     string
	topic        string
	brokers      []string
	env          []string // the services' environment, for more binaries
	// warmup holds the rows of admissions made while waiting for a key to reach admit's
	// cache, by event id: they are rows too.
	warmup map[string]row
	// accounts holds the kind and the parent of each account made, and keys the id and
	// the account of each API key made: what a row's account, path and key id come from.
	accounts map[string][2]string
	keys     map[string][2]string
}

// row is what a usage_events row says of an admitted request: whom it is charged to, with
// which API key (id), idempotency key and tool, and how much.
type row struct {
	Org, Account, Kind string
	Path               []string
	APIKeyID, Idem     string
	Tool               string
	Units              [4]int64 // requests, tokens, credits, cost_micros
}

// sent is the row of a request sent with key (or for account, when key is ""): what the
// caller sent, with the units admit fills in when they are left out (one request).
func (s *stack) sent(key, account, idem, tool string, units map[string]int64) row {
	keyID := ""
	if key != "" {
		keyID, account = s.keys[key][0], s.keys[key][1]
	}
	var path []string
	for acc := account; acc != ""; acc = s.accounts[acc][1] {
		path = append([]string{acc}, path...)
	}
	r := row{Account: account, Kind: s.accounts[account][0], Path: path, APIKeyID: keyID, Idem: idem, Tool: tool,
		Units: [4]int64{1, units["tokens"], units["credits"], units["cost_micros"]}}
	if n, ok := units["requests"]; ok {
		r.Units[0] = n
	}
	if len(path) > 0 {
		r.Org = path[0]
	}
	return r
}

// body is the JSON body of POST /v1/admit for a request sent with key.
func body(key, idem, tool string, units map[string]int64) map[string]any {
	b := map[string]any{"api_key": key, "units": units}
	if idem != "" {
		b["idempotency_key"] = idem
	}
	if tool != "" {
		b["tool"] = tool
	}
	return b
}

// tools are the tools varied requests name in turn ("": none).
var tools = []string{"", "llm_call", "web_search", "code_execute", "image_generate"}

// varied is the i-th of a series of requests whose units and tool differ from request to
// request, and whose units differ from each other: a row that holds another request's
// units, or one unit's amount in another's column, is told apart.
func varied(i int) (map[string]int64, string) {
	return map[string]int64{"requests": 1, "tokens": 1000 + int64(i), "credits": 2 + int64(i%97),
		"cost_micros": 100_000 + 3*int64(i)}, tools[i%len(tools)]
}

// account creates an account through the admin API (parent "" for an org).
func (s *stack) account(t *testing.T, id, kind, parent, plan string, limits map[string]any) {
	t.Helper()
	b := map[string]any{"id": id, "kind": kind, "limits": limits}
	if parent != "" {
		b["parent"] = parent
	}
	if plan != "" {
		b["plan"] = plan
	}
	status, out, err := call("POST", s.admit+"/v1/admin/accounts", adminToken, b)
	require.NoError(t, err)
	require.Equal(t, 201, status, "%v", out)
	s.accounts[id] = [2]string{kind, parent}
}

// apiKey makes an API key of account and returns it once admit admits with it (requests of
// 0 units, whose rows are expected in warmup).
func (s *stack) apiKey(t *testing.T, ctx context.Context, account string) string {
	t.Helper()
	status, out, err := call("POST", s.admit+"/v1/admin/api-keys", adminToken, map[string]any{"account": account})
	require.NoError(t, err)
	require.Equal(t, 201, status, "%v", out)
	key := out["api_key"].(string)
	s.keys[key] = [2]string{out["id"].(string), account}
	zero := map[string]int64{"requests": 0}
	for { // the key reaches admit's cache through LISTEN/NOTIFY (< 1 s)
		status, out, err := call("POST", s.admit+"/v1/admit", serviceToken, body(key, "", "", zero))
		require.NoError(t, err)
		if status == 200 {
			s.warmup[out["event_id"].(string)] = s.sent(key, "", "", "", zero)
			return key
		}
		require.NoError(t, ctx.Err(), "admit never learned the key of %s", account)
		time.Sleep(10 * time.Millisecond)
	}
}

func newStack(t *testing.T, partitions int, env ...string) *stack {
	t.Helper()
	return newStackOn(t, testenv.KafkaBrokers(t), testenv.Topic(t, partitions), env...)
}

// newStackOn is newStack on the given brokers and (existing) topic; env is more of the
// services' environment.
func newStackOn(t *testing.T, brokers []string, topic string, env ...string) *stack {
	t.Helper()
	ctx := testenv.Context(t, 3*time.Minute)
	db, schema := testenv.EmptySchema(t)
	name := testenv.Name(t)
	common := append(testenv.AdmitTokens()[:0:0],
		"DATABASE_URL="+testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
		"REDIS_URL="+testenv.RedisURL(t), "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=",
		"KAFKA_BROKERS="+strings.Join(brokers, ","), "KAFKA_TOPIC="+topic,
		"LOG_LEVEL=warn", "REDIS_TIMEOUT=5s")
	common = append(common, env...)
	s := &stack{db: db, org: strings.ReplaceAll(name, "_", "-"), topic: topic, brokers: brokers,
		env:    append(common[:len(common):len(common)], "ADMIT_KEY_PREFIX=t:"+name+":mg"),
		warmup: map[string]row{}, accounts: map[string][2]string{}, keys: map[string][2]string{}}

	meterAddr := testenv.FreeAddr(t)
	start(t, "meter", append(common, "METER_ADDR="+meterAddr, "METER_GROUP=g-"+name), "-migrate")
	s.meter = "http://" + meterAddr
	_, err := testenv.WaitHTTP(ctx, s.meter+"/readyz", 200)
	require.NoError(t, err, "meter ready")

	admitAddr := testenv.FreeAddr(t)
	start(t, "admit", append(common, "ADMIT_ADDR="+admitAddr, "ADMIT_NODE=e2e", "ADMIT_KEY_PREFIX=t:"+name+":mg", "METER_GROUP=g-"+name,
		"ADMIT_SERVICE_TOKEN="+serviceToken, "ADMIT_ADMIN_TOKEN="+adminToken))
	s.admit = "http://" + admitAddr
	_, err = testenv.WaitHTTP(ctx, s.admit+"/readyz", 200)
	require.NoError(t, err, "admit ready")

	s.account(t, s.org, "org", "", "enterprise", map[string]any{"requests": map[string]any{"rate_per_s": 100000, "burst": 100000}})
	s.key = s.apiKey(t, ctx, s.org)
	return s
}

// offsets returns the end offset of every partition of the topic: how many messages it got.
func (s *stack) offsets(t *testing.T) map[int]int64 {
	t.Helper()
	conn, err := kafka.DialLeader(context.Background(), "tcp", s.brokers[0], s.topic, 0)
	if err != nil {
		return nil
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions(s.topic)
	if err != nil {
		return nil
	}
	out := map[int]int64{}
	for _, p := range parts {
		c, err := kafka.DialLeader(context.Background(), "tcp", s.brokers[0], s.topic, p.ID)
		if err != nil {
			continue
		}
		last, _ := c.ReadLastOffset()
		out[p.ID] = last
		_ = c.Close()
	}
	return out
}

// whereMissing reads the topic back and says where the events without a row are.
func (s *stack) whereMissing(t *testing.T, want map[string]row) string {
	t.Helper()
	rows := map[string]bool{}
	for _, id := range s.eventIDs(t, context.Background()) {
		rows[id] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: s.brokers, Topic: s.topic, GroupID: "diag-" + testenv.Name(t),
		StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	inKafka := map[string][]int64{}
	total := 0
	for total < 10_001 {
		msg, err := r.ReadMessage(ctx)
		if err != nil {
			break
		}
		total++
		var ev struct{ ID string }
		_ = json.Unmarshal(msg.Value, &ev)
		inKafka[ev.ID] = append(inKafka[ev.ID], msg.Offset)
	}
	var missing []string
	for id := range want {
		if !rows[id] {
			missing = append(missing, fmt.Sprintf("%s@%v", id[:8], inKafka[id]))
		}
	}
	dupes := 0
	for _, o := range inKafka {
		dupes += len(o) - 1
	}
	return fmt.Sprintf("kafka: %d messages, %d distinct, %d duplicates; missing (offsets in kafka): %v", total, len(inKafka), dupes, missing)
}

// meterMetrics returns the meter's metergate_* metrics.
func (s *stack) meterMetrics(t *testing.T) string {
	t.Helper()
	resp, err := client.Get(s.meter + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "metergate_") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// waitRows waits until the org has exactly the rows of want (by event id), and fails saying
// where the missing events are if that takes longer than within; then every row must hold
// what want says its caller sent.
func (s *stack) waitRows(t *testing.T, want map[string]row, within time.Duration) {
	t.Helper()
	ctx := testenv.Context(t, within+time.Minute)
	deadline := time.Now().Add(within)
	var rows int
	for {
		require.NoError(t, s.db.QueryRow(ctx, `SELECT count(*) FROM usage_events WHERE org = $1`, s.org).Scan(&rows))
		if rows >= len(want) {
			break
		}
		if time.Now().After(deadline) {
			var dead int
			var sample string
			_ = s.db.QueryRow(ctx, `SELECT count(*), coalesce(min(error), '') FROM dead_letters`).Scan(&dead, &sample)
			t.Fatalf("%d of %d rows after %s; %d dead letters (%s); kafka offsets %v; %s; meter metrics:\n%s",
				rows, len(want), within, dead, sample, s.offsets(t), s.whereMissing(t, want), s.meterMetrics(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := s.rows(t, ctx)
	require.Len(t, got, len(want), "exactly one row per admission")
	var wrong []string
	for id, r := range got {
		w, ok := want[id]
		require.True(t, ok, "row for an event nobody was given: %s", id)
		if !reflect.DeepEqual(w, r) {
			wrong = append(wrong, fmt.Sprintf("%s: %+v → %+v", id, w, r))
		}
	}
	sort.Strings(wrong)
	require.Zero(t, len(wrong), "rows unlike the request their caller sent (sent → row), e.g.:\n%s",
		strings.Join(wrong[:min(len(wrong), 10)], "\n"))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// reconcile runs the reconcile binary once on the stack's schema and keys.
func (s *stack) reconcile(t *testing.T, args ...string) (int, string) {
	t.Helper()
	p := start(t, "reconcile", s.env, args...)
	code, err := p.Wait(2 * time.Minute)
	require.NoError(t, err, "reconcile")
	return code, p.Output()
}

// rows returns the org's rows by event id (a duplicate fails the test).
func (s *stack) rows(t *testing.T, ctx context.Context) map[string]row {
	t.Helper()
	rows, err := s.db.Query(ctx, `SELECT event_id, org, account, account_kind, path, coalesce(api_key_id, ''),
	coalesce(idempotency_key, ''), coalesce(tool, ''), requests, tokens, credits, cost_micros
	FROM usage_events WHERE org = $1`, s.org)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]row{}
	for rows.Next() {
		var (
			id string
			r  row
		)
		require.NoError(t, rows.Scan(&id, &r.Org, &r.Account, &r.Kind, &r.Path, &r.APIKeyID, &r.Idem, &r.Tool,
			&r.Units[0], &r.Units[1], &r.Units[2], &r.Units[3]))
		_, dup := out[id]
		require.False(t, dup, "two rows of event %s", id)
		out[id] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// eventIDs returns the event ids of the org's rows.
func (s *stack) eventIDs(t *testing.T, ctx context.Context) []string {
	t.Helper()
	rows, err := s.db.Query(ctx, `SELECT event_id FROM usage_events WHERE org = $1`, s.org)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

// 10,000 admissions through the HTTP API become exactly 10,000 rows in usage_events with
// the event ids the callers got, each holding what its caller sent (the org's key and an
// agent's, under a team; units and a tool of its own; an idempotency key), within a bounded
// time; the log line gives the sustained rate and the admit-to-row latency.
func TestTenThousandAdmissionsBecomeRows(t *testing.T) {
	t.Parallel()
	s := newStack(t, 12)
	const n, clients = 10_000, 32
	ctx := testenv.Context(t, 5*time.Minute)
	team, agent := s.org+"-team", s.org+"-agent"
	s.account(t, team, "team", s.org, "", map[string]any{})
	s.account(t, agent, "agent", team, "", map[string]any{})
	keys := []string{s.key, s.apiKey(t, ctx, agent)}

	type admission struct {
		id   string
		sent row
	}
	admitted := make(chan admission, n)
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	begin := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < n; i += clients {
				key, idem := keys[i%len(keys)], fmt.Sprintf("e2e-%d", i)
				units, tool := varied(i)
				status, out, err := call("POST", s.admit+"/v1/admit", serviceToken, body(key, idem, tool, units))
				if err != nil || status != 200 {
					errs <- fmt.Errorf("admission %d: %d %v %v", i, status, out, err)
					return
				}
				admitted <- admission{out["event_id"].(string), s.sent(key, "", idem, tool, units)}
			}
		}()
	}
	wg.Wait()
	took := time.Since(begin)
	close(admitted)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	want := map[string]row{}
	for a := range admitted {
		want[a.id] = a.sent
	}
	require.Len(t, want, n, "every admission got its own event id")
	for id, r := range s.warmup {
		want[id] = r
	}

	// Every event reaches its row within a bound.
	s.waitRows(t, want, 2*time.Minute)
	landed := time.Since(begin)

	var p50, p99 float64
	require.NoError(t, s.db.QueryRow(ctx, `SELECT
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM ingest_time - event_time)),
		percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM ingest_time - event_time))
		FROM usage_events WHERE org = $1`, s.org).Scan(&p50, &p99))
	t.Logf("%d admissions by %d clients in %s (%.0f/s); all rows in %s (%.0f/s end to end); admit-to-row p50 %.0f ms, p99 %.0f ms",
		n, clients, took.Round(time.Millisecond), n/took.Seconds(), landed.Round(time.Millisecond),
		n/landed.Seconds(), p50*1000, p99*1000)
}

// The broker stopped for 20 s while admissions go on, then started: admissions keep
// succeeding, and every event arrives in PostgreSQL once, as its caller sent it.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	broker := private.StartBroker(t)
	brokers := []string{broker.Addr()}
	ctx := testenv.Context(t, 5*time.Minute)
	require.NoError(t, topic.Ensure(ctx, brokers, topic.Spec{Name: "usage", Partitions: 4, ReplicationFactor: 1}))
	s := newStackOn(t, brokers, "usage")

	want := map[string]row{}
	for id, r := range s.warmup {
		want[id] = r
	}
	admit := func(n int) {
		for range n {
			units, tool := varied(len(want))
			status, out, err := call("POST", s.admit+"/v1/admit", serviceToken, body(s.key, "", tool, units))
			require.NoError(t, err)
			require.Equal(t, 200, status, "admissions go on: %v", out)
			want[out["event_id"].(string)] = s.sent(s.key, "", "", tool, units)
		}
	}
	admit(200)
	broker.Stop()
	stopped := time.Now()
	for time.Since(stopped) < 20*time.Second { // the outage lasts 20 s by the clock
		admit(20)
		time.Sleep(100 * time.Millisecond)
	}
	broker.Start()
	admit(200)
	s.waitRows(t, want, 2*time.Minute)
	t.Logf("%d events through a 20 s broker outage, each in PostgreSQL once", len(want))
}

// A 5xx refund through the whole pipeline: N requests admitted through the API, k of them
// report 503; once the meter has them all, reconcile gives the quota back, so GET
// /v1/usage drops by exactly k at every level with a quota; a second run applies nothing.
func TestRefundOf5xxThroughThePipeline(t *testing.T) {
	t.Parallel()
	s := newStack(t, 4)
	ctx := testenv.Context(t, 3*time.Minute)
	team, agent := s.org+"-team", s.org+"-agent"
	s.account(t, team, "team", s.org, "", map[string]any{"requests": map[string]any{"quota": 1000}})
	s.account(t, agent, "agent", team, "", map[string]any{"requests": map[string]any{"quota": 100}})
	const n, k = 20, 5
	want := map[string]row{}
	for id, r := range s.warmup {
		want[id] = r
	}
	var ids []string
	for len(ids) < n {
		status, body, err := call("POST", s.admit+"/v1/admit", serviceToken, map[string]any{"account": agent})
		require.NoError(t, err)
		if status == 401 { // the new accounts reach admit's cache within 1 s
			time.Sleep(10 * time.Millisecond)
			continue
		}
		require.Equal(t, 200, status, "%v", body)
		ids = append(ids, body["event_id"].(string))
		want[ids[len(ids)-1]] = s.sent("", agent, "", "", nil) // one request, no key
	}
	for _, id := range ids[:k] {
		status, body, err := call("POST", s.admit+"/v1/outcomes", serviceToken, map[string]any{"event_id": id, "status": 503})
		require.NoError(t, err)
		require.Equal(t, 202, status, "%v", body)
	}
	used := func(account string) float64 {
		status, body, err := call("GET", s.admit+"/v1/usage/"+account, serviceToken, nil)
		require.NoError(t, err)
		require.Equal(t, 200, status, "%v", body)
		return body["units"].(map[string]any)["requests"].(map[string]any)["used"].(float64)
	}
	require.Equal(t, float64(n), used(team))
	require.Equal(t, float64(n), used(agent))

	s.waitRows(t, want, 2*time.Minute)
	for { // the outcomes are metered too
		var outcomes int
		require.NoError(t, s.db.QueryRow(ctx, `SELECT count(*) FROM usage_outcomes WHERE status >= 500`).Scan(&outcomes))
		if outcomes == k {
			break
		}
		require.NoError(t, ctx.Err(), "%d of %d outcomes metered", outcomes, k)
		time.Sleep(50 * time.Millisecond)
	}

	code, out := s.reconcile(t, "-json")
	require.Equal(t, 0, code, out)
	t.Logf("reconcile: %s", lastLine(out))
	require.Equal(t, float64(n-k), used(team), "the team's quota got k back")
	require.Equal(t, float64(n-k), used(agent), "the agent's quota got k back")
	code, out = s.reconcile(t, "-json")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"adjustments_applied":0`, "a second run applies nothing")
	require.Equal(t, float64(n-k), used(agent))
	code, out = s.reconcile(t, "verify")
	require.Equal(t, 0, code, "counters equal the billable totals: %s", out)
}
