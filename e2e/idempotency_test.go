package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
	"github.com/metergate/metergate/internal/topic"
)

// idemHot is the hot window of TestIdempotencyAcrossKafkaOutage: Redis holds a record
// exactly for it (and while its event is not in PostgreSQL), the billing log answers after.
const idemHot = time.Second

// Issue 29: a retry with the same idempotency key is answered with the first decision and
// charged once past Redis' hot window, across a Kafka outage longer than it (the outbox
// holds events not yet in PostgreSQL, so Redis must keep their records), and after it, once
// the meter has the events and the janitor has deleted the hot buckets (the billing log
// answers). A key reused with other units is refused both ways; while the billing log
// cannot be read, a key it may hold is answered 503 and charges nothing.
func TestIdempotencyAcrossKafkaOutage(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	phase := func(what string) { t.Logf("%6.1fs %s", time.Since(t0).Seconds(), what) }
	broker := private.StartBroker(t)
	phase("broker")
	brokers := []string{broker.Addr()}
	ctx := testenv.Context(t, 3*time.Minute)
	require.NoError(t, topic.Ensure(ctx, brokers, topic.Spec{Name: "usage", Partitions: 2, ReplicationFactor: 1}))
	s := newStackOn(t, brokers, "usage", "ADMIT_IDEMPOTENCY_HOT="+idemHot.String(), "ADMIT_IDEMPOTENCY_TTL=10m",
		"ADMIT_IDEMPOTENCY_MARK_EVERY=100ms", "METER_SESSION_TIMEOUT=6s") // the meter rejoins its group sooner after the outage
	phase("stack")
	rdb := testenv.Redis(t)
	keys := keyspace.Keys{Prefix: stackEnv(s.env, "ADMIT_KEY_PREFIX"), Shards: keyspace.DefaultShards}
	name := s.org
	shard := keys.Shard(s.org)

	team, agent := s.org+"-team", s.org+"-agent"
	s.account(t, team, "team", s.org, "", nil)
	s.account(t, agent, "agent", team, "", map[string]any{"requests": map[string]any{"quota": 1000}})
	want := map[string]row{}
	for id, r := range s.warmup {
		want[id] = r
	}
	for { // the agent reaches admit's cache within 1 s; a request without a key, charged
		r := admitKeyed(t, s, agent, "", 0)
		if r.status == 401 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		require.Equal(t, 200, r.status, r.raw)
		want[r.eventID] = s.sent("", agent, "", "llm_call", map[string]int64{"tokens": 0, "credits": 3})
		break
	}

	// Kafka down: what is admitted now stays in the outbox, the billing log does not have it.
	phase("warm")
	broker.Stop()
	phase("broker stopped")
	stopped := time.Now()
	const n = 6
	first := make([]string, n) // the first decision's event id, per key
	idem := func(i int) string { return fmt.Sprintf("order-%d", i) }
	for i := range n {
		r := admitKeyed(t, s, agent, idem(i), 100+int64(i))
		require.Equal(t, 200, r.status, r.raw)
		require.False(t, r.replayed)
		first[i] = r.eventID
		want[r.eventID] = s.sent("", agent, idem(i), "llm_call", map[string]int64{"tokens": 100 + int64(i), "credits": 3})
	}
	admitted := time.Now()
	// retryAll retries every key with its units: each is answered with its first decision.
	retryAll := func(when string) {
		t.Helper()
		for i := range n {
			r := admitKeyed(t, s, agent, idem(i), 100+int64(i))
			require.Equal(t, 200, r.status, "%s: %s", when, r.raw)
			require.True(t, r.replayed, "%s: %s", when, r.raw)
			require.Equal(t, first[i], r.eventID, "%s: the first decision", when)
		}
	}
	reused := func(when string) {
		t.Helper()
		r := admitKeyed(t, s, agent, idem(0), 999)
		require.Equal(t, 422, r.status, "%s: %s", when, r.raw)
		require.Equal(t, "idempotency_key_reused", r.code, "%s: %s", when, r.raw)
	}

	// Longer than the hot window: the records stay in Redis, the log has none of them.
	for time.Since(admitted) < 3*idemHot { // past the current and the previous hot bucket by the clock
		time.Sleep(50 * time.Millisecond)
	}
	retryAll("during the outage, past the hot window")
	reused("during the outage")
	var rows int
	require.NoError(t, s.db.QueryRow(ctx, `SELECT count(*) FROM usage_events WHERE org = $1`, s.org).Scan(&rows))
	require.Less(t, rows, len(want), "the outage holds events back from PostgreSQL")
	outage := time.Since(stopped)
	require.Greater(t, outage, idemHot)

	// Kafka back: the meter drains, the mark passes the records and their buckets go.
	phase("retried")
	broker.Start()
	phase("broker started")
	s.waitRows(t, want, time.Minute)
	phase("rows")
	drained := time.Now()
	buckets := map[string]bool{}
	for i := range n {
		var at time.Time
		require.NoError(t, s.db.QueryRow(ctx, `SELECT event_time FROM usage_events WHERE event_id = $1`, first[i]).Scan(&at))
		buckets[keys.IdempotencyHotBucket(shard, at.UnixMilli()/idemHot.Milliseconds())] = true
	}
	for {
		left := 0
		for b := range buckets {
			n, err := rdb.Exists(ctx, b).Result()
			require.NoError(t, err)
			left += int(n)
		}
		if left == 0 {
			break
		}
		require.Less(t, time.Since(drained), 30*time.Second, "%d hot buckets of the keys still there; mark %v", left, rdb.Get(ctx, keys.IdempotencyMark(shard)).Val())
		time.Sleep(50 * time.Millisecond)
	}
	mark, err := rdb.Get(ctx, keys.IdempotencyMark(shard)).Int64()
	require.NoError(t, err)
	require.Greater(t, mark, admitted.UnixMilli(), "the mark passed the admissions")

	phase("buckets gone")
	retryAll("from the billing log")
	reused("from the billing log")

	// Charged once: one row per key, and the quota counter counts each key once.
	for i := range n {
		require.NoError(t, s.db.QueryRow(ctx, `SELECT count(*) FROM usage_events WHERE idempotency_key = $1 AND account = $2`, idem(i), agent).Scan(&rows))
		require.Equal(t, 1, rows, idem(i))
	}
	status, out, err := call("GET", s.admit+"/v1/usage/"+agent, serviceToken, nil)
	require.NoError(t, err)
	require.Equal(t, 200, status, "%v", out)
	require.Equal(t, float64(1+n), out["units"].(map[string]any)["requests"].(map[string]any)["used"], "the warm-up and each key once")

	// The billing log cannot answer (its table locked, as a long ALTER would hold it): a key
	// it may hold is refused, 503 with Retry-After, and charged nothing; a key no filter
	// holds is decided without it.
	tx, err := s.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `LOCK TABLE usage_events IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	r := admitKeyed(t, s, agent, idem(1), 101)
	require.Equal(t, 503, r.status, r.raw)
	require.Equal(t, "idempotency_unverifiable", r.code, r.raw)
	require.Equal(t, "1", r.retryAfter)
	r = admitKeyed(t, s, agent, "fresh-"+name, 7)
	require.Equal(t, 200, r.status, "a key no filter holds needs no log: %s", r.raw)
	require.False(t, r.replayed)
	want[r.eventID] = s.sent("", agent, "fresh-"+name, "llm_call", map[string]int64{"tokens": 7, "credits": 3})
	require.NoError(t, tx.Rollback(ctx))
	r = admitKeyed(t, s, agent, idem(1), 101)
	require.Equal(t, 200, r.status, r.raw)
	require.Equal(t, first[1], r.eventID)

	status, out, err = call("GET", s.admit+"/v1/usage/"+agent, serviceToken, nil)
	require.NoError(t, err)
	require.Equal(t, 200, status, "%v", out)
	require.Equal(t, float64(2+n), out["units"].(map[string]any)["requests"].(map[string]any)["used"], "the 503 charged nothing")
	s.waitRows(t, want, time.Minute)
	t.Logf("%d keys answered with their first decision across a %s Kafka outage (hot window %s) and from the billing log after it, each charged once",
		n, outage.Round(100*time.Millisecond), idemHot)
}

// stackEnv is the value of the variable name in env (the last one set).
func stackEnv(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val
		}
	}
	return v
}

// keyedAnswer is what POST /v1/admit answered.
type keyedAnswer struct {
	status             int
	eventID, code, raw string
	replayed           bool
	retryAfter         string
}

// admitKeyed asks admit to admit one llm_call (3 credits) of tokens for account under idempotency key
// key ("" for none).
func admitKeyed(t *testing.T, s *stack, account, key string, tokens int64) keyedAnswer {
	t.Helper()
	b := map[string]any{"account": account, "tool": "llm_call", "units": map[string]int64{"tokens": tokens}}
	if key != "" {
		b["idempotency_key"] = key
	}
	raw, err := json.Marshal(b)
	require.NoError(t, err)
	req, err := http.NewRequest("POST", s.admit+"/v1/admit", bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+serviceToken)
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out struct {
		EventID  string `json:"event_id"`
		Replayed bool   `json:"replayed"`
		Error    struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &out) // a body that is not JSON fails the status checks
	return keyedAnswer{status: resp.StatusCode, eventID: out.EventID, code: out.Error.Code, raw: strings.TrimSpace(string(body)),
		replayed: out.Replayed, retryAfter: resp.Header.Get("Retry-After")}
}
