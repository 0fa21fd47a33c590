package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api/apitest"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/topic"
)

func TestMain(m *testing.M) { os.Exit(testenv.MainOrTests(m, main)) }

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	testenv.CheckConfigErrors(t, "ADMIT_ADDR")
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	testenv.CheckServiceLifecycle(t, "ADMIT_ADDR", "redis", "postgres")
}

// Six admit processes on one Redis share one pro key (100/s, burst 300) for 3 s of load
// from many clients: together they accept at most burst + rate × seconds (+1 %), not six
// times that.
func TestSixNodesShareOneKey(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 3*time.Minute)
	_, schema := testenv.EmptySchema(t)
	dbURL := testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema)
	prefix := testenv.Name(t)
	var nodes []string
	for i := range 6 {
		addr := testenv.FreeAddr(t)
		env := append(testenv.AdmitTokens(),
			"ADMIT_ADDR="+addr, "ADMIT_NODE=node-"+strconv.Itoa(i), "ADMIT_KEY_PREFIX=t:"+prefix+":mg",
			"REDIS_URL="+testenv.RedisURL(t), "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=", "DATABASE_URL="+dbURL,
			"KAFKA_BROKERS="+strings.Join(testenv.KafkaBrokers(t), ","), "KAFKA_TOPIC=t."+prefix, "LOG_LEVEL=warn",
			// Six processes and the load share two cores here: a slow reply is not the subject.
			"REDIS_TIMEOUT=5s")
		args := []string{}
		if i == 0 {
			args = append(args, "-migrate")
		}
		testenv.StartMain(t, env, args...)
		nodes = append(nodes, "http://"+addr)
		if i == 0 { // the first node migrates; the others start once the schema exists
			_, err := testenv.WaitHTTP(ctx, nodes[0]+"/readyz", 200)
			require.NoError(t, err)
		}
	}
	for _, n := range nodes {
		_, err := testenv.WaitHTTP(ctx, n+"/readyz", 200)
		require.NoError(t, err)
	}
	t.Cleanup(func() { _ = topic.Delete(context.Background(), testenv.KafkaBrokers(t), "t."+prefix) })
	// Every exchange with the nodes is checked against the OpenAPI document they serve.
	client := &http.Client{Transport: apitest.Transport(t, nodes[0], transport)}

	org := strings.ReplaceAll(prefix, "_", "-")
	post(t, client, nodes[0]+"/v1/admin/accounts", adminToken(), map[string]any{"id": org, "kind": "org", "plan": "pro"}, 201)
	key := post(t, client, nodes[0]+"/v1/admin/api-keys", adminToken(), map[string]any{"account": org}, 201)["api_key"].(string)
	for _, n := range nodes { // every node knows the key (an admission of 0 requests consumes nothing)
		for {
			if status, _ := postStatus(client, n+"/v1/admit", serviceToken(), map[string]any{"api_key": key, "units": map[string]any{"requests": 0}}); status == 200 {
				break
			}
			require.NoError(t, ctx.Err(), "node %s never learned the key", n)
			time.Sleep(10 * time.Millisecond)
		}
	}

	const clients = 48
	var accepted, denied, other atomic.Int64
	var mu sync.Mutex
	others := map[string]int{}
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(3 * time.Second)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := nodes[c%len(nodes)]
			for time.Now().Before(stop) {
				status, body := postStatus(client, node+"/v1/admit", serviceToken(), map[string]any{"api_key": key})
				switch status {
				case 200:
					accepted.Add(1)
				case 429:
					denied.Add(1)
				default:
					other.Add(1)
					mu.Lock()
					others[strconv.Itoa(status)+" "+string(body)]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	limit := (300 + 100*elapsed) * 1.01
	t.Logf("6 nodes, %d clients, %.2fs: accepted %d, denied %d, other %d; limit %.0f", clients, elapsed, accepted.Load(), denied.Load(), other.Load(), limit)
	require.Zero(t, other.Load(), "replies other than 200 and 429: %v", others)
	require.LessOrEqual(t, float64(accepted.Load()), limit)
	require.GreaterOrEqual(t, accepted.Load(), int64(300), "the burst is served")
	require.Positive(t, denied.Load(), "the load exceeded the limit")

	// Every node's /metrics counts its decisions by result and blocking level, times its
	// script calls and reads the outbox length.
	var allowed, limited float64
	for _, n := range nodes {
		status, body := get(client, n+"/metrics", "")
		require.Equal(t, 200, status)
		text := string(body)
		allowed += metricValue(t, text, `metergate_admit_decisions_total{level="",result="allow"}`)
		limited += metricValue(t, text, `metergate_admit_decisions_total{level="org",result="rate_limited"}`)
		require.Contains(t, text, "metergate_admit_script_seconds_bucket")
		require.Contains(t, text, `metergate_outbox_length{shard="0"}`)
	}
	require.Equal(t, float64(accepted.Load()+int64(len(nodes))), allowed, "allowed decisions counted (one warm-up per node)")
	require.Equal(t, float64(denied.Load()), limited, "denials counted with their level")
}

// metricValue returns the value of one sample line of a Prometheus text exposition (0 when
// absent: a counter not yet incremented).
func metricValue(t *testing.T, text, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, line)
			return f
		}
	}
	return 0
}

func serviceToken() string { return strings.SplitN(testenv.AdmitTokens()[0], "=", 2)[1] }
func adminToken() string   { return strings.SplitN(testenv.AdmitTokens()[1], "=", 2)[1] }

var transport = &http.Transport{MaxIdleConnsPerHost: 64}

func postStatus(client *http.Client, url, token string, body any) (int, []byte) {
	return nodeCall(client, "POST", url, token, body)
}

func post(t *testing.T, client *http.Client, url, token string, body any, want int) map[string]any {
	t.Helper()
	status, b := postStatus(client, url, token, body)
	require.Equal(t, want, status, string(b))
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func get(client *http.Client, url, token string) (int, []byte) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// A policy change is enforced by every admit node within 1 s of its COMMIT, through
// LISTEN/NOTIFY: three admit processes whose fallback full reload (ADMIT_POLICY_RELOAD) is an
// hour. The change is made once through node 0's admin API (the clock starts before the PUT
// is sent; the PUT waits for node 0's own reload, not the others') and once straight in
// PostgreSQL (the clock starts just before the COMMIT). Every node is polled with admissions
// from the start until it decides with the new policy: a requests quota of 0 (402), then the
// key revoked (403). The setup does not rely on notifications: nodes 1 and 2 start once the
// account and its key exist, and node 0 reloads for its own PUT.
func TestPolicyChangeReachesEveryNodeWithinOneSecond(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	pool, schema := testenv.EmptySchema(t)
	dbURL := testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema)
	prefix := testenv.Name(t)
	rdb := testenv.Redis(t)
	t.Cleanup(func() { // relay off: the admissions' outbox entries stay in Redis
		if keys, _ := rdb.Keys(context.Background(), "t:"+prefix+":*").Result(); len(keys) > 0 {
			rdb.Del(context.Background(), keys...)
		}
	})
	var nodes []string
	startNode := func(args ...string) {
		addr := testenv.FreeAddr(t)
		env := append(testenv.AdmitTokens(),
			"ADMIT_ADDR="+addr, "ADMIT_NODE=node-"+strconv.Itoa(len(nodes)), "ADMIT_KEY_PREFIX=t:"+prefix+":mg",
			"ADMIT_POLICY_RELOAD=1h", "ADMIT_RELAY=false",
			"REDIS_URL="+testenv.RedisURL(t), "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=", "DATABASE_URL="+dbURL,
			"KAFKA_BROKERS="+strings.Join(testenv.KafkaBrokers(t), ","), "KAFKA_TOPIC=t."+prefix, "LOG_LEVEL=warn")
		testenv.StartMain(t, env, args...)
		nodes = append(nodes, "http://"+addr)
		_, err := testenv.WaitHTTP(ctx, "http://"+addr+"/readyz", 200)
		require.NoError(t, err)
	}
	startNode("-migrate")
	// Every exchange with the nodes is checked against the OpenAPI document they serve.
	client := &http.Client{Transport: apitest.Transport(t, nodes[0], nodeClient.Transport), Timeout: nodeClient.Timeout}

	org := strings.ReplaceAll(prefix, "_", "-")
	status, body := nodeCall(client, "POST", nodes[0]+"/v1/admin/accounts", adminToken(), map[string]any{"id": org, "kind": "org", "plan": "pro"})
	require.Equal(t, 201, status, string(body))
	status, body = nodeCall(client, "POST", nodes[0]+"/v1/admin/api-keys", adminToken(), map[string]any{"account": org})
	require.Equal(t, 201, status, string(body))
	var created struct {
		ID     string `json:"id"`
		APIKey string `json:"api_key"`
	}
	require.NoError(t, json.Unmarshal(body, &created))
	key, keyID := created.APIKey, created.ID
	status, body = nodeCall(client, "PUT", nodes[0]+"/v1/admin/accounts/"+org, adminToken(), map[string]any{"plan": "pro"})
	require.Equal(t, 200, status, string(body))
	startNode()
	startNode()
	for _, n := range nodes {
		status, body := nodeCall(client, "POST", n+"/v1/admit", serviceToken(), map[string]any{"api_key": key})
		require.Equal(t, 200, status, "node %s admits with the key: %s", n, body)
	}

	// Through node 0's admin API.
	start := time.Now()
	enforced := pollNodes(client, nodes, start, key, 402)
	status, body = nodeCall(client, "PUT", nodes[0]+"/v1/admin/accounts/"+org, adminToken(),
		map[string]any{"plan": "pro", "limits": map[string]any{"requests": map[string]any{"quota": 0}}})
	require.Equal(t, 200, status, string(body))
	requireEnforced(t, "a requests quota of 0 set through node 0's PUT", enforced())

	// Straight in PostgreSQL.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, keyID)
	require.NoError(t, err)
	start = time.Now()
	enforced = pollNodes(client, nodes, start, key, 403)
	require.NoError(t, tx.Commit(ctx))
	requireEnforced(t, "the key revoked by SQL", enforced())
}

// pollNodes sends an admission of one request with key to every node, over and over from
// start, until the node answers want (or 10 s have passed). The function it returns waits
// for every node and returns, per node, the time from start to the first such answer (-1
// when none came).
func pollNodes(client *http.Client, nodes []string, start time.Time, key string, want int) func() []time.Duration {
	took := make([]time.Duration, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			for {
				status, _ := nodeCall(client, "POST", n+"/v1/admit", serviceToken(), map[string]any{"api_key": key})
				if status == want {
					took[i] = time.Since(start)
					return
				}
				if time.Since(start) > 10*time.Second {
					took[i] = -1
					return
				}
				time.Sleep(2 * time.Millisecond) // polling interval, not synchronisation
			}
		})
	}
	return func() []time.Duration { wg.Wait(); return took }
}

// requireEnforced fails unless every node decided with the change within 1 s of its start.
func requireEnforced(t *testing.T, what string, took []time.Duration) {
	t.Helper()
	t.Logf("%s: enforced by the nodes after %v (-1ns: not within 10 s)", what, took)
	for i, d := range took {
		require.True(t, d >= 0, "%s: node %d did not enforce it within 10 s", what, i)
		require.Less(t, d, time.Second, "%s: node %d enforced it too late", what, i)
	}
}

// nodeCall sends a JSON request with a bearer token and returns the status and body (status
// 0 when the node did not answer).
func nodeCall(client *http.Client, method, url, token string, body any) (int, []byte) {
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, url, bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

var nodeClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: 10 * time.Second}
