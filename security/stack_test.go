package security_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/gatewaytest"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/testenv"
)

const (
	serviceToken = "svc-security-0123456789abcdef"
	adminToken   = "adm-security-0123456789abcdef"

	// readTimeout and readHeaderTimeout are the slow-client admit's HTTP read deadlines.
	readTimeout       = 2 * time.Second
	readHeaderTimeout = time.Second
	// heldStreams is the main admit's cap of streaming gRPC calls held open at once.
	heldStreams = 4
	// maxEstimates bounds the main admit's concurrent estimates; GOMAXPROCS=2 makes the
	// default (2 × GOMAXPROCS) 4 where the setting is not known.
	maxEstimates = 2
)

// stack is the deployment every probe drives: admit (relay inside, the gRPC rate-limit
// service on), meter, nginx and Caddy with the shipped configurations in front of an app,
// and a second admit with short HTTP read deadlines for the slow clients. It has its own
// schema, Kafka topic and Redis key prefix.
type stack struct {
	run       string // random, in every id the probes make
	prefix    string // ADMIT_KEY_PREFIX
	keys      keyspace.Keys
	env       []string // what every binary gets: the services, the schema, the key prefix
	admitAddr string
	admit     string // base URL
	grpcAddr  string
	slow      string // base URL of the slow-client admit
	nginx     string // base URL
	caddy     string // base URL
	app       *gatewaytest.Upstream
	rdb       *redis.Client

	secrets secretTrees
}

func newStack(t *testing.T) *stack {
	t.Helper()
	ctx := testenv.Context(t, 3*time.Minute)
	_, schema := testenv.EmptySchema(t)
	name := testenv.Name(t)
	s := &stack{run: testenv.Random(3), prefix: "t:" + name + ":mg", rdb: testenv.Redis(t)}
	s.keys = keyspace.Keys{Prefix: s.prefix, Shards: keyspace.DefaultShards}
	s.env = []string{
		"DATABASE_URL=" + testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
		"REDIS_URL=" + testenv.RedisURL(t), "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=",
		"KAFKA_BROKERS=" + strings.Join(testenv.KafkaBrokers(t), ","), "KAFKA_TOPIC=" + testenv.Topic(t, 4),
		"ADMIT_KEY_PREFIX=" + s.prefix, "LOG_LEVEL=warn",
	}
	tokens := []string{"ADMIT_SERVICE_TOKEN=" + serviceToken, "ADMIT_ADMIN_TOKEN=" + adminToken}

	s.admitAddr, s.grpcAddr = testenv.FreeAddr(t), testenv.FreeAddr(t)
	s.admit = "http://" + s.admitAddr
	start(ctx, t, "admit", s.admit, append(s.with(tokens...), "ADMIT_ADDR="+s.admitAddr, "ADMIT_NODE=security-main",
		"ADMIT_GRPC_ADDR="+s.grpcAddr, fmt.Sprintf("ADMIT_GRPC_MAX_HELD_STREAMS=%d", heldStreams),
		"GOMAXPROCS=2", fmt.Sprintf("ADMIT_MAX_ESTIMATES=%d", maxEstimates), "WEBHOOK_ALLOW_PRIVATE=false"), "-migrate")

	meterAddr := testenv.FreeAddr(t)
	start(ctx, t, "meter", "http://"+meterAddr, s.with("METER_ADDR="+meterAddr, "METER_GROUP=g-"+name))

	// The slow-client admit: the same deployment, short read deadlines, under both the
	// names of internal/config (HTTP_*) and the ADMIT_HTTP_* the issue names.
	slowAddr := testenv.FreeAddr(t)
	s.slow = "http://" + slowAddr
	rt, rht := readTimeout.String(), readHeaderTimeout.String()
	start(ctx, t, "admit", s.slow, append(s.with(tokens...), "ADMIT_ADDR="+slowAddr, "ADMIT_NODE=security-slow", "ADMIT_RELAY=false",
		"HTTP_READ_TIMEOUT="+rt, "HTTP_READ_HEADER_TIMEOUT="+rht, "HTTP_IDLE_TIMEOUT="+rt,
		"ADMIT_HTTP_READ_TIMEOUT="+rt, "ADMIT_HTTP_READ_HEADER_TIMEOUT="+rht, "ADMIT_HTTP_IDLE_TIMEOUT="+rt))

	s.app = gatewaytest.StartUpstream(t)
	target := gatewaytest.Target{AdmitAddr: s.admitAddr, ServiceToken: serviceToken, UpstreamAddr: s.app.Addr}
	s.nginx = gatewaytest.Nginx(t, target)
	s.caddy = gatewaytest.Caddy(t, target)
	return s
}

// with is the stack's environment plus extra ("K=V"; a later name wins).
func (s *stack) with(extra ...string) []string {
	return append(append([]string{}, s.env...), extra...)
}

// start starts a binary of this run and waits until base/readyz answers 200.
func start(ctx context.Context, t *testing.T, name, base string, env []string, args ...string) *testenv.Process {
	t.Helper()
	p := testenv.Start(t, filepath.Join(bin, name), env, args...)
	if _, err := testenv.WaitHTTP(ctx, base+"/readyz", 200); err != nil {
		t.Fatalf("%s at %s not ready: %v\n%s", name, base, err, p.Output())
	}
	return p
}

// id is an account id of this run.
func (s *stack) id(name string) string { return name + "-" + s.run }

var client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// answer is an HTTP response, read whole.
type answer struct {
	status int
	header http.Header
	body   string
	json   map[string]any // nil when the body is not a JSON object
}

// code is the JSON error code of the answer ("" when it has none).
func (a answer) code() string {
	e, _ := a.json["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// message is the JSON error message of the answer.
func (a answer) message() string {
	e, _ := a.json["error"].(map[string]any)
	m, _ := e["message"].(string)
	return m
}

// String is the whole answer: status, headers (sorted) and body, what a leak is looked for in.
func (a answer) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n", a.status)
	names := make([]string, 0, len(a.header))
	for k := range a.header {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		for _, v := range a.header[k] {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	b.WriteString("\n" + a.body)
	return b.String()
}

// send sends a request with the headers given as they are (names not canonicalised, a
// name given twice sent twice) and reads the answer.
func send(ctx context.Context, method, url string, header [][2]string, body []byte) (answer, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return answer{}, err
	}
	for _, h := range header {
		req.Header[h[0]] = append(req.Header[h[0]], h[1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: string(raw)}
	_ = json.Unmarshal(raw, &a.json) // a body that is not a JSON object leaves it nil
	return a, nil
}

// do is send for a probe: a transport error fails it.
func do(p *P, method, url string, header [][2]string, body []byte) answer {
	p.Helper()
	a, err := send(p.Context(), method, url, header, body)
	require.NoError(p, err, "%s %s", method, url)
	return a
}

// bearer is the Authorization header of token.
func bearer(token string) [2]string { return [2]string{"Authorization", "Bearer " + token} }

// post sends v as JSON with a bearer token.
func post(p *P, url, token string, v any) answer {
	p.Helper()
	raw, err := json.Marshal(v)
	require.NoError(p, err)
	return do(p, http.MethodPost, url, [][2]string{bearer(token), {"Content-Type", "application/json"}}, raw)
}

// postRaw sends body as it is, JSON, with a bearer token.
func postRaw(p *P, url, token, body string) answer {
	p.Helper()
	return do(p, http.MethodPost, url, [][2]string{bearer(token), {"Content-Type", "application/json"}}, []byte(body))
}

// account creates an account through the admin API (body: the admin API's account).
func (s *stack) account(p *P, body map[string]any) {
	p.Helper()
	a := post(p, s.admit+"/v1/admin/accounts", adminToken, body)
	require.Equal(p, http.StatusCreated, a.status, "create account %v: %s", body["id"], a.body)
}

// org creates an org of plan with limits (nil: the plan's).
func (s *stack) org(p *P, id, plan string, limits map[string]any) {
	p.Helper()
	body := map[string]any{"id": id, "kind": "org", "plan": plan}
	if limits != nil {
		body["limits"] = limits
	}
	s.account(p, body)
}

// apiKey issues an API key of account and returns it once every admit of the stack knows
// it (the policy cache learns it through LISTEN/NOTIFY): each is asked with an admission of
// 0 units until it stops answering 401.
func (s *stack) apiKey(p *P, account string) string {
	p.Helper()
	a := post(p, s.admit+"/v1/admin/api-keys", adminToken, map[string]any{"account": account})
	require.Equal(p, http.StatusCreated, a.status, "api key of %s: %s", account, a.body)
	key, _ := a.json["api_key"].(string)
	require.NotEmpty(p, key, a.body)
	for _, base := range []string{s.admit, s.slow} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			a := post(p, base+"/v1/admit", serviceToken, map[string]any{"api_key": key, "units": map[string]any{"requests": 0}})
			if a.status != http.StatusUnauthorized {
				break
			}
			require.True(p, time.Now().Before(deadline), "%s never learned the key of %s: %s", base, account, a.body)
			time.Sleep(10 * time.Millisecond)
		}
	}
	return key
}

// reconcile runs the reconcile binary on the stack and returns its exit code and output.
func (s *stack) reconcile(p *P, args ...string) (int, string) {
	p.Helper()
	proc := testenv.Start(p, filepath.Join(bin, "reconcile"), s.env, args...)
	code, err := proc.Wait(3 * time.Minute)
	require.NoError(p, err, "reconcile %v", args)
	return code, proc.Output()
}
