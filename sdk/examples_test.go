package sdk_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

// examples starts each app of examples/ on port, with env naming admit and its token.
var examples = map[string]func(t *testing.T, env []string, port string){
	"fastapi": func(t *testing.T, env []string, port string) {
		testenv.Start(t, python(t), append(env, "PYTHONPATH="+abs(t, "python/src"), "PYTHONDONTWRITEBYTECODE=1"),
			"-m", "uvicorn", "--app-dir", abs(t, "../examples/fastapi"), "app:app", "--host", "127.0.0.1", "--port", port,
			"--log-level", "warning")
	},
	"hono": func(t *testing.T, env []string, port string) {
		npm(t, "../examples/hono")
		path, err := exec.LookPath("npm")
		require.NoError(t, err)
		testenv.Start(t, path, append(env, "PORT="+port), "--prefix", abs(t, "../examples/hono"), "start", "--silent")
	},
}

func abs(t *testing.T, path string) string {
	p, err := filepath.Abs(path)
	require.NoError(t, err)
	return p
}

// exampleReply is what an example answers a chat request: the model's reply and usage, and
// (in a header) the event id admit gave the request.
type exampleReply struct {
	status  int
	eventID string
	tokens  int64
}

// ask sends the example one chat request with key, and idem as its Idempotency-Key header
// when not ""; stream asks for the reply as server-sent events, the usage in the last.
func ask(t *testing.T, ctx context.Context, base, key, idem, prompt string, stream bool) exampleReply {
	t.Helper()
	body := fmt.Sprintf(`{"model": "fake-1", "messages": [{"role": "user", "content": %q}], "stream": %t,
		"stream_options": {"include_usage": true}}`, prompt, stream)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	r := exampleReply{status: resp.StatusCode, eventID: resp.Header.Get("Metergate-Event-Id")}
	if resp.StatusCode != http.StatusOK {
		return r
	}
	reply, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if stream { // the usage is in the last event with data
		require.Equal(t, "text/event-stream", strings.Split(resp.Header.Get("Content-Type"), ";")[0])
		var last string
		for _, line := range strings.Split(string(reply), "\n") {
			if data, ok := strings.CutPrefix(line, "data:"); ok && strings.TrimSpace(data) != "[DONE]" {
				last = data
			}
		}
		reply = []byte(last)
	}
	var completion struct {
		Usage struct {
			TotalTokens int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(reply, &completion), "%s", reply)
	r.tokens = completion.Usage.TotalTokens
	return r
}

// TestExamples runs each app of examples/ behind its SDK's middleware against admit and a
// meter, end to end: every request the app answered 200 is one row of usage_events, with
// the event id the app passed on, and one row of usage_outcomes holding the tokens the
// fake model used (its streamed replies' included, from their last event); a refused request is neither served nor recorded; a client that sends
// one Idempotency-Key many times is served, and billed, once per request.
func TestExamples(t *testing.T) {
	t.Parallel()
	for name, startApp := range examples {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := start(t, true)
			ctx := testenv.Context(t, 2*time.Minute)
			key := s.apiKey(t, ctx)
			port := strings.TrimPrefix(testenv.FreeAddr(t), "127.0.0.1:")
			startApp(t, s.env(), port)
			base := "http://127.0.0.1:" + port
			_, err := testenv.WaitHTTP(ctx, base+"/healthz", 200)
			require.NoError(t, err, "%s ready", name)

			served := map[string]int64{} // event id → tokens the model used
			for i := range 12 {
				idem := ""
				if i%2 == 0 {
					idem = "one-key-for-many" // what a client gains by reusing it: nothing
				}
				r := ask(t, ctx, base, key, idem, "question"+strings.Repeat(" more", i), i%3 == 0)
				require.Equal(t, http.StatusOK, r.status)
				require.NotEmpty(t, r.eventID)
				require.NotContains(t, served, r.eventID, "two requests served under one event")
				require.Positive(t, r.tokens)
				served[r.eventID] = r.tokens
			}
			refused := ask(t, ctx, base, "mg_not_a_key", "", "no", false)
			require.Equal(t, http.StatusUnauthorized, refused.status)

			s.waitBilled(t, served)
		})
	}
}

// waitBilled waits until the org's rows are exactly served: one usage_events row per event
// id and one usage_outcomes row of status 200 with the tokens used.
func (s services) waitBilled(t *testing.T, served map[string]int64) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, err := s.db.Query(ctx, `SELECT e.event_id, coalesce(o.status, 0), coalesce(o.tokens, -1)
			FROM usage_events e LEFT JOIN usage_outcomes o USING (event_id) WHERE e.org = $1 AND e.requests > 0`, s.org)
		require.NoError(t, err)
		type billed struct {
			Status int
			Tokens int64
		}
		got := map[string]billed{}
		var id string
		var b billed
		_, err = pgx.ForEachRow(rows, []any{&id, &b.Status, &b.Tokens}, func() error { got[id] = b; return nil })
		require.NoError(t, err)
		want := map[string]billed{}
		for id, tokens := range served {
			want[id] = billed{200, tokens}
		}
		if len(got) >= len(want) && fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			require.Equal(t, want, got, "the rows in PostgreSQL are the requests served")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// apiKey makes an API key of the org and returns it once admit knows it.
func (s services) apiKey(t *testing.T, ctx context.Context) string {
	t.Helper()
	status, reply := call(t, ctx, http.MethodPost, s.url+"/v1/admin/api-keys", adminToken, map[string]any{"account": s.org})
	require.Equal(t, http.StatusCreated, status, "%s", reply)
	var k struct {
		APIKey string `json:"api_key"`
	}
	require.NoError(t, json.Unmarshal(reply, &k))
	for { // the key reaches admit's cache through LISTEN/NOTIFY (< 1 s); rows of 0 requests are not waitBilled's
		status, _ := call(t, ctx, http.MethodPost, s.url+"/v1/admit", serviceToken,
			map[string]any{"api_key": k.APIKey, "units": map[string]int64{"requests": 0}})
		if status == http.StatusOK {
			return k.APIKey
		}
		require.NoError(t, ctx.Err(), "admit never learned the key")
		time.Sleep(20 * time.Millisecond)
	}
}
