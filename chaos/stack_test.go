package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/topic"
)

const (
	serviceToken = "svc-chaos-0123456789abcdef"
	adminToken   = "adm-chaos-0123456789abcdef"
)

// options say which services a stack uses; empty fields take the shared ones (make up).
type options struct {
	RedisURL    string   // a private Redis (its own process) for scenarios that restart it
	DatabaseURL string   // a private PostgreSQL server's URL, for the same reason
	Brokers     []string // a private broker (private.StartBroker)
	Partitions  int      // of the stack's topic (4 when zero)
	Replication int      // of the stack's topic on Brokers (1 when zero)
	Admits      int      // admit nodes (1 when zero), each with its relay
	Meters      int      // meter replicas of one consumer group (1 when zero)
	// RedisEnv are settings ("K=V") of every binary that replace the Redis ones, such as a
	// Sentinel setup's (failover.Sentinel.Env).
	RedisEnv []string
	// AdmitEnv and MeterEnv are extra settings ("K=V") of every admit and meter.
	AdmitEnv, MeterEnv []string
}

// stack is the pipeline of one scenario: admit nodes (relay inside) and meters of its own
// on its own schema, topic and Redis key prefix.
type stack struct {
	t       *testing.T
	db      *pgxpool.Pool // the stack's schema
	env     []string      // what every binary gets: the services, the schema, the key prefix
	brokers []string
	topic   string
	prefix  string // of the stack's Redis keys (ADMIT_KEY_PREFIX)
	admits  []*node
	meters  []*node
	// warm holds the requests of 0 units that waited for a new key to reach every node,
	// by event id: they are rows too, outside the scenarios' counts.
	warm map[string]sentRequest
	// accounts and keys are what account made: each account's kind and parent, and each
	// API key's id and account, by the key. A row's org, path and key id come from them.
	accounts map[string]accountNode
	keys     map[string]apiKey
}

// accountNode is an account a stack made.
type accountNode struct{ kind, parent string }

// apiKey is an API key a stack made: its id and its account.
type apiKey struct{ id, account string }

// node is one process of a stack, restartable on the same address.
type node struct {
	t    *testing.T
	name string // binary
	env  []string
	args []string
	addr string
	p    *testenv.Process
}

// URL is the node's base URL.
func (n *node) URL() string { return "http://" + n.addr }

// Start starts the process (again) and waits until /healthz answers; for the test's
// goroutine (a load's Progress hook uses start).
func (n *node) Start() {
	n.t.Helper()
	require.NoError(n.t, n.start())
}

func (n *node) start() error {
	n.p = testenv.Start(n.t, filepath.Join(bin, n.name), n.env, n.args...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := testenv.WaitHTTP(ctx, n.URL()+"/healthz", 200); err != nil {
		return fmt.Errorf("%s %s up: %w\n%s", n.name, n.addr, err, n.p.Output())
	}
	return nil
}

// Kill kills the process with SIGKILL and waits for it to be gone; for the test's
// goroutine (a load's Progress hook uses kill).
func (n *node) Kill() {
	n.t.Helper()
	require.NoError(n.t, n.kill())
}

func (n *node) kill() error {
	if err := n.p.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s: %w", n.name, err)
	}
	if _, err := n.p.Wait(30 * time.Second); err != nil {
		return fmt.Errorf("wait for %s to die: %w", n.name, err)
	}
	return nil
}

// Output is what the current process wrote.
func (n *node) Output() string { return n.p.Output() }

func newStack(t *testing.T, o options) *stack {
	t.Helper()
	ctx := testenv.Context(t, 3*time.Minute)
	var (
		db     *pgxpool.Pool
		schema string
		dbURL  string
	)
	if o.DatabaseURL == "" {
		db, schema = testenv.EmptySchema(t)
		dbURL = testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema)
	} else {
		var err error
		dbURL = o.DatabaseURL
		db, err = pgxpool.New(ctx, dbURL)
		require.NoError(t, err)
		t.Cleanup(db.Close)
	}
	redisURL := o.RedisURL
	if redisURL == "" {
		redisURL = testenv.RedisURL(t)
	}
	s := &stack{t: t, db: db, brokers: o.Brokers, warm: map[string]sentRequest{},
		accounts: map[string]accountNode{}, keys: map[string]apiKey{}}
	if s.brokers == nil {
		s.brokers = testenv.KafkaBrokers(t)
		s.topic = testenv.Topic(t, max(o.Partitions, 4))
	} else {
		s.topic = "chaos." + testenv.Name(t)
		createTopic(t, s.brokers, s.topic, max(o.Partitions, 4), max(o.Replication, 1))
	}
	name := testenv.Name(t)
	s.prefix = "t:" + name + ":mg"
	s.env = []string{
		"DATABASE_URL=" + dbURL, "REDIS_URL=" + redisURL, "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=",
		"KAFKA_BROKERS=" + strings.Join(s.brokers, ","), "KAFKA_TOPIC=" + s.topic,
		"ADMIT_KEY_PREFIX=" + s.prefix, "LOG_LEVEL=warn",
	}
	s.env = append(s.env, o.RedisEnv...) // the last of a name is the one a process sees

	for i := range max(o.Meters, 1) {
		addr := testenv.FreeAddr(t)
		args := []string{}
		if i == 0 {
			args = append(args, "-migrate")
		}
		m := &node{t: t, name: "meter", addr: addr, args: args,
			env: append(append(append([]string{}, s.env...), "METER_ADDR="+addr, "METER_GROUP=g-"+name), o.MeterEnv...)}
		m.Start()
		if i == 0 { // the schema is there once the first meter answers /readyz
			_, err := testenv.WaitHTTP(ctx, m.URL()+"/readyz", 200)
			require.NoError(t, err, "meter ready:\n%s", m.Output())
		}
		s.meters = append(s.meters, m)
	}
	for i := range max(o.Admits, 1) {
		addr := testenv.FreeAddr(t)
		a := &node{t: t, name: "admit", addr: addr,
			env: append(append(append([]string{}, s.env...), "ADMIT_ADDR="+addr, fmt.Sprintf("ADMIT_NODE=chaos-%d", i),
				"ADMIT_SERVICE_TOKEN="+serviceToken, "ADMIT_ADMIN_TOKEN="+adminToken, "REDIS_TIMEOUT=2s"), o.AdmitEnv...)}
		a.Start()
		s.admits = append(s.admits, a)
	}
	return s
}

// admitURLs are the base URLs of the stack's admit nodes.
func (s *stack) admitURLs() []string {
	out := make([]string, len(s.admits))
	for i, a := range s.admits {
		out[i] = a.URL()
	}
	return out
}

// reconcile runs the reconcile binary once on the stack and returns its exit code and output.
func (s *stack) reconcile(extraEnv []string, args ...string) (int, string) {
	s.t.Helper()
	p := testenv.Start(s.t, filepath.Join(bin, "reconcile"), append(append([]string{}, s.env...), extraEnv...), args...)
	code, err := p.Wait(3 * time.Minute)
	require.NoError(s.t, err, "reconcile")
	return code, p.Output()
}

var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}, Timeout: 30 * time.Second}

// call sends a JSON request with a bearer token and returns the status and the decoded body.
func call(ctx context.Context, method, url, token string, body any) (int, map[string]any, error) {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	var out map[string]any
	_ = json.Unmarshal(raw, &out) // a non-JSON body leaves out nil
	return resp.StatusCode, out, nil
}

// account creates an account through admit's admin API (the first node) and returns an API
// key of it once every admit node admits with it. limits is the admin API's limits object.
func (s *stack) account(id, kind, parent, plan string, limits map[string]any) string {
	s.t.Helper()
	ctx := testenv.Context(s.t, time.Minute)
	body := map[string]any{"id": id, "kind": kind, "limits": limits}
	if parent != "" {
		body["parent"] = parent
	}
	if plan != "" {
		body["plan"] = plan
	}
	status, out, err := call(ctx, "POST", s.admits[0].URL()+"/v1/admin/accounts", adminToken, body)
	require.NoError(s.t, err)
	require.Equal(s.t, 201, status, "create %s: %v", id, out)
	status, out, err = call(ctx, "POST", s.admits[0].URL()+"/v1/admin/api-keys", adminToken, map[string]any{"account": id})
	require.NoError(s.t, err)
	require.Equal(s.t, 201, status, "api key of %s: %v", id, out)
	key := out["api_key"].(string)
	keyID, _ := out["id"].(string)
	s.accounts[id] = accountNode{kind: kind, parent: parent}
	s.keys[key] = apiKey{id: keyID, account: id}
	// Every node learns the key through LISTEN/NOTIFY (< 1 s): ask each with a request of 0
	// units until it admits (it charges nothing, and its event is a row like any other).
	warm := sentRequest{Key: key, Units: map[string]int64{"requests": 0}}
	for _, a := range s.admits {
		for {
			status, out, err := call(ctx, "POST", a.URL()+"/v1/admit", serviceToken, warm.body())
			require.NoError(s.t, err)
			if status == 200 {
				s.warm[out["event_id"].(string)] = warm
				break
			}
			require.NoError(s.t, ctx.Err(), "admit %s never learned %s (last status %d %v)", a.addr, id, status, out)
			time.Sleep(10 * time.Millisecond)
		}
	}
	return key
}

// loadSpec is a load of Requests admissions by Workers concurrent callers, spread over the
// stack's admit nodes (round robin) and over Keys.
type loadSpec struct {
	Requests int
	Workers  int
	Keys     []string
	// Units is every request's units. When nil each request has units and a tool of its
	// own (variedRequest), so that the books can tell its row from any other's and each
	// unit's column from the others.
	Units map[string]int64
	// Retry5xx retries a 5xx answer with the same idempotency key (as a client that must get
	// an answer does); otherwise a 5xx is the request's final answer. Network errors (a
	// killed node, a refused connection) and 503 policies_loading (a node that has just
	// started) are always retried, on the next node.
	Retry5xx bool
	// Progress, when set, is called (from one goroutine at a time) each time another
	// request got its final answer, with the number answered so far: the place to inject
	// faults at points of the load.
	Progress func(done int)
	// Deadline bounds the whole load (2 minutes when zero).
	Deadline time.Duration
}

// request is the i-th request of a load whose idempotency keys are made of run.
func (spec loadSpec) request(run string, i int) sentRequest {
	r := sentRequest{Key: spec.Keys[i%len(spec.Keys)], Idem: fmt.Sprintf("chaos-%s-%d", run, i), Units: spec.Units}
	if r.Units == nil {
		r.Units, r.Tool = variedRequest(i)
	}
	return r
}

// loadTools are the tools that varied requests name in turn ("": none).
var loadTools = []string{"", "llm_call", "web_search", "code_execute", "image_generate"}

// variedRequest is the units and tool of the i-th request of a load that sets no units:
// one request, and tokens, credits and cost_micros that differ from request to request and
// from each other.
func variedRequest(i int) (map[string]int64, string) {
	return map[string]int64{"requests": 1, "tokens": 1000 + int64(i), "credits": 2 + int64(i%97),
		"cost_micros": 100_000 + 3*int64(i)}, loadTools[i%len(loadTools)]
}

// sentRequest is what a caller sent to POST /v1/admit.
type sentRequest struct {
	Key   string // API key
	Idem  string // idempotency key ("" for none)
	Units map[string]int64
	Tool  string
}

// body is the request's JSON body.
func (r sentRequest) body() map[string]any {
	b := map[string]any{"api_key": r.Key, "units": r.Units}
	if r.Idem != "" {
		b["idempotency_key"] = r.Idem
	}
	if r.Tool != "" {
		b["tool"] = r.Tool
	}
	return b
}

// loadResult is what the callers saw.
type loadResult struct {
	Requests int
	// Admitted maps the idempotency key of each request answered 200 to its event id.
	Admitted map[string]string
	// Sent holds what was sent for each idempotency key of Admitted (when recorded by
	// record): what the request's row must hold.
	Sent map[string]sentRequest
	// Status counts the final answers by HTTP status.
	Status map[int]int
	// FiveXX counts every response >= 500 seen, retried ones included.
	FiveXX int
	// Mismatched counts retries of one idempotency key answered with another event id
	// (a request admitted twice).
	Mismatched int
}

// ids is the set of event ids admitted.
func (r *loadResult) ids() map[string]bool {
	out := make(map[string]bool, len(r.Admitted))
	for _, id := range r.Admitted {
		out[id] = true
	}
	return out
}

// load runs spec against the stack. Each request carries an idempotency key of its own, so
// a retry after a killed node or a lost answer can never be admitted twice.
func (s *stack) load(spec loadSpec) *loadResult {
	s.t.Helper()
	if spec.Deadline == 0 {
		spec.Deadline = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), spec.Deadline)
	defer cancel()
	run := testenv.Random(8)
	urls := s.admitURLs()
	res := &loadResult{Requests: spec.Requests, Admitted: map[string]string{}, Status: map[int]int{}}
	var (
		mu       sync.Mutex
		next     atomic.Int64
		done     int
		progress sync.Mutex
		errs     = make(chan error, spec.Workers)
		wg       sync.WaitGroup
	)
	for w := range spec.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= spec.Requests {
					return
				}
				req := spec.request(run, i)
				status, out, _, err := admitAnswered(ctx, urls, (w+i)%len(urls), req.body(), spec.Retry5xx, func() {
					mu.Lock()
					res.FiveXX++
					mu.Unlock()
				})
				if err != nil {
					errs <- fmt.Errorf("request %d: %w", i, err)
					return
				}
				mu.Lock()
				res.record(req, status, out)
				mu.Unlock()
				if spec.Progress != nil {
					progress.Lock()
					done++
					spec.Progress(done)
					progress.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(s.t, err)
	}
	return res
}

// admitAnswered sends one admission until it has a final answer, starting at node:
// network errors and 503 policies_loading (a node restarting) are retried on the next node
// with the same body (so the same idempotency key), and 5xx too when retry5xx. fiveXX is
// called for every 5xx seen. sent is when the answered attempt went out.
func admitAnswered(ctx context.Context, urls []string, node int, body map[string]any, retry5xx bool, fiveXX func()) (status int, out map[string]any, sent time.Time, err error) {
	for {
		sent = time.Now()
		status, out, err = call(ctx, "POST", urls[node]+"/v1/admit", serviceToken, body)
		if err == nil && status >= 500 {
			fiveXX()
		}
		if err == nil && (status < 500 || !retry5xx) && errorCode(out) != "policies_loading" {
			return status, out, sent, nil
		}
		if ctx.Err() != nil {
			return 0, nil, sent, fmt.Errorf("no answer before the load's deadline (last: status %d, %v)", status, err)
		}
		node = (node + 1) % len(urls)
		time.Sleep(20 * time.Millisecond) // back off while the node restarts
	}
}

// record counts one final answer to the admission req.
func (r *loadResult) record(req sentRequest, status int, out map[string]any) {
	r.Status[status]++
	if status == 200 {
		id, _ := out["event_id"].(string)
		if prev, ok := r.Admitted[req.Idem]; ok && prev != id {
			r.Mismatched++
		}
		r.Admitted[req.Idem] = id
		if r.Sent == nil {
			r.Sent = map[string]sentRequest{}
		}
		r.Sent[req.Idem] = req
	}
}

// requireExact fails unless the books hold rows rows, every admitted id exactly once, and
// each row what its caller sent: the org, account and path of its API key, its units and
// tool, under the event id and idempotency key the caller has.
func (b *books) requireExact(t *testing.T, rows int) {
	t.Helper()
	require.Zero(t, b.Lost, "lost")
	require.Zero(t, b.Duplicated, "duplicated")
	require.Equal(t, rows, b.Rows)
	require.Equal(t, b.Rows, b.Checked, "rows compared with the request their caller sent")
	require.Zero(t, b.Wrong, "rows unlike the request their caller sent (sent → row):\n%s", strings.Join(b.WrongRows, "\n"))
}

// errorCode is the code of an error reply ("" for another body).
func errorCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

// books is what PostgreSQL holds for a set of admissions.
type books struct {
	Rows       int // usage_events rows of the stack, but for Voided
	Lost       int // admitted ids without a row, or whose row is voided (told 200, billed nothing)
	Duplicated int // rows beyond one per admitted request
	// Voided counts the rows of ids no caller was told 200 for that are voided
	// (usage_voids): decisions whose outcome admit could not tell (a 503, a caller gone),
	// which bill nothing. They are not duplicates.
	Voided int
	// Checked counts the rows (warm-up rows aside) compared with the request their caller
	// sent; Wrong those that differ from it, WrongRows the first few (sent → row).
	Checked, Wrong int
	WrongRows      []string
}

// bookRow is what a usage_events row says of a request: whom it is charged to, with
// which key, idempotency key and tool, and how much.
type bookRow struct {
	Org, Account, Kind string
	Path               []string
	APIKeyID, Idem     string
	Tool               string
	Units              [4]int64 // requests, tokens, credits, cost_micros
}

// rowOf is the row the stack's meter must write for an admitted request r.
func (s *stack) rowOf(r sentRequest) bookRow {
	k := s.keys[r.Key]
	var path []string
	for acc := k.account; acc != ""; acc = s.accounts[acc].parent {
		path = append([]string{acc}, path...)
	}
	units := [4]int64{1, r.Units["tokens"], r.Units["credits"], r.Units["cost_micros"]}
	if n, ok := r.Units["requests"]; ok {
		units[0] = n // admit charges one request unless the caller says otherwise
	}
	if len(path) == 0 { // a key the stack did not make: no row can match
		return bookRow{Account: "(unknown key)", Idem: r.Idem, Tool: r.Tool, Units: units}
	}
	return bookRow{Org: path[0], Account: k.account, Kind: s.accounts[k.account].kind, Path: path,
		APIKeyID: k.id, Idem: r.Idem, Tool: r.Tool, Units: units}
}

// idRow is a row of the books under its event id.
type idRow struct {
	id string
	bookRow
}

// bookRows runs query, which selects an event id and a bookRow's fields in their order.
func (s *stack) bookRows(ctx context.Context, query string, args ...any) []idRow {
	s.t.Helper()
	rows, err := s.db.Query(ctx, query, args...)
	require.NoError(s.t, err)
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (idRow, error) {
		var x idRow
		return x, r.Scan(&x.id, &x.Idem, &x.Org, &x.Account, &x.Kind, &x.Path, &x.APIKeyID, &x.Tool,
			&x.Units[0], &x.Units[1], &x.Units[2], &x.Units[3])
	})
	require.NoError(s.t, err)
	return all
}

// waitBooks waits (up to within) until every id admitted in the loads has its row, then
// counts the stack's rows: each must be an id some caller was given, once. Pass every load
// the stack ran.
func (s *stack) waitBooks(within time.Duration, loads ...*loadResult) books {
	s.t.Helper()
	ctx := testenv.Context(s.t, within+time.Minute)
	want := map[string]bool{}
	sent := map[string]sentRequest{} // by event id
	for id, r := range s.warm {
		want[id] = true
		sent[id] = r
	}
	mismatched := 0
	for _, res := range loads {
		for idem, id := range res.Admitted {
			want[id] = true
			if r, ok := res.Sent[idem]; ok {
				sent[id] = r
			}
		}
		mismatched += res.Mismatched
	}
	ids := make([]string, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	deadline := time.Now().Add(within)
	var present int
	for {
		require.NoError(s.t, s.db.QueryRow(ctx, `select count(distinct event_id) from usage_events where event_id = any($1)`, ids).Scan(&present))
		if present == len(ids) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var b books
	all := s.bookRows(ctx, `select event_id, coalesce(idempotency_key, ''), org, account, account_kind, path,
	coalesce(api_key_id, ''), coalesce(tool, ''), requests, tokens, credits, cost_micros from usage_events`)
	seen := map[string]int{}
	for _, r := range all {
		seen[r.id]++
		req, ok := sent[r.id]
		if !ok {
			continue // an id no caller was given (a duplicate), or one whose request was not recorded
		}
		if _, warm := s.warm[r.id]; !warm {
			b.Checked++
		}
		if want := s.rowOf(req); !reflect.DeepEqual(want, r.bookRow) {
			b.Wrong++
			if len(b.WrongRows) < 10 {
				b.WrongRows = append(b.WrongRows, fmt.Sprintf("%s: %+v → %+v", r.id, want, r.bookRow))
			}
		}
	}
	rows, err := s.db.Query(ctx, `select distinct event_id from usage_voids`)
	require.NoError(s.t, err)
	voidedIDs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(s.t, err)
	voided := map[string]bool{}
	for _, id := range voidedIDs {
		voided[id] = true
	}
	b.Rows = len(all)
	b.Lost = len(ids) - present
	for id := range s.warm {
		b.Rows -= seen[id] // the warm-up rows are not the scenario's
		b.Duplicated += max(seen[id]-1, 0)
		delete(seen, id)
	}
	for id, n := range seen {
		switch {
		case want[id] && voided[id]:
			b.Lost++ // told 200, and voided: billed nothing
			b.Duplicated += n - 1
		case want[id]:
			b.Duplicated += n - 1
		case voided[id]:
			b.Voided += n // an outcome nobody was told, voided: bills nothing
			b.Rows -= n
		default:
			b.Duplicated += n // a row for an id no caller was given: counted, never admitted
		}
	}
	b.Duplicated += mismatched
	return b
}

// fill copies what the callers saw in the loads and what the books hold into the row.
func (sc *scenario) fill(b books, loads ...*loadResult) {
	for _, res := range loads {
		sc.Requests += res.Requests
		sc.Admitted += len(res.Admitted)
		sc.FiveXX += res.FiveXX
	}
	sc.Rows += b.Rows
	sc.Lost += b.Lost
	sc.Duplicated += b.Duplicated
}

// createTopic creates a topic on a private broker or the Kafka cluster (the shared broker's
// topics come from testenv.Topic); it retries while the broker is still electing its
// controller. A topic of several replicas is on the shared cluster: it is deleted when the
// test ends.
func createTopic(t *testing.T, brokers []string, name string, partitions, replication int) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	err := topic.EnsureRetry(ctx, slog.New(slog.DiscardHandler), brokers, topic.Spec{Name: name, Partitions: partitions, ReplicationFactor: replication})
	require.NoError(t, err, "create topic %s", name)
	if replication > 1 {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := topic.Delete(ctx, brokers, name); err != nil {
				t.Errorf("delete topic %s: %v", name, err)
			}
		})
	}
}
