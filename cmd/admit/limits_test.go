package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

// admit's HTTP listener as the binary builds it from HTTP_*: a client trickling a body is
// cut at HTTP_READ_TIMEOUT (answered 400, never 500), a slowloris at
// HTTP_READ_HEADER_TIMEOUT, headers past HTTP_MAX_HEADER_BYTES get 431, and a request
// allowed to wait (max_wait_ms) longer than the read deadline is still answered.
func TestListenerLimits(t *testing.T) {
	t.Parallel()
	const readTimeout, headerTimeout = 2 * time.Second, 500 * time.Millisecond
	ctx := testenv.Context(t, 2*time.Minute)
	_, schema := testenv.EmptySchema(t)
	prefix := testenv.Name(t)
	addr := testenv.FreeAddr(t)
	testenv.StartMain(t, append(testenv.AdmitTokens(),
		"ADMIT_ADDR="+addr, "ADMIT_KEY_PREFIX=t:"+prefix+":mg", "ADMIT_RELAY=false", "ADMIT_MAX_WAIT=10s",
		"HTTP_READ_TIMEOUT="+readTimeout.String(), "HTTP_READ_HEADER_TIMEOUT="+headerTimeout.String(), "HTTP_MAX_HEADER_BYTES=16384",
		"REDIS_URL="+testenv.RedisURL(t), "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=",
		"DATABASE_URL="+testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
		"KAFKA_BROKERS="+strings.Join(testenv.KafkaBrokers(t), ","), "KAFKA_TOPIC=t."+prefix, "LOG_LEVEL=warn"), "-migrate")
	t.Cleanup(func() { // relay off: the admissions' outbox entries stay in Redis
		rdb := testenv.Redis(t)
		if keys, _ := rdb.Keys(context.Background(), "t:"+prefix+":*").Result(); len(keys) > 0 {
			rdb.Del(context.Background(), keys...)
		}
	})
	base := "http://" + addr
	_, err := testenv.WaitHTTP(ctx, base+"/readyz", 200)
	require.NoError(t, err)

	t.Run("slow body", func(t *testing.T) {
		t.Parallel()
		conn := dialAdmit(t, addr)
		start := time.Now()
		_, err := io.WriteString(conn, "POST /v1/admit HTTP/1.1\r\nHost: admit\r\nAuthorization: Bearer "+serviceToken()+
			"\r\nContent-Type: application/json\r\nContent-Length: 50000\r\n\r\n{")
		require.NoError(t, err)
		took, got := readUntilClosed(t, conn, start, readTimeout+5*time.Second)
		t.Logf("cut after %s: %.80q", took, got)
		require.GreaterOrEqual(t, took, readTimeout-100*time.Millisecond, "cut by the read deadline, not before")
		require.True(t, got == "" || strings.HasPrefix(got, "HTTP/1.1 4"), "a client error or nothing, never a 5xx: %q", got)
	})

	t.Run("slow headers", func(t *testing.T) {
		t.Parallel()
		conn := dialAdmit(t, addr)
		start := time.Now()
		_, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: admit\r\n")
		require.NoError(t, err)
		closed := make(chan time.Duration, 1)
		go func() {
			_, _ = io.Copy(io.Discard, conn)
			closed <- time.Since(start)
		}()
		tick := time.NewTicker(100 * time.Millisecond) // the client's pace, not synchronisation
		defer tick.Stop()
		for {
			select {
			case took := <-closed:
				t.Logf("slow headers cut after %s", took)
				require.Less(t, took, readTimeout, "cut by HTTP_READ_HEADER_TIMEOUT (%s)", headerTimeout)
				return
			case <-ctx.Done():
				t.Fatal("admit still reads the headers")
			case <-tick.C:
				_, _ = io.WriteString(conn, "X-Slow: 1\r\n")
			}
		}
	})

	t.Run("large headers", func(t *testing.T) {
		t.Parallel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
		require.NoError(t, err)
		req.Header.Set("X-Big", strings.Repeat("a", 24<<10))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
	})

	t.Run("wait past the read deadline", func(t *testing.T) {
		t.Parallel()
		// One request per 3 s: the second waits about 3 s for its turn, past the 2 s read
		// deadline, and is answered.
		org := strings.ReplaceAll(prefix, "_", "-")
		post(t, http.DefaultClient, base+"/v1/admin/accounts", adminToken(), map[string]any{"id": org, "kind": "org", "plan": "pro",
			"limits": map[string]any{"requests": map[string]any{"limit": 1, "window_s": 3}}}, 201)
		key := post(t, http.DefaultClient, base+"/v1/admin/api-keys", adminToken(), map[string]any{"account": org}, 201)["api_key"].(string)
		for { // the key reaches the node's cache through LISTEN/NOTIFY
			status, body := postStatus(http.DefaultClient, base+"/v1/admit", serviceToken(), map[string]any{"api_key": key})
			if status == 200 {
				break
			}
			require.Equal(t, 401, status, string(body))
			require.NoError(t, ctx.Err(), "the key never reached the node")
			time.Sleep(10 * time.Millisecond) // polling interval
		}
		start := time.Now()
		status, body := postStatus(http.DefaultClient, base+"/v1/admit", serviceToken(), map[string]any{"api_key": key, "max_wait_ms": 8000})
		took := time.Since(start)
		require.Equal(t, 200, status, "answered after %s: %s", took, body)
		var reply struct {
			WaitedMS int64 `json:"waited_ms"`
		}
		require.NoError(t, json.Unmarshal(body, &reply))
		t.Logf("waited %d ms, answered after %s", reply.WaitedMS, took)
		require.Greater(t, reply.WaitedMS, readTimeout.Milliseconds(), "the request waited past the read deadline")
	})
}

func dialAdmit(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// readUntilClosed reads conn until admit closes it and returns how long that took from
// start and what admit sent; it fails the test if admit still holds it after limit.
func readUntilClosed(t *testing.T, conn net.Conn, start time.Time, limit time.Duration) (time.Duration, string) {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(start.Add(limit)))
	got, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("admit still holds the connection after %s (got %q)", limit, got)
	}
	return time.Since(start), string(got)
}
