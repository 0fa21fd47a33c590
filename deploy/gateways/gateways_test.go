package gateways_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/gatewaytest"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const (
	serviceToken = "svc-gw-0123456789abcdef"
	adminToken   = "adm-gw-0123456789abcdef"
)

// admit is an in-process admit on a real listener, on this test's schema and Redis keys.
type admit struct {
	url, addr string
	cache     *policy.Cache
	prefix    string
}

func startAdmit(t *testing.T) *admit {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Postgres(t)
	log := slog.New(slog.DiscardHandler)
	cache := policy.NewCache(pool, log, time.Minute)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = cache.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	for !cache.Loaded() {
		select {
		case <-ctx.Done():
			t.Fatal("policy cache never loaded")
		case <-time.After(10 * time.Millisecond):
		}
	}
	adm := admission.New(testenv.Redis(t), admission.Options{KeyPrefix: testenv.Prefix(t) + "mg"})
	srv := api.New(api.Config{Log: log, Policies: cache, Admin: policy.NewStore(pool), Decider: adm,
		ServiceToken: serviceToken, AdminToken: adminToken, Source: "gw-test"})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &admit{url: hs.URL, addr: hs.Listener.Addr().String(), cache: cache, prefix: strings.ReplaceAll(testenv.Name(t), "_", "-")}
}

func (a *admit) call(t *testing.T, method, path, token string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, a.url+path, rd)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(raw)
}

// account creates an org and returns an API key of it, once admit's cache knows both.
func (a *admit) account(t *testing.T, name string, body map[string]any) (string, string) {
	t.Helper()
	id := a.prefix + "-" + name
	body["id"], body["kind"] = id, "org"
	status, raw := a.call(t, "POST", "/v1/admin/accounts", adminToken, body)
	require.Equal(t, http.StatusCreated, status, raw)
	status, raw = a.call(t, "POST", "/v1/admin/api-keys", adminToken, map[string]any{"account": id})
	require.Equal(t, http.StatusCreated, status, raw)
	var k struct {
		APIKey string `json:"api_key"`
	}
	require.NoError(t, json.Unmarshal([]byte(raw), &k))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, err := a.cache.Authenticate(k.APIKey); err == nil {
			return id, k.APIKey
		}
		require.True(t, time.Now().Before(deadline), "api key of %s never reached the cache", id)
		time.Sleep(5 * time.Millisecond)
	}
}

// usedRequests is the account's requests used this period (GET /v1/usage/{account}).
func (a *admit) usedRequests(t *testing.T, account string) int {
	t.Helper()
	status, raw := a.call(t, "GET", "/v1/usage/"+account, serviceToken, nil)
	require.Equal(t, http.StatusOK, status, raw)
	var u struct {
		Units map[string]struct {
			Used int `json:"used"`
		} `json:"units"`
	}
	require.NoError(t, json.Unmarshal([]byte(raw), &u), raw)
	return u.Units["requests"].Used
}

type answer struct {
	status int
	header http.Header
	body   string
	json   map[string]any
}

func send(t *testing.T, method, url string, h map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := answer{status: resp.StatusCode, header: resp.Header, body: string(raw)}
	_ = json.Unmarshal(raw, &a.json) // a non-JSON body leaves it nil
	return a
}

// gateway is one gateway in front of the upstream, checking with admit.
type gateway struct {
	url string
	adm *admit
	app *gatewaytest.Upstream
}

func nginx(t *testing.T) gateway {
	t.Helper()
	adm, app := startAdmit(t), gatewaytest.StartUpstream(t)
	url := gatewaytest.Nginx(t, gatewaytest.Target{AdmitAddr: adm.addr, ServiceToken: serviceToken, UpstreamAddr: app.Addr})
	return gateway{url: url, adm: adm, app: app}
}

func caddy(t *testing.T) gateway {
	t.Helper()
	adm, app := startAdmit(t), gatewaytest.StartUpstream(t)
	url := gatewaytest.Caddy(t, gatewaytest.Target{AdmitAddr: adm.addr, ServiceToken: serviceToken, UpstreamAddr: app.Addr})
	return gateway{url: url, adm: adm, app: app}
}

// The shipped nginx.conf and Caddyfile, run by the real servers in front of an app with a
// real admit: the seeds' free key's burst of 30, all with one Idempotency-Key, is cut at
// about 20, the rest 429 with Retry-After and admit's JSON at the client; a spent quota is
// 402 with its JSON; an unknown or missing key 401; the app gets exactly the passed
// requests, each an admitted event of its own: what the client sends buys nothing unbilled.
func TestGateways(t *testing.T) {
	t.Parallel()
	for name, start := range map[string]func(*testing.T) gateway{"nginx": nginx, "caddy": caddy} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := start(t)
			t.Run("free burst", func(t *testing.T) { freeBurst(t, g) })
			t.Run("spent quota", func(t *testing.T) { spentQuota(t, g) })
			t.Run("unknown key", func(t *testing.T) { unknownKey(t, g) })
		})
	}
}

func freeBurst(t *testing.T, g gateway) {
	account, key := g.adm.account(t, "free", map[string]any{"plan": "free"})
	before, _ := g.app.Seen()

	var mu sync.Mutex
	var answers []answer
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 30 {
		method := "GET"
		if i%3 == 0 {
			method = "POST" // the original method reaches admit, which takes any
		}
		wg.Go(func() {
			<-start
			// One idempotency key for all: the gateway must not pass a replay, unbilled.
			a := send(t, method, g.url+"/v1/chat", map[string]string{"X-Api-Key": key, "X-Estimated-Tokens": "50",
				"Idempotency-Key": "the-same-key", "X-Tool": "image_generate"})
			mu.Lock()
			defer mu.Unlock()
			answers = append(answers, a)
		})
	}
	close(start)
	wg.Wait()

	counts := map[int]int{}
	for _, a := range answers {
		counts[a.status]++
		switch a.status {
		case http.StatusOK:
			require.Equal(t, gatewaytest.Reply, a.body)
			require.Regexp(t, `^"`+account+`-requests";r=\d+;t=\d+`, a.header.Get("RateLimit"), "the client sees the limits")
			require.NotEmpty(t, a.header.Get("RateLimit-Policy"))
		case http.StatusTooManyRequests:
			retry, err := strconv.Atoi(a.header.Get("Retry-After"))
			require.NoError(t, err, "Retry-After at the client: %v", a.header)
			require.GreaterOrEqual(t, retry, 1)
			require.Equal(t, "application/json", a.header.Get("Content-Type"))
			require.Equal(t, "rate_limited", a.json["decision"], a.body)
			require.Equal(t, account, a.json["account"], a.body)
			require.NotEmpty(t, a.header.Get("RateLimit"))
		}
	}
	// The free plan's bucket holds 20 and refills 10/s: a slow machine refills one or two
	// while the 30 are in flight.
	require.GreaterOrEqual(t, counts[200], 20, "%v", counts)
	require.LessOrEqual(t, counts[200], 22, "%v", counts)
	require.Equal(t, 30, counts[200]+counts[429], "%v", counts)

	after, header := g.app.Seen()
	events := after[len(before):]
	require.Len(t, events, counts[200], "the app got exactly the passed requests")
	distinct := map[string]bool{}
	for _, e := range events {
		require.NotEmpty(t, e, "every passed request names its event")
		distinct[e] = true
	}
	require.Len(t, distinct, counts[200])
	require.Equal(t, account, header.Get(api.AccountHeader))
	require.Equal(t, counts[200], g.adm.usedRequests(t, account), "every passed request is an admitted event")
}

func spentQuota(t *testing.T, g gateway) {
	account, key := g.adm.account(t, "quota", map[string]any{"plan": "pro",
		"limits": map[string]any{"requests": map[string]any{"quota": 2, "quota_period": "month"}}})
	for range 2 {
		a := send(t, "GET", g.url+"/", map[string]string{"X-Api-Key": key})
		require.Equal(t, http.StatusOK, a.status, a.body)
	}
	before, _ := g.app.Seen()
	a := send(t, "GET", g.url+"/", map[string]string{"X-Api-Key": key})
	require.Equal(t, http.StatusPaymentRequired, a.status, a.body)
	require.Equal(t, "application/json", a.header.Get("Content-Type"))
	require.Equal(t, "quota_exceeded", a.json["decision"], a.body)
	require.Equal(t, map[string]any{"account": account, "level": "org", "unit": "requests"}, a.json["blocked_by"], a.body)
	require.Contains(t, a.header.Get("RateLimit"), `"`+account+`-requests-quota";r=0`)
	after, _ := g.app.Seen()
	require.Len(t, after, len(before), "a refused request never reaches the app")
	require.Equal(t, 2, g.adm.usedRequests(t, account))
}

func unknownKey(t *testing.T, g gateway) {
	before, _ := g.app.Seen()
	a := send(t, "GET", g.url+"/", map[string]string{"X-Api-Key": "mgk_nobody"})
	require.Equal(t, http.StatusUnauthorized, a.status, a.body)
	require.Equal(t, "application/json", a.header.Get("Content-Type"))
	require.Equal(t, map[string]any{"code": "unknown_api_key", "message": "the API key is not known"}, a.json["error"], a.body)

	a = send(t, "GET", g.url+"/", nil)
	require.Equal(t, http.StatusUnauthorized, a.status, a.body)
	require.Equal(t, "missing_api_key", a.json["error"].(map[string]any)["code"], a.body)

	// The client's charging headers never reach admit: not even a bad one is read.
	a = send(t, "GET", g.url+"/", map[string]string{"X-Api-Key": "mgk_nobody", "X-Estimated-Tokens": "many", "X-Tool": "teleport"})
	require.Equal(t, http.StatusUnauthorized, a.status, a.body)
	require.Equal(t, "unknown_api_key", a.json["error"].(map[string]any)["code"], a.body)

	after, _ := g.app.Seen()
	require.Len(t, after, len(before), "a refused request never reaches the app")
}

// shipped reads a configuration of this directory as shipped.
func shipped(t *testing.T, name string) string {
	t.Helper()
	return gatewaytest.Shipped(t, name)
}
