package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/outbox"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/staff"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/webhook"
	"github.com/metergate/metergate/migrations"
)

const (
	serviceToken = "svc-token-0123456789abcdef"
	adminToken   = "adm-token-0123456789abcdef"
)

// testBundle is a Server as cmd/admit wires it, served over HTTP with every exchange
// checked against the OpenAPI document (contract_test.go), and what the tests reach
// around it.
type testBundle struct {
	url    string
	srv    *api.Server
	ctx    context.Context // ends with the test, two minutes at most
	rdb    redis.UniversalClient
	pool   *pgxpool.Pool // the package's schema
	store  *policy.Store
	cache  *policy.Cache
	keys   keyspace.Keys        // the admitter's
	reg    *prometheus.Registry // the API's metrics
	prefix string               // account-id prefix unique to the test
	topic  string               // set when a Kafka recorder is wired
	// errors counts the records the nodes logged at error level.
	errors *atomic.Int64
	// nodes are the admit nodes setup started, this one first.
	nodes []*testBundle
	// org and team are accounts of the test's own (setupOpts.credits).
	org, team string
	// conn and client reach the rate-limit service over gRPC (setupOpts.grpc).
	conn   *grpc.ClientConn
	client rlsv3.RateLimitServiceClient
}

// setupOpts selects the parts setup wires. The zero value is one admit node on the test
// Redis and the package's schema, its policy cache loaded, the probes beside the API, and
// no recorder.
type setupOpts struct {
	rdb redis.UniversalClient // the admitter's Redis; testenv.Redis by default
	// bare serves only what the other options ask for (webhooks): no policy store or
	// cache, admitter, Redis or probes.
	bare bool
	// unloaded never runs the policy cache: a node just started, PostgreSQL slow.
	unloaded bool
	// nodes > 1 starts that many admit nodes on one Redis, key prefix and policy store,
	// each with a Redis client of its own (testBundle.nodes).
	nodes int
	// maxWait bounds how long a request may wait for capacity (api.Config.MaxWait).
	maxWait   time.Duration
	recorder  bool // wire a real Kafka recorder on a test topic
	deadKafka bool // wire a recorder whose broker does not answer
	// wrapRecorder, with recorder, wraps the Kafka recorder.
	wrapRecorder func(api.Recorder) api.Recorder
	// callTimeout bounds the admission script's calls (admission.Options.CallTimeout).
	callTimeout time.Duration
	// check names the forward-auth check's headers (api.Config.Check).
	check api.CheckHeaders
	// shadow puts every request in shadow mode (api.Config.Shadow, ADMIT_SHADOW).
	shadow bool
	// reveal shows end clients at gateways every account id (api.Config.RevealAccounts).
	reveal bool
	// maxEstimates bounds the estimates running at once (api.Config.MaxEstimates).
	maxEstimates int
	// credits wires a credit store and makes an org and a team of the test's own.
	credits bool
	// webhooks wires a webhook store; allowPrivate lets it take private targets
	// (WEBHOOK_ALLOW_PRIVATE).
	webhooks, allowPrivate bool
	// grpc serves Envoy's rate-limit service too, on a real listener, with rls (api.DefaultRLS
	// when nil) and grpcOptions; the test calls it through Envoy's generated client.
	grpc        bool
	rls         *api.RLS
	grpcOptions []grpc.ServerOption
	// invoices wires an invoice store issuing as testIssuer, on a migrated schema of the
	// test's own: a closed period is closed for the whole schema (invoices_test.go).
	invoices bool
	// staff wires a staff store (named credentials, the audit log) on a migrated schema of
	// the test's own (staff_test.go).
	staff bool
	// customers wires a store of customer tokens (customer.Store) on the same schema as the
	// policy store: tokens are issued to its accounts (customers_test.go).
	customers bool
}

func setup(t *testing.T, o setupOpts) *testBundle {
	t.Helper()
	shared := testBundle{ctx: testenv.Context(t, 2*time.Minute), rdb: o.rdb, errors: new(atomic.Int64),
		prefix: strings.ReplaceAll(testenv.Name(t), "_", "-"), nodes: make([]*testBundle, max(o.nodes, 1))}
	if shared.rdb == nil && !o.bare {
		shared.rdb = testenv.Redis(t)
	}
	if o.recorder {
		shared.topic = testenv.Topic(t, 1)
	}
	log := slog.New(&levelCounter{min: slog.LevelError, n: shared.errors})
	keyPrefix := testenv.Prefix(t) + "mg"
	schema := ""
	if o.invoices || o.staff {
		schema = migratedSchema(t)
	}
	for i := range shared.nodes {
		b := shared
		b.reg, b.pool = prometheus.NewRegistry(), testenv.Postgres(t)
		if schema != "" {
			b.pool = schemaPool(t, schema)
		}
		b.serve(t, o, log, keyPrefix, i)
		shared.nodes[i] = &b
	}
	b := shared.nodes[0]
	if o.grpc {
		b.serveRLS(t, o)
	}
	if o.credits {
		b.org, b.team = b.id("org"), b.id("team")
		b.account(t, map[string]any{"id": b.org, "kind": "org", "plan": "pro"})
		b.account(t, map[string]any{"id": b.team, "kind": "team", "parent": b.org})
	}
	return b
}

// serve starts node i of setup's: the Server and what o wires into it, served at b.url.
func (b *testBundle) serve(t *testing.T, o setupOpts, log *slog.Logger, keyPrefix string, i int) {
	t.Helper()
	cfg := api.Config{Log: log, ServiceToken: serviceToken, AdminToken: adminToken, Registerer: b.reg,
		Check: o.check, Shadow: o.shadow, RevealAccounts: o.reveal, MaxEstimates: o.maxEstimates, MaxWait: o.maxWait}
	if o.webhooks {
		cfg.Webhooks = webhook.NewStore(b.pool, o.allowPrivate)
	}
	if o.invoices {
		cfg.Invoices = api.InvoiceStore{Pool: b.pool, Issuer: testIssuer}
	}
	if o.staff {
		cfg.Staff = staff.NewStore(b.pool)
	}
	if o.customers {
		cfg.Customers = customer.NewStore(b.pool)
	}
	if o.bare {
		b.srv = api.New(cfg)
		b.url = newContractServer(t, b.srv).URL
		return
	}
	b.store, b.cache = policy.NewStore(b.pool), policy.NewCache(b.pool, log, time.Minute)
	if !o.unloaded {
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = b.cache.Run(runCtx) }()
		t.Cleanup(func() { cancel(); <-done })
		for !b.cache.Loaded() {
			select {
			case <-b.ctx.Done():
				t.Fatal("policy cache never loaded")
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	cfg.Policies, cfg.Admin, cfg.Source = b.cache, b.store, "test-node"
	cfg.Usage = api.UsageOf{Pool: b.pool}
	rdb := b.rdb
	if len(b.nodes) > 1 {
		rdb, cfg.Source = testenv.Redis(t), "node-"+string(rune('a'+i)) // a client of its own, as each node has
	}
	adm := admission.New(rdb, admission.Options{KeyPrefix: keyPrefix, LeaseTTL: 5 * time.Second, CallTimeout: o.callTimeout})
	t.Cleanup(adm.Close)
	cfg.Decider, b.keys = adm, adm.Keys()
	if o.credits {
		cfg.Credits = credit.NewStore(b.pool, b.rdb, b.keys, nil)
	}
	if o.recorder {
		w := outbox.NewWriter(testenv.KafkaBrokers(t), b.topic)
		t.Cleanup(func() { _ = w.Close() })
		cfg.Recorder = w
		if o.wrapRecorder != nil {
			cfg.Recorder = o.wrapRecorder(w)
		}
	}
	if o.deadKafka {
		w := outbox.NewWriter([]string{testenv.FreeAddr(t)}, "nowhere")
		t.Cleanup(func() { _ = w.Close() })
		cfg.Recorder = w
	}
	// Routed as cmd/admit routes it: the probes beside the API on one mux.
	mux := http.NewServeMux()
	(&ops.Probes{}).Mount(mux, prometheus.NewRegistry())
	b.srv = api.New(cfg)
	b.srv.Mount(mux)
	t.Cleanup(func() { // before the recorder closes: pending voids go to Kafka
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.srv.Close(ctx)
	})
	b.url = newContractServer(t, mux).URL
}

// serveRLS serves Envoy's rate-limit service of b.srv on a real listener (o.rls, o.grpcOptions)
// and connects b.client to it.
func (b *testBundle) serveRLS(t *testing.T, o setupOpts) {
	t.Helper()
	rls := api.DefaultRLS
	if o.rls != nil {
		rls = *o.rls
	}
	g, hs, err := b.srv.NewGRPCServer(rls, o.grpcOptions...)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- b.srv.ServeGRPC(ctx, lis, g, hs, 5*time.Second) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-served) })
	b.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.conn.Close() })
	b.client = rlsv3.NewRateLimitServiceClient(b.conn)
}

// migratedSchema makes a schema of the test's own, migrated, and returns its name.
func migratedSchema(t *testing.T) string {
	t.Helper()
	owner, schema := testenv.EmptySchema(t)
	_, err := migrations.Up(testenv.Context(t, 2*time.Minute), owner)
	require.NoError(t, err)
	return schema
}

// schemaPool opens a pool on schema as the services connect (DATABASE_URL's role).
func schemaPool(t *testing.T, schema string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(testenv.Context(t, 30*time.Second), testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// onRedisAndCluster runs f against the single Redis server and the 3-master Redis Cluster.
func onRedisAndCluster(t *testing.T, f func(t *testing.T, o setupOpts)) {
	t.Helper()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) { f(t, setupOpts{rdb: rdb}) })
}

// levelCounter is a slog handler counting the records at min or above.
type levelCounter struct {
	min slog.Level
	n   *atomic.Int64
}

func (h *levelCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }
func (h *levelCounter) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h *levelCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levelCounter) WithGroup(string) slog.Handler      { return h }

// id makes an account id unique to the test.
func (b *testBundle) id(name string) string { return b.prefix + "-" + name }

type reply struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    string
}

func (b *testBundle) call(t *testing.T, method, path, token string, body any) reply {
	t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	default:
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, b.url+path, rd)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return b.do(t, req)
}

// do sends req and reads the reply, its JSON body decoded.
func (b *testBundle) do(t *testing.T, req *http.Request) reply {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := reply{Status: resp.StatusCode, Header: resp.Header, Raw: string(raw)}
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(raw, &r.Body), string(raw))
	}
	return r
}

func (b *testBundle) account(t *testing.T, body map[string]any) {
	t.Helper()
	r := b.call(t, "POST", "/v1/admin/accounts", adminToken, body)
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
}

// accounts creates accounts through this node and waits until every node knows them.
func (b *testBundle) accounts(t *testing.T, bodies ...map[string]any) {
	t.Helper()
	for _, body := range bodies {
		b.account(t, body)
	}
	for _, body := range bodies {
		for _, n := range b.nodes {
			n.waitResolvable(t, body["id"].(string))
		}
	}
}

func (b *testBundle) apiKey(t *testing.T, account string) string {
	t.Helper()
	r := b.call(t, "POST", "/v1/admin/api-keys", adminToken, map[string]any{"account": account})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	key, _ := r.Body["api_key"].(string)
	require.NotEmpty(t, key)
	// The key reaches the admit cache through LISTEN/NOTIFY (< 1 s).
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, err := b.cache.Authenticate(key); err == nil {
			return key
		}
		require.True(t, time.Now().Before(deadline), "api key of %s never reached the cache", account)
		time.Sleep(5 * time.Millisecond)
	}
}

// waitResolvable waits until the admit cache knows the account (LISTEN/NOTIFY, < 1 s).
func (b *testBundle) waitResolvable(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := b.cache.Resolve(id); err == nil {
			return
		}
		require.True(t, time.Now().Before(deadline), "account %s never reached the cache", id)
		time.Sleep(5 * time.Millisecond)
	}
}

func (b *testBundle) admit(t *testing.T, body map[string]any) reply {
	t.Helper()
	return b.call(t, "POST", "/v1/admit", serviceToken, body)
}
