package security_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

// Findings 9-12: webhook targets, duplicate JSON keys, the estimate pool, an ambiguous
// Redis configuration.
func inputProbes() []probe {
	return []probe{
		{name: "F9-webhook-targets", desc: "POST /v1/admin/webhooks to 100.100.100.200, [64:ff9b::a9fe:a9fe], 240.0.0.1, 192.0.0.1: 400 each",
			run: webhookTargets},
		{name: "F9-webhook-unknown-account", desc: "POST /v1/admin/webhooks filtered on an account that does not exist: 400 unknown_account",
			run: webhookUnknownAccount},
		{name: "F10-duplicate-keys", desc: "POST /v1/admit with \"account\" twice, or \"tokens\" twice in units: 400 duplicate_key",
			run: duplicateKeys},
		{name: "F11-estimate-bound", serial: true, desc: "8 concurrent 1 MB /v1/estimate bodies held open: admit bounds the estimates, the rest get 503 busy (JSON) at once",
			run: estimateBound},
		{name: "F12-redis-ambiguous", desc: "admit with REDIS_URL naming a server and REDIS_SENTINEL_ADDRS set exits non-zero, naming both",
			run: redisAmbiguous},
	}
}

// webhook is a webhook endpoint of the admin API to url, for account unless empty.
func webhook(url, account string) map[string]any {
	w := map[string]any{"url": url, "event_types": []string{"usage.threshold.v1"}}
	if account != "" {
		w["account"] = account
	}
	return w
}

func webhookTargets(p *P, s *stack) {
	var accepted []string
	for _, host := range []string{"100.100.100.200", "[64:ff9b::a9fe:a9fe]", "240.0.0.1", "192.0.0.1"} {
		a := post(p, s.admit+"/v1/admin/webhooks", adminToken, webhook("https://"+host+"/hook", ""))
		if a.status != http.StatusBadRequest {
			accepted = append(accepted, fmt.Sprintf("%s: %d %s", host, a.status, strings.TrimSpace(a.body)))
		}
	}
	none(p, accepted, "special-purpose addresses accepted as webhook targets")
}

func webhookUnknownAccount(p *P, s *stack) {
	a := post(p, s.admit+"/v1/admin/webhooks", adminToken, webhook("https://8.8.8.8/hook", s.id("nobody")))
	require.Equal(p, http.StatusBadRequest, a.status, a.body)
	require.Equal(p, "unknown_account", a.code(), a.body)
}

func duplicateKeys(p *P, s *stack) {
	org, other := s.id("dup"), s.id("dup-other")
	s.org(p, org, "pro", nil)
	s.org(p, other, "pro", nil)
	key := s.apiKey(p, org)
	for _, body := range []string{
		fmt.Sprintf(`{"account":%q,"account":%q,"units":{"requests":1}}`, org, other),
		fmt.Sprintf(`{"api_key":%q,"units":{"tokens":1,"tokens":1000000}}`, key),
	} {
		a := postRaw(p, s.admit+"/v1/admit", serviceToken, body)
		require.Equal(p, http.StatusBadRequest, a.status, "%s: %s", body, a.body)
		require.Equal(p, "duplicate_key", a.code(), "%s: %s", body, a.body)
	}
}

// estimateBound opens 8 requests to /v1/estimate, each with the headers and all but the
// last byte of a 1 MB body: an estimate slot is taken before the body is read, so a bounded
// admit answers the requests past its bound 503 busy while the others are held. Then the
// held bodies are finished and answered.
func estimateBound(p *P, s *stack) {
	const n = 8
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 1_000_000/45)
	body, err := json.Marshal(map[string]any{"request": map[string]any{"model": "claude-sonnet-4-5", "max_tokens": 16,
		"messages": []map[string]any{{"role": "user", "content": text}}}})
	require.NoError(p, err)
	head := fmt.Sprintf("POST /v1/estimate HTTP/1.1\r\nHost: admit\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", serviceToken, len(body))

	type reply struct {
		at     time.Duration
		status int
		code   string
		err    error
	}
	conns := make([]net.Conn, n)
	replies := make([]chan reply, n)
	wrote := make([]chan error, n)
	begin := time.Now()
	for i := range n {
		c, err := net.Dial("tcp", s.admitAddr)
		require.NoError(p, err)
		p.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(15 * time.Second))
		conns[i], replies[i], wrote[i] = c, make(chan reply, 1), make(chan error, 1)
		go func() {
			_, err := io.WriteString(c, head)
			if err == nil {
				_, err = c.Write(body[:len(body)-1])
			}
			wrote[i] <- err
		}()
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			r := reply{at: time.Since(begin), err: err}
			if err == nil {
				raw, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				var e struct {
					Error struct{ Code string } `json:"error"`
				}
				_ = json.Unmarshal(raw, &e)
				r.status, r.code = resp.StatusCode, e.Error.Code
			}
			replies[i] <- r
		}()
	}

	// What is answered while every body is still incomplete: only refusals can be.
	early := map[int]reply{}
	window := time.After(2500 * time.Millisecond)
collect:
	for len(early) < n {
		progressed := false
		for i := range n {
			if _, ok := early[i]; ok {
				continue
			}
			select {
			case r := <-replies[i]:
				early[i] = r
				progressed = true
			default:
			}
		}
		if !progressed {
			select {
			case <-window:
				break collect
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	busy := 0
	for _, r := range early {
		if r.err == nil && r.status == http.StatusServiceUnavailable && r.code == "busy" {
			busy++
		}
	}
	// Finish the held bodies; each is then answered.
	answered := map[string]int{}
	for i := range n {
		r, ok := early[i]
		if !ok {
			require.NoError(p, <-wrote[i], "request %d's body", i)
			_, err := conns[i].Write(body[len(body)-1:])
			require.NoError(p, err, "request %d's last byte", i)
			r = <-replies[i]
		}
		require.NoError(p, r.err, "request %d's answer", i)
		answered[fmt.Sprintf("%d %s", r.status, r.code)]++
		require.Contains(p, []int{http.StatusOK, http.StatusServiceUnavailable, http.StatusTooManyRequests}, r.status, "request %d: %d %s", i, r.status, r.code)
	}
	p.Logf("%d held estimates: %d refused busy within 2.5 s; answers %v", n, busy, answered)
	require.Positive(p, busy, "all %d estimates were taken at once, none refused busy (answers %v)", n, answered)
	require.Positive(p, answered["200 "], "the held estimates are answered once their bodies arrive (answers %v)", answered)
}

func redisAmbiguous(p *P, s *stack) {
	addr := testenv.FreeAddr(p)
	env := s.with("ADMIT_ADDR="+addr, "ADMIT_SERVICE_TOKEN="+serviceToken, "ADMIT_ADMIN_TOKEN="+adminToken,
		"REDIS_URL=redis://127.0.0.1:6379/0", "REDIS_SENTINEL_ADDRS=127.0.0.1:26380,127.0.0.1:26381", "REDIS_SENTINEL_MASTER=metergate")
	proc := testenv.Start(p, filepath.Join(bin, "admit"), env)
	code, err := proc.Wait(20 * time.Second)
	require.NoError(p, err, "admit kept running with an ambiguous Redis configuration")
	out := proc.Output()
	require.NotZero(p, code, "admit exited 0:\n%s", out)
	require.Contains(p, out, "REDIS_URL", "the message names REDIS_URL")
	require.Contains(p, out, "REDIS_SENTINEL_ADDRS", "the message names REDIS_SENTINEL_ADDRS")
}
