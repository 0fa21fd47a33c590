package chaos_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/testenv"
)

// Scenario 8: bad input, at both doors of the pipeline.
//
// (a) Requests generated from admit's OpenAPI document (every path and method it lists),
// each mutated from a seeded generator: wrong types, missing and unknown fields, huge,
// negative, quoted and fractional numbers, deep nesting, invalid UTF-8, long strings,
// control characters, truncated JSON, wrong content types, bodies over 64 KiB, hostile path
// parameters, wrong methods, and every kind of token (the right one, the other API's, none,
// garbage). No answer may be a 5xx, every 4xx is the documented JSON error, admit neither
// panics nor fails open, still admits afterwards, and the requests it did admit are rows
// exactly once.
//
// (b) Malformed messages produced straight to the stack's topic (not JSON, not a CloudEvent,
// CloudEvents with wrong types, missing fields, unknown types, empty, tombstones, huge),
// interleaved with admissions through the API: every malformed message is a dead letter,
// every admission a row, once, and an admission after them still becomes a row.
//
// The generator's seed is METERGATE_CHAOS_SEED (1 unless set); a failure names the seed and
// the index of each offending request.
func TestBadInput(t *testing.T) {
	t.Parallel()
	sc := begin(t, "8 bad input")
	start := time.Now()
	s := newStack(t, options{})
	org := "bad-org"
	key := s.account(org, "org", "", "enterprise", map[string]any{"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000}})

	// (a) hostile requests to admit's API.
	seed := uint64(chaosSeed(t, 1))
	spec := loadAPISpec(t)
	f := &fuzzer{spec: spec, org: org, key: key, run: testenv.Random(4), seed: seed}
	requests := pick(1_000, 10_000)
	fuzzStart := time.Now()
	fz := f.sendAll(t, s.admits[0].URL(), requests, 8)
	fuzzTook := time.Since(fuzzStart)

	t.Logf("bad input (seed %d): %d requests in %s; statuses %v; by operation %v", seed, requests, fuzzTook.Round(time.Millisecond), fz.res.Status, fz.byOp)
	sc.Requests, sc.Admitted, sc.FiveXX = requests, len(fz.res.Admitted), fz.res.FiveXX // so far, for a row that fails early
	// The document has every route admit serves and no other: the generator reaches them all.
	ops := make([]string, 0, len(spec.ops))
	for _, op := range spec.ops {
		ops = append(ops, op.String())
	}
	require.ElementsMatch(t, api.Operations(), ops, "the operations of openapi.yaml against admit's routes")
	assert.Zero(t, fz.transport, "requests without an answer (seed %d):\n%s", seed, fz.samples("transport"))
	assert.Zero(t, fz.res.FiveXX, "5xx answers (seed %d):\n%s", seed, fz.samples("5xx"))
	assert.Zero(t, fz.notJSON, "4xx answers that are not the JSON error of docs/admission.md (seed %d):\n%s", seed, fz.samples("4xx"))
	// Something of each kind was sent, and the generator reached past authentication.
	require.Positive(t, fz.res.Status[401], "some requests were refused for their token")
	require.Positive(t, fz.res.Status[400], "some requests were refused for their body")
	require.Positive(t, len(fz.res.Admitted), "some generated requests were valid admissions")

	// No panic, no decision that Redis could not take (a script the input broke would have
	// failed open or closed), and admit still admits.
	out := s.admits[0].Output()
	assert.NotContains(t, strings.ToLower(out), "panic", "admit's output:\n%s", logTail(out, 4000))
	metrics := scrapeMetrics(t, s.admits[0].URL())
	// internal/api has no panic counter (a recovered panic is a 500 "internal", counted above with
	// the 5xx, and an ERROR log line "handler panicked"); should one appear, it must be 0.
	assert.Zero(t, metricSum(metrics, "panic"), "panics in admit's metrics")
	assert.Zero(t, metricSum(metrics, "metergate_admit_fail_open_total"), "admissions decided without Redis while Redis was up: the input broke a decision\n%s", logTail(out, 4000))
	assert.Zero(t, metricSum(metrics, "metergate_admit_fail_closed_total"), "503s while Redis was up\n%s", logTail(out, 4000))
	require.Positive(t, metricSum(metrics, "metergate_admit_rejected_requests_total"), "admit counted the refused requests")
	afterFuzz := s.load(loadSpec{Requests: 1, Workers: 1, Keys: []string{key}})
	require.Equal(t, 1, afterFuzz.Status[200], "admit still admits after the bad input: %v", afterFuzz.Status)

	// (b) malformed messages on the topic, interleaved with admissions.
	malformed, admissions := pick(200, 1_000), pick(50, 250)
	kafkaStart := time.Now()
	w := &kafka.Writer{Addr: kafka.TCP(s.brokers...), Topic: s.topic, Balancer: &kafka.RoundRobin{},
		BatchSize: 1, BatchTimeout: 5 * time.Millisecond, BatchBytes: 2 << 20, RequiredAcks: kafka.RequireAll, MaxAttempts: 10}
	t.Cleanup(func() { _ = w.Close() })
	var (
		produced    []kafka.Message
		kinds       = map[string]int{}
		produceMu   sync.Mutex
		produceErrs []error
		rng         = rand.New(rand.NewPCG(seed, 1<<32))
		run         = testenv.Random(4)
	)
	produce := func(n int) {
		var batch []kafka.Message
		for range n {
			if len(produced)+len(batch) >= malformed {
				break
			}
			i := len(produced) + len(batch)
			kind, value := badMessage(rng, i, run)
			kinds[kind]++
			batch = append(batch, kafka.Message{Key: []byte(fmt.Sprintf("bad-%s-%d", run, i)), Value: value})
		}
		if len(batch) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := w.WriteMessages(ctx, batch...); err != nil {
			produceErrs = append(produceErrs, err)
			return
		}
		produced = append(produced, batch...)
	}
	perAdmission := (malformed + admissions - 1) / admissions
	interleaved := s.load(loadSpec{Requests: admissions, Workers: 4, Keys: []string{key}, Deadline: 3 * time.Minute,
		Progress: func(int) {
			produceMu.Lock()
			defer produceMu.Unlock()
			produce(perAdmission)
		}})
	produceMu.Lock()
	for len(produced) < malformed && len(produceErrs) == 0 {
		produce(perAdmission)
	}
	produceMu.Unlock()
	require.Empty(t, produceErrs, "produce the malformed messages")
	require.Len(t, produced, malformed)
	require.Equal(t, admissions, interleaved.Status[200], "every interleaved admission is admitted: %v", interleaved.Status)
	// The pipeline goes on: an admission after all of them becomes a row.
	last := s.load(loadSpec{Requests: 1, Workers: 1, Keys: []string{key}})
	require.Equal(t, 1, last.Status[200], "an admission after the malformed messages: %v", last.Status)

	// Every malformed message is a dead letter (by its unique Kafka key), nothing else is.
	want := map[string]bool{}
	for _, m := range produced {
		want[string(m.Key)] = true
	}
	ctx := testenv.Context(t, 5*time.Minute)
	var dead int
	deadline := time.Now().Add(3 * time.Minute)
	for {
		require.NoError(t, s.db.QueryRow(ctx, `select count(*) from dead_letters`).Scan(&dead))
		if dead >= malformed || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	rows, err := s.db.Query(ctx, `select coalesce(key, ''::bytea), "partition", "offset", error from dead_letters`)
	require.NoError(t, err)
	got := map[string]int{}
	var sample []string
	for rows.Next() {
		var (
			k      []byte
			p      int32
			off    int64
			reason string
		)
		require.NoError(t, rows.Scan(&k, &p, &off, &reason))
		got[string(k)]++
		if len(sample) < 3 {
			sample = append(sample, fmt.Sprintf("%d/%d: %.120s", p, off, reason))
		}
	}
	require.NoError(t, rows.Err())
	var missing, extra []string
	for k := range want {
		if got[k] != 1 {
			missing = append(missing, fmt.Sprintf("%s (%d rows)", k, got[k]))
		}
	}
	for k := range got {
		if !want[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "malformed messages that are not exactly one dead letter (kinds sent: %v)\nmeter:\n%s", kinds, logTail(s.meters[0].Output(), 4000))
	require.Empty(t, extra, "dead letters of messages that were not malformed")
	require.Equal(t, malformed, dead)
	kafkaTook := time.Since(kafkaStart)

	// The books: every request admitted in (a) and (b) is one row, and nothing else is.
	b := s.waitBooks(3*time.Minute, fz.res, afterFuzz, interleaved, last)
	sc.Requests, sc.Admitted, sc.FiveXX = 0, 0, 0
	sc.fill(b, fz.res, afterFuzz, interleaved, last)
	sc.Note = fmt.Sprintf("seed %d: %d generated requests over %d operations in %s, answers %v, %d admitted; "+
		"%d malformed Kafka messages of %d kinds → %d dead letters, with %d admissions interleaved (%s); %s in all",
		seed, requests, len(spec.ops), fuzzTook.Round(time.Millisecond), fz.res.Status, len(fz.res.Admitted),
		malformed, len(kinds), dead, admissions, kafkaTook.Round(time.Millisecond), time.Since(start).Round(time.Second))
	require.Zero(t, b.Lost, "lost")
	require.Zero(t, b.Duplicated, "duplicated (or a malformed message that became a row)")
	// The loads' rows hold what their callers sent (the fuzzer's own admissions, with bodies
	// it made up, are checked by id only).
	require.Zero(t, b.Wrong, "rows unlike the request their caller sent (sent → row):\n%s", strings.Join(b.WrongRows, "\n"))
	require.Positive(t, b.Checked)
	require.Equal(t, len(fz.res.ids())+len(afterFuzz.ids())+len(interleaved.ids())+len(last.ids()), b.Rows)
	t.Logf("dead letters, e.g.: %s", strings.Join(sample, "; "))
}

// Scenario 9: security. The tokens open only their own API; an API key cannot be read back
// from the database (only its SHA-256 is stored); account ids outside the allowed set are
// refused with 400 by the admin API and by POST /v1/admit and never reach Redis; a revoked
// key is refused within a second.
func TestSecurity(t *testing.T) {
	t.Parallel()
	sc := begin(t, "9 security")
	start := time.Now()
	s := newStack(t, options{})
	org := "sec-org"
	key := s.account(org, "org", "", "enterprise", map[string]any{"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000}})
	base := s.admits[0].URL()
	ctx := testenv.Context(t, 5*time.Minute)
	p := &prober{t: t, ctx: ctx, base: base}

	// Tokens.
	admitBody := map[string]any{"api_key": key, "units": map[string]any{"requests": 0}}
	decision := []struct {
		method, path string
		body         any
	}{
		{"POST", "/v1/admit", admitBody},
		{"POST", "/v1/outcomes", map[string]any{"event_id": "x", "status": 200}},
		{"GET", "/v1/usage/" + org, nil},
	}
	admin := []struct {
		method, path string
		body         any
	}{
		{"POST", "/v1/admin/accounts", map[string]any{"id": "sec-new", "kind": "org"}},
		{"GET", "/v1/admin/accounts/" + org, nil},
		{"PUT", "/v1/admin/accounts/" + org, map[string]any{"plan": "free"}},
		{"POST", "/v1/admin/api-keys", map[string]any{"account": org}},
		{"DELETE", "/v1/admin/api-keys/key_0000", nil},
	}
	for _, r := range append(append([]struct {
		method, path string
		body         any
	}{}, decision...), admin...) {
		p.expect(r.method, r.path, "", r.body, 401, "unauthorized")                         // no token
		p.expect(r.method, r.path, "wrong-"+testenv.Random(8), r.body, 401, "unauthorized") // a wrong token
		p.expect(r.method, r.path, serviceToken+"x", r.body, 401, "unauthorized")           // almost the right one
	}
	for _, r := range admin {
		p.expect(r.method, r.path, serviceToken, r.body, 403, "forbidden")
	}
	for _, r := range decision {
		p.expect(r.method, r.path, adminToken, r.body, 403, "forbidden")
	}
	// None of those did anything: the account is unchanged, no account was created.
	_, acct := p.expect("GET", "/v1/admin/accounts/"+org, adminToken, nil, 200, "")
	require.Equal(t, "enterprise", acct["plan"], "the PUT with a wrong token changed nothing")
	p.expect("GET", "/v1/admin/accounts/sec-new", adminToken, nil, 404, "not_found")

	// An API key cannot be recovered from the database: a second key, then every column of
	// every table of the schema.
	_, issued := p.expect("POST", "/v1/admin/api-keys", adminToken, map[string]any{"account": org}, 201, "")
	key2, _ := issued["api_key"].(string)
	key2ID, _ := issued["id"].(string)
	require.NotEmpty(t, key2)
	require.NotEmpty(t, key2ID)
	scanned := 0
	for _, k := range []string{key, key2} {
		var found []string
		scanned, found = scanSchema(t, s, k)
		require.Empty(t, found, "the plaintext API key is stored in the database")
		require.Greater(t, scanned, 20, "columns scanned")
	}
	// The scan does find what is there: the account id and the key's id (a positive control).
	_, found := scanSchema(t, s, key2ID)
	require.Contains(t, found, "api_keys.id", "the scan finds a value that is stored")
	var hash []byte
	require.NoError(t, s.db.QueryRow(ctx, `select hash from api_keys where id = $1`, key2ID).Scan(&hash))
	sum := sha256.Sum256([]byte(key2))
	require.Equal(t, sum[:], hash, "api_keys.hash is the SHA-256 of the key")
	require.NotContains(t, s.admits[0].Output(), key, "admit logged an API key")
	require.NotContains(t, s.admits[0].Output(), key2, "admit logged an API key")

	// Account ids outside [A-Za-z0-9][A-Za-z0-9._-]{0,63}.
	bad := []string{"a{b}", "x:y", "a b", "../x", "é", "a*", strings.Repeat("a", 300), "a{0}", "a\x00b", "a\nb", "-lead", ".x",
		"a/b", "mg:q", "a?b", "a%b", "a#b", "ä", "a\u200bb", "Ｏrg"}
	for _, id := range bad {
		p.expect("POST", "/v1/admin/accounts", adminToken, map[string]any{"id": id, "kind": "org"}, 400, "invalid_id")
		p.expect("POST", "/v1/admin/accounts", adminToken, map[string]any{"id": "sec-child", "kind": "team", "parent": id}, 400, "invalid_parent")
		p.expect("POST", "/v1/admin/api-keys", adminToken, map[string]any{"account": id}, 400, "invalid_account")
		p.expect("POST", "/v1/admit", serviceToken, map[string]any{"account": id}, 400, "invalid_account")
		p.expect("POST", "/v1/admit", serviceToken, map[string]any{"account": id, "idempotency_key": "sec-1", "units": map[string]any{"tokens": 5}}, 400, "invalid_account")
		// In a path: 400 or 404, never anything else (an id with a slash may also be another
		// route, or a redirect to the cleaned path).
		p.expectIn("GET", "/v1/usage/"+url.PathEscape(id), serviceToken, nil, 400, 404, 301, 307)
		p.expectIn("GET", "/v1/admin/accounts/"+url.PathEscape(id), adminToken, nil, 400, 404, 301, 307)
		p.expectIn("PUT", "/v1/admin/accounts/"+url.PathEscape(id), adminToken, map[string]any{"plan": "pro"}, 400, 404, 301, 307)
	}
	// A valid trusted admission, so that the stack has keys in Redis to look at.
	p.expect("POST", "/v1/admit", serviceToken, map[string]any{"account": org, "units": map[string]any{"tokens": 5}}, 200, "")
	prefix := stackEnv(s.env, "ADMIT_KEY_PREFIX")
	require.NotEmpty(t, prefix)
	rdb := testenv.Redis(t)
	var keys []string
	iter := rdb.Scan(ctx, 0, redisGlobEscape(prefix)+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	require.NoError(t, iter.Err())
	require.NotEmpty(t, keys, "the stack's Redis keys")
	require.True(t, anyHas(keys, ":"+org+":"), "the scan sees the valid account's keys: %v", keys)
	for _, id := range bad {
		for _, k := range keys {
			require.NotContains(t, k[len(prefix):], id, "an invalid account id reached Redis")
		}
	}
	accounts := 0
	require.NoError(t, s.db.QueryRow(ctx, `select count(*) from accounts`).Scan(&accounts))
	require.Equal(t, 1, accounts, "no account was created by the refused requests")

	// A revoked key: 403 revoked_api_key within a second.
	for {
		status, _ := p.send("POST", "/v1/admit", serviceToken, map[string]any{"api_key": key2, "units": map[string]any{"requests": 0}})
		if status == 200 {
			break
		}
		require.NoError(t, ctx.Err(), "admit never learned the second key (last %d)", status)
		time.Sleep(20 * time.Millisecond)
	}
	p.expect("DELETE", "/v1/admin/api-keys/"+key2ID, adminToken, nil, 204, "")
	revoked := time.Now()
	var (
		status int
		body   map[string]any
	)
	for {
		status, body = p.send("POST", "/v1/admit", serviceToken, map[string]any{"api_key": key2, "units": map[string]any{"requests": 0}})
		if status != 200 || time.Since(revoked) > 5*time.Second {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(revoked)
	require.Equal(t, 403, status, "a revoked key: %v", body)
	require.Equal(t, "revoked_api_key", errorCode(body))
	require.LessOrEqual(t, took, time.Second, "a revoked key is refused within a second")
	p.expect("POST", "/v1/admit", serviceToken, map[string]any{"api_key": key2}, 403, "revoked_api_key")
	p.expect("DELETE", "/v1/admin/api-keys/"+key2ID, adminToken, nil, 204, "") // revoking again is harmless
	p.expect("POST", "/v1/admit", serviceToken, map[string]any{"api_key": key, "units": map[string]any{"requests": 0}}, 200, "")

	sc.Requests, sc.FiveXX = p.requests, p.fiveXX
	sc.Note = fmt.Sprintf("%d probes: tokens 401/403; 2 API keys in none of %d columns, stored as SHA-256; %d invalid account ids refused (admin, admit) and absent from the stack's %d Redis keys; revoked key refused after %s; %s in all",
		p.requests, scanned, len(bad), len(keys), took.Round(time.Millisecond), time.Since(start).Round(time.Second))
	require.Zero(t, p.fiveXX, "5xx answers")
}

// prober sends the security scenario's probes and checks each answer.
type prober struct {
	t                *testing.T
	ctx              context.Context
	base             string
	requests, fiveXX int
}

// send sends one probe ("" token: no Authorization header).
func (p *prober) send(method, path, token string, body any) (int, map[string]any) {
	p.t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(p.t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(p.ctx, method, p.base+path, rd)
	require.NoError(p.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := fuzzClient.Do(req)
	require.NoError(p.t, err, "%s %s", method, path)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(p.t, err)
	p.requests++
	if resp.StatusCode >= 500 {
		p.fiveXX++
		p.t.Errorf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

// expect sends a probe and requires its status and, for an error, its code.
func (p *prober) expect(method, path, token string, body any, status int, code string) (int, map[string]any) {
	p.t.Helper()
	got, out := p.send(method, path, token, body)
	require.Equal(p.t, status, got, "%s %s %v (token %q): %v", method, path, body, shortToken(token), out)
	if code != "" {
		require.Equal(p.t, code, errorCode(out), "%s %s %v: %v", method, path, body, out)
	}
	return got, out
}

// expectIn sends a probe and requires one of the statuses; a 4xx must be a JSON error.
func (p *prober) expectIn(method, path, token string, body any, statuses ...int) {
	p.t.Helper()
	got, out := p.send(method, path, token, body)
	require.Contains(p.t, statuses, got, "%s %s: %v", method, path, out)
	if got >= 400 {
		require.NotEmpty(p.t, errorCode(out), "%s %s: %d without a JSON error", method, path, got)
	}
}

func shortToken(s string) string {
	if len(s) > 12 {
		return s[:12] + "…"
	}
	return s
}

// scanSchema looks for needle in every column of every table and view of the stack's
// schema (as text; bytea also as its bytes) and returns how many columns it read and the
// "table.column"s that hold it.
func scanSchema(t *testing.T, s *stack, needle string) (int, []string) {
	t.Helper()
	ctx := testenv.Context(t, 2*time.Minute)
	var schema string
	require.NoError(t, s.db.QueryRow(ctx, `select current_schema()`).Scan(&schema))
	require.True(t, strings.HasPrefix(schema, "test_"), "the stack's schema: %q", schema)
	rows, err := s.db.Query(ctx, `select table_name, column_name, data_type from information_schema.columns
		where table_schema = $1 order by table_name, ordinal_position`, schema)
	require.NoError(t, err)
	type column struct{ table, name, typ string }
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (column, error) {
		var c column
		return c, r.Scan(&c.table, &c.name, &c.typ)
	})
	require.NoError(t, err)
	var found []string
	hexNeedle := hex.EncodeToString([]byte(needle))
	b64 := base64.StdEncoding.EncodeToString([]byte(needle))
	for _, c := range cols {
		col := pgx.Identifier{schema, c.table}.Sanitize()
		name := pgx.Identifier{c.name}.Sanitize()
		var q string
		if c.typ == "bytea" {
			q = fmt.Sprintf(`select count(*) from %s where position($1::bytea in %s) > 0 or position($2 in encode(%s, 'hex')) > 0 or position($3 in %s::text) > 0`,
				col, name, name, name)
		} else {
			q = fmt.Sprintf(`select count(*) from %s where position($1 in %s::text) > 0 or position($2 in %s::text) > 0 or position($3 in %s::text) > 0`,
				col, name, name, name)
		}
		var n int
		var err error
		if c.typ == "bytea" {
			err = s.db.QueryRow(ctx, q, []byte(needle), hexNeedle, b64).Scan(&n)
		} else {
			err = s.db.QueryRow(ctx, q, needle, hexNeedle, b64).Scan(&n)
		}
		require.NoError(t, err, "%s.%s", c.table, c.name)
		if n > 0 {
			found = append(found, c.table+"."+c.name)
		}
	}
	return len(cols), found
}

func stackEnv(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

func redisGlobEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func anyHas(xs []string, sub string) bool {
	for _, x := range xs {
		if strings.Contains(x, sub) {
			return true
		}
	}
	return false
}

func logTail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// scrape reads a node's /metrics.
func scrapeMetrics(t *testing.T, base string) string {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/metrics", nil)
	require.NoError(t, err)
	resp, err := fuzzClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	return string(raw)
}

// metricSum adds the values of every series (in the text format) of the metrics whose name
// contains name.
func metricSum(text, name string) float64 {
	total := 0.0
	for _, line := range strings.Split(text, "\n") {
		metric, _, _ := strings.Cut(line, "{")
		metric, _, _ = strings.Cut(metric, " ")
		if strings.HasPrefix(line, "#") || !strings.Contains(metric, name) {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err == nil {
			total += v
		}
	}
	return total
}

// fuzzClient never follows redirects: a 3xx is an answer like any other.
var fuzzClient = &http.Client{
	Transport:     &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
	Timeout:       time.Minute,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// The OpenAPI document, as the generator sees it.

type apiOp struct {
	method, path string   // as in the document: "post", "/v1/usage/{account}"
	params       []string // path parameters
	security     string   // "serviceToken", "adminToken" or "" (none)
	body         map[string]any
}

func (o apiOp) String() string { return strings.ToUpper(o.method) + " " + o.path }

type apiSpec struct {
	doc map[string]any
	ops []apiOp
}

func loadAPISpec(t *testing.T) *apiSpec {
	t.Helper()
	raw, err := os.ReadFile("../internal/api/openapi.yaml")
	require.NoError(t, err)
	sp := &apiSpec{}
	require.NoError(t, yaml.Unmarshal(raw, &sp.doc))
	global := securityOf(sp.doc["security"])
	paths, _ := sp.doc["paths"].(map[string]any)
	require.NotEmpty(t, paths, "openapi.yaml has paths")
	names := make([]string, 0, len(paths))
	for p := range paths {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, path := range names {
		item, _ := paths[path].(map[string]any)
		for _, method := range []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"} {
			op, ok := item[method].(map[string]any)
			if !ok {
				continue
			}
			o := apiOp{method: method, path: path, security: global}
			if sec, ok := op["security"]; ok {
				o.security = securityOf(sec)
			}
			for _, list := range []any{item["parameters"], op["parameters"]} {
				ps, _ := list.([]any)
				for _, p := range ps {
					pm := sp.resolve(p.(map[string]any))
					if pm["in"] == "path" {
						o.params = append(o.params, pm["name"].(string))
					}
				}
			}
			if rb, ok := op["requestBody"].(map[string]any); ok {
				content, _ := sp.resolve(rb)["content"].(map[string]any)
				if js, ok := content["application/json"].(map[string]any); ok {
					o.body = sp.resolve(js["schema"].(map[string]any))
				}
			}
			sp.ops = append(sp.ops, o)
		}
	}
	return sp
}

func securityOf(v any) string {
	list, ok := v.([]any)
	if !ok || len(list) == 0 {
		return ""
	}
	for name := range list[0].(map[string]any) {
		return name
	}
	return ""
}

// resolve follows $ref (within the document) until the schema is not a reference.
func (sp *apiSpec) resolve(s map[string]any) map[string]any {
	for {
		ref, ok := s["$ref"].(string)
		if !ok {
			return s
		}
		var node any = sp.doc
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			node = node.(map[string]any)[part]
		}
		s = node.(map[string]any)
	}
}

// The generator.

// raw is a JSON fragment written as is (possibly not JSON at all).
type rawJSON string

// encodeJSON writes v as JSON; raw fragments are copied verbatim.
func encodeJSON(buf *bytes.Buffer, v any) {
	switch x := v.(type) {
	case rawJSON:
		buf.WriteString(string(x))
	case json.Number:
		buf.WriteString(string(x))
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			encodeJSON(buf, k)
			buf.WriteByte(':')
			encodeJSON(buf, x[k])
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			encodeJSON(buf, e)
		}
		buf.WriteByte(']')
	default:
		b, _ := json.Marshal(x)
		buf.Write(b)
	}
}

var accountIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

type fuzzer struct {
	spec     *apiSpec
	org, key string
	run      string
	seed     uint64
	mu       sync.Mutex
	events   []string // event ids admitted so far, for outcomes
}

// fuzzReq is one generated request.
type fuzzReq struct {
	i            int
	op           apiOp
	method, path string
	header       http.Header
	body         []byte
	chunked      bool
	what         []string // the mutations applied
}

// fuzzResult is what the generated requests got.
type fuzzResult struct {
	mu        sync.Mutex
	res       *loadResult
	byOp      map[string]int
	transport int
	notJSON   int
	bad       map[string][]string // samples by kind of failure
	classes   map[string]int      // failures by kind, status and body
}

func (r *fuzzResult) sample(kind, s string) {
	if len(r.bad[kind]) < 12 {
		r.bad[kind] = append(r.bad[kind], s)
	}
}

func (r *fuzzResult) samples(kind string) string {
	var classes []string
	for c, n := range r.classes {
		if strings.HasPrefix(c, kind+" ") {
			classes = append(classes, fmt.Sprintf("  %5d × %s", n, c))
		}
	}
	sort.Strings(classes)
	return "by answer:\n" + strings.Join(classes, "\n") + "\nsamples:\n" + strings.Join(r.bad[kind], "\n")
}

// run sends n generated requests with the given concurrency.
func (f *fuzzer) sendAll(t *testing.T, base string, n, workers int) *fuzzResult {
	t.Helper()
	out := &fuzzResult{res: &loadResult{Requests: n, Admitted: map[string]string{}, Status: map[int]int{}},
		byOp: map[string]int{}, bad: map[string][]string{}, classes: map[string]int{}}
	ctx := testenv.Context(t, 10*time.Minute)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				f.send(ctx, base, f.generate(i), out)
			}
		}()
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "the generated requests did not finish in time")
	return out
}

func (f *fuzzer) send(ctx context.Context, base string, q fuzzReq, out *fuzzResult) {
	var body io.Reader
	if q.body != nil {
		body = bytes.NewReader(q.body)
		if q.chunked {
			body = io.MultiReader(body) // no length: Transfer-Encoding: chunked
		}
	}
	desc := func() string {
		b := q.body
		if len(b) > 200 {
			b = append(append([]byte{}, b[:200]...), "…"...)
		}
		return fmt.Sprintf("#%d %s %s %v auth=%.40q ct=%q body(%d)=%q", q.i, q.method, q.path, q.what,
			q.header.Get("Authorization"), q.header.Get("Content-Type"), len(q.body), b)
	}
	req, err := http.NewRequestWithContext(ctx, q.method, base+q.path, body)
	if err != nil {
		out.mu.Lock()
		out.transport++
		out.sample("transport", desc()+": "+err.Error())
		out.mu.Unlock()
		return
	}
	req.Header = q.header
	resp, err := fuzzClient.Do(req)
	var (
		rawBody []byte
		status  int
		ctype   string
	)
	if err == nil {
		rawBody, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		status, ctype = resp.StatusCode, resp.Header.Get("Content-Type")
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	out.byOp[q.op.String()]++
	if err != nil {
		out.transport++
		out.sample("transport", desc()+": "+err.Error())
		return
	}
	out.res.Status[status]++
	if status >= 500 {
		out.res.FiveXX++
		out.sample("5xx", fmt.Sprintf("%s → %d %.200s", desc(), status, rawBody))
		out.classes[fmt.Sprintf("5xx %s → %d %.80s", q.op, status, rawBody)]++
	}
	if status >= 400 && status < 500 && q.method != "HEAD" {
		var e struct {
			Error *struct {
				Code    *string `json:"code"`
				Message *string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(rawBody, &e) != nil || e.Error == nil || e.Error.Code == nil || *e.Error.Code == "" ||
			e.Error.Message == nil || !strings.HasPrefix(ctype, "application/json") {
			out.notJSON++
			out.sample("4xx", fmt.Sprintf("%s → %d %q %.200q", desc(), status, ctype, rawBody))
			out.classes[fmt.Sprintf("4xx %d %q %.60q", status, ctype, rawBody)]++
		}
	}
	if status == 200 && q.method == "POST" && strings.HasPrefix(q.path, "/v1/admit") {
		var reply struct {
			Decision string `json:"decision"`
			EventID  string `json:"event_id"`
		}
		if json.Unmarshal(rawBody, &reply) == nil && reply.Decision == "allow" && reply.EventID != "" {
			out.res.Admitted[fmt.Sprintf("fuzz-%d", q.i)] = reply.EventID
			f.mu.Lock()
			f.events = append(f.events, reply.EventID)
			f.mu.Unlock()
		} else {
			out.sample("5xx", fmt.Sprintf("%s → 200 without an event id: %.200s", desc(), rawBody))
			out.res.FiveXX++ // counted as a failure: a 200 admission must carry its event id
		}
	}
}

// generate builds request i from the seed alone (the same seed gives the same requests,
// except event ids for outcomes, which are the ones admitted so far).
func (f *fuzzer) generate(i int) fuzzReq {
	r := rand.New(rand.NewPCG(f.seed, uint64(i)))
	// POST /v1/admit is the main door: it gets a larger share, a fifth of the requests
	// however many routes the admin API grows.
	weights := make([]int, len(f.spec.ops))
	total := 0
	for j, op := range f.spec.ops {
		weights[j] = 1
		switch op.String() {
		case "POST /v1/admit":
			weights[j] = max(5, len(f.spec.ops)/3)
		case "POST /v1/outcomes", "GET /v1/usage/{account}":
			weights[j] = 2
		}
		total += weights[j]
	}
	x := r.IntN(total)
	var op apiOp
	for j, w := range weights {
		if x < w {
			op = f.spec.ops[j]
			break
		}
		x -= w
	}
	q := fuzzReq{i: i, op: op, method: strings.ToUpper(op.method), header: http.Header{}}

	// The path, with its parameters.
	path := op.path
	for _, name := range op.params {
		var v string
		if r.IntN(3) == 0 {
			v = hostilePathParam(r)
			q.what = append(q.what, "path param "+name)
		} else {
			v = url.PathEscape(f.goodParam(r, op, name))
		}
		path = strings.Replace(path, "{"+name+"}", v, 1)
	}
	if r.IntN(25) == 0 {
		path = mutatePath(r, path)
		q.what = append(q.what, "path")
	}
	if r.IntN(10) == 0 {
		path += "?" + []string{"x=1", "api_key=" + f.key, "account=../x", "%00", "a=%ff", strings.Repeat("q", 4000)}[r.IntN(6)]
	}
	q.path = path

	// The method.
	if r.IntN(12) == 0 {
		q.method = []string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "get", "FOO", "PROPFIND"}[r.IntN(11)]
		q.what = append(q.what, "method "+q.method)
	}

	// The token.
	q.what = append(q.what, f.auth(r, op, q.header))

	// The content type.
	ct := "application/json"
	if r.IntN(5) == 0 {
		ct = []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
			"application/json; charset=utf-16", "application/xml", "application/json, text/plain", "*/*",
			strings.Repeat("a/b;", 500), "application/jsonéü"}[r.IntN(10)]
		q.what = append(q.what, "content type")
	}
	if ct != "" {
		q.header.Set("Content-Type", ct)
	}

	// The body: a valid instance of the operation's schema, then mutations.
	var body any
	hasBody := op.body != nil
	if hasBody {
		body = f.value(r, i, "", op.body, 0)
		// AdmitRequest: "Give api_key, or account" (the schema cannot say one of two).
		if m, ok := body.(map[string]any); ok && m["api_key"] != nil && m["account"] != nil && r.IntN(5) > 0 {
			delete(m, []string{"api_key", "account"}[r.IntN(2)])
		}
	} else if r.IntN(5) == 0 {
		body = hostileValue(r)
		hasBody = true
		q.what = append(q.what, "unexpected body")
	}
	if hasBody {
		mutations := max(0, r.IntN(5)-1) // 0 (two in five): the valid instance as is
		for range mutations {
			var what string
			body, what = mutateValue(r, body)
			q.what = append(q.what, what)
		}
		var buf bytes.Buffer
		encodeJSON(&buf, body)
		b := buf.Bytes()
		if r.IntN(5) == 0 {
			var what string
			b, what = mutateBytes(r, b)
			q.what = append(q.what, what)
		}
		q.body = b
		q.chunked = r.IntN(10) == 0
	}
	if len(q.what) == 1 && q.what[0] == "token ok" {
		q.what = append(q.what, "valid")
	}
	return q
}

// auth sets the Authorization header (or not) and says what it chose.
func (f *fuzzer) auth(r *rand.Rand, op apiOp, h http.Header) string {
	right, other := serviceToken, adminToken
	switch op.security {
	case "adminToken":
		right, other = adminToken, serviceToken
	case "":
		if r.IntN(2) == 0 {
			right, other = other, right
		}
	}
	switch n := r.IntN(20); {
	case n < 10:
		h.Set("Authorization", "Bearer "+right)
		return "token ok"
	case n < 12:
		h.Set("Authorization", "Bearer "+other)
		return "token of the other API"
	case n == 12:
		return "no token"
	case n == 13:
		h.Set("Authorization", "Bearer ")
		return "empty token"
	case n == 14:
		h.Set("Authorization", "Bearer "+hex.EncodeToString(fuzzBytes(r, 16)))
		return "random token"
	case n == 15:
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("admin:"+right)))
		return "basic auth"
	case n == 16:
		h.Set("Authorization", "Bearer "+right[:len(right)-1]+string(rune('a'+r.IntN(26))))
		return "near-miss token"
	case n == 17:
		h.Set("Authorization", "Bearer "+strings.Repeat(right, 300))
		return "long token"
	case n == 18:
		h.Set("Authorization", []string{"Bearer tökén-" + right, right, "bearer " + right, "Bearer  " + right, "Bearer\t" + right}[r.IntN(5)])
		return "odd token"
	default:
		h.Add("Authorization", "Bearer "+other)
		h.Add("Authorization", "Bearer "+right)
		return "two tokens"
	}
}

// goodParam is a plausible value of a path parameter: never the scenario's own account for
// a write (a PUT could lower its limits) nor its key (a DELETE would revoke it).
func (f *fuzzer) goodParam(r *rand.Rand, op apiOp, name string) string {
	if name == "account" && r.IntN(2) == 0 {
		return f.org
	}
	if op.method == "get" && name == "id" && r.IntN(2) == 0 {
		return f.org
	}
	if strings.Contains(op.path, "api-keys") {
		return "key_" + hex.EncodeToString(fuzzBytes(r, 8))
	}
	return fmt.Sprintf("fz-%s-%d", f.run, r.IntN(1000))
}

// value is a valid instance of schema (name is the property it is for).
func (f *fuzzer) value(r *rand.Rand, i int, name string, schema map[string]any, depth int) any {
	schema = f.spec.resolve(schema)
	switch name {
	case "api_key":
		if r.IntN(3) > 0 {
			return f.key
		}
	case "account":
		if r.IntN(3) > 0 {
			return f.org
		}
	case "idempotency_key":
		return fmt.Sprintf("fz-%s-%d", f.run, i)
	case "tool":
		return []string{"web_search", "llm_call", "code_execute", "image_generate", "teleport"}[r.IntN(5)]
	case "event_id":
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.events) > 0 && r.IntN(3) > 0 {
			return f.events[r.IntN(len(f.events))]
		}
	case "parent":
		if r.IntN(2) == 0 {
			return f.org
		}
	case "plan":
		return []string{"free", "pro", "enterprise", "platinum"}[r.IntN(4)]
	case "id":
		return fmt.Sprintf("fz-%s-%d", f.run, i)
	}
	if enum, ok := schema["enum"].([]any); ok && len(enum) > 0 {
		return enum[r.IntN(len(enum))]
	}
	typ, _ := schema["type"].(string)
	if typ == "" {
		if _, ok := schema["properties"]; ok {
			typ = "object"
		} else if all, ok := schema["allOf"].([]any); ok && len(all) > 0 {
			return f.value(r, i, name, all[0].(map[string]any), depth)
		}
	}
	switch typ {
	case "object":
		out := map[string]any{}
		required := map[string]bool{}
		if req, ok := schema["required"].([]any); ok {
			for _, x := range req {
				required[x.(string)] = true
			}
		}
		props, _ := schema["properties"].(map[string]any)
		names := make([]string, 0, len(props))
		for p := range props {
			names = append(names, p)
		}
		sort.Strings(names)
		for _, p := range names {
			if required[p] || r.IntN(3) > 0 {
				out[p] = f.value(r, i, p, props[p].(map[string]any), depth+1)
			}
		}
		if ap, ok := schema["additionalProperties"].(map[string]any); ok && depth < 4 {
			for range r.IntN(3) {
				k := []string{"requests", "tokens", "credits", "cost_micros"}[r.IntN(4)]
				out[k] = f.value(r, i, k, ap, depth+1)
			}
		}
		return out
	case "array":
		items, _ := schema["items"].(map[string]any)
		var out []any
		for range r.IntN(3) {
			out = append(out, f.value(r, i, name, items, depth+1))
		}
		return out
	case "integer":
		lo, hi := 0, 1000
		if m, ok := schema["minimum"].(int); ok {
			lo = m
		}
		if m, ok := schema["maximum"].(int); ok {
			hi = m
		}
		if name == "requests" || name == "units" {
			hi = min(hi, 3)
		}
		return json.Number(strconv.Itoa(lo + r.IntN(hi-lo+1)))
	case "number":
		return json.Number(strconv.FormatFloat(r.Float64()*1000, 'f', -1, 64))
	case "boolean":
		return r.IntN(2) == 0
	case "string":
		if pat, ok := schema["pattern"].(string); ok && pat == accountIDPattern.String() {
			return fmt.Sprintf("fz%d-%s", r.IntN(100000), hex.EncodeToString(fuzzBytes(r, 3)))
		}
		return hex.EncodeToString(fuzzBytes(r, 1+r.IntN(12)))
	}
	return nil
}

func fuzzBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.IntN(256))
	}
	return b
}

// hostileValue is one value of the kinds that break parsers.
func hostileValue(r *rand.Rand) any {
	switch r.IntN(16) {
	case 0: // wrong types
		return []any{true, false, nil, map[string]any{}, []any{}, []any{json.Number("1"), "a"}, map[string]any{"a": json.Number("1")}}[r.IntN(7)]
	case 1: // huge numbers
		return json.Number([]string{"1e308", "9223372036854775807", "9223372036854775808", "18446744073709551616",
			"123456789012345678901234567890", "1e400", "-9223372036854775809", "99999999999999999999999999999999999999"}[r.IntN(8)])
	case 2: // negative
		return json.Number([]string{"-1", "-9223372036854775808", "-0", "-1000000"}[r.IntN(4)])
	case 3: // numbers as strings
		return []string{"1", "0", "-1", "1e3", "9223372036854775808", "0x10", " 5"}[r.IntN(7)]
	case 4: // floats
		return json.Number([]string{"1.5", "0.1", "1e3", "1E2", "2.0", "-0.0", "1e-400", "0.9999999999999999999"}[r.IntN(8)])
	case 5: // deep nesting
		n := []int{64, 1000, 5000, 10001, 20000, 30000}[r.IntN(6)]
		if r.IntN(2) == 0 {
			return rawJSON(strings.Repeat("[", n) + strings.Repeat("]", n))
		}
		return rawJSON(strings.Repeat(`{"a":`, n/4) + "1" + strings.Repeat("}", n/4))
	case 6: // long strings
		return strings.Repeat(string(rune('a'+r.IntN(26))), []int{256, 257, 1000, 10_000, 60_000, 70_000}[r.IntN(6)])
	case 7: // control characters
		return []string{"\x00", "a\x00b", "\x01\x02\x1b[31m", "\r\n", "\t", "\u2028\u2029", "\x7f", "a\nb"}[r.IntN(8)]
	case 8: // unicode
		return []string{"é", "ümlaut", "😀", "\u202eevil", "a\u200bb", "ＡＢＣ", "İ", "\ufeff", "𝕏", "ä"}[r.IntN(10)]
	case 9: // invalid UTF-8 and lone surrogates, raw
		return rawJSON([]string{"\"\xff\xfe\"", "\"a\xc3\x28b\"", "\"\xed\xa0\x80\"", `"\ud800"`, `"\udc00x"`, "\"\xc0\xaf\""}[r.IntN(6)])
	case 10: // injection
		return []string{"'; DROP TABLE accounts; --", `" OR 1=1 --`, "${jndi:ldap://x/a}", "{{7*7}}", "%s%s%n", "../../etc/passwd",
			"<script>alert(1)</script>", "*", "mg{0}:q:*", "\r\nX-Injected: 1", "key_0000", "null", "NaN", "a{1}b"}[r.IntN(14)]
	case 11: // not JSON values
		return rawJSON([]string{"NaN", "Infinity", "-", "01", "1.", ".5", "+1", "0x10", "undefined", "'a'", "tru", "nul"}[r.IntN(12)])
	case 12: // empty
		return []any{"", map[string]any{}, []any{}}[r.IntN(3)]
	case 13:
		return nil
	case 14: // a big array of numbers
		parts := make([]string, 1+r.IntN(5000))
		for i := range parts {
			parts[i] = strconv.Itoa(r.IntN(1000))
		}
		return rawJSON("[" + strings.Join(parts, ",") + "]")
	default: // an object of hostile keys
		return map[string]any{"__proto__": map[string]any{"admin": true}, "constructor": json.Number("1"), "": "empty key", "\u0000": "nul key"}
	}
}

// jsonSlot is a place in a decoded JSON value.
type jsonSlot struct {
	get    func() any
	set    func(any)
	del    func()         // nil for the root and array elements
	object map[string]any // the value, when it is an object
}

func jsonSlots(root *any) []jsonSlot {
	var out []jsonSlot
	var walk func(get func() any, set func(any), del func())
	walk = func(get func() any, set func(any), del func()) {
		v := get()
		s := jsonSlot{get: get, set: set, del: del}
		if m, ok := v.(map[string]any); ok {
			s.object = m
		}
		out = append(out, s)
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(func() any { return x[k] }, func(v any) { x[k] = v }, func() { delete(x, k) })
			}
		case []any:
			for j := range x {
				walk(func() any { return x[j] }, func(v any) { x[j] = v }, nil)
			}
		}
	}
	walk(func() any { return *root }, func(v any) { *root = v }, nil)
	return out
}

// mutateValue applies one mutation to the value and says which.
func mutateValue(r *rand.Rand, v any) (any, string) {
	root := v
	slots := jsonSlots(&root)
	s := slots[r.IntN(len(slots))]
	switch r.IntN(5) {
	case 0, 1:
		s.set(hostileValue(r))
		return root, "hostile value"
	case 2:
		if s.del != nil {
			s.del()
			return root, "missing field"
		}
		fallthrough
	case 3:
		var objs []map[string]any
		for _, x := range slots {
			if x.object != nil {
				objs = append(objs, x.object)
			}
		}
		if len(objs) > 0 {
			name := []string{"extra", "API_KEY", "Account", "units ", "__proto__", "admin", "api_key\u0000", "é"}[r.IntN(8)]
			objs[r.IntN(len(objs))][name] = hostileValue(r)
			return root, "extra field"
		}
		fallthrough
	default: // the same value as another JSON type
		switch x := s.get().(type) {
		case string:
			if _, err := strconv.Atoi(x); err == nil {
				s.set(json.Number(x))
			} else {
				s.set([]any{x})
			}
		case json.Number:
			s.set(string(x))
		case map[string]any:
			s.set([]any{x})
		case []any:
			s.set(map[string]any{"0": x})
		case bool:
			s.set(strconv.FormatBool(x))
		default:
			s.set(json.Number("0"))
		}
		return root, "wrong type"
	}
}

// mutateBytes breaks the encoded body itself.
func mutateBytes(r *rand.Rand, b []byte) ([]byte, string) {
	switch r.IntN(9) {
	case 0:
		if len(b) > 1 {
			return b[:r.IntN(len(b))], "truncated"
		}
		return b, "truncated"
	case 1:
		at := r.IntN(len(b) + 1)
		bad := []string{"\xff", "\xfe\xff", "\xc3\x28", "\xed\xa0\x80", "\x00", "\x01"}[r.IntN(6)]
		return append(append(append([]byte{}, b[:at]...), bad...), b[at:]...), "raw bytes inserted"
	case 2:
		return append(b, []string{"}", ",", `{"a":1}`, "\x00", " garbage", "\n\n[]"}[r.IntN(6)]...), "trailing data"
	case 3:
		return append([]byte("\xef\xbb\xbf"), b...), "BOM"
	case 4:
		return []byte([]string{"", "null", "[]", `"x"`, "0", "true", "{", "}", "{}", `{"a":}`, "garbage", "<xml/>",
			"a=b&c=d", "\x00\x00\x00", `{"api_key":`, "[{}]"}[r.IntN(16)]), "other body"
	case 5: // over 64 KiB
		size := []int{64<<10 + 1, 64<<10 + 2, 100 << 10, 300 << 10}[r.IntN(4)]
		if r.IntN(2) == 0 {
			return append(b, bytes.Repeat([]byte(" "), max(0, size-len(b)))...), "huge body (whitespace)"
		}
		return []byte(`{"api_key":"` + strings.Repeat("k", size) + `"}`), "huge body (string)"
	case 6: // exactly 64 KiB: still accepted as a size
		if len(b) < 64<<10 {
			return append(b, bytes.Repeat([]byte(" "), 64<<10-len(b))...), "64 KiB body"
		}
		return b, "64 KiB body"
	case 7:
		if len(b) > 0 && b[0] == '{' {
			return append([]byte(`{"api_key":"dup","account":"dup",`), b[1:]...), "duplicate keys"
		}
		return b, "duplicate keys"
	default:
		return bytes.Repeat(b, 2), "two bodies"
	}
}

// hostilePathParam is an escaped path segment (or several).
func hostilePathParam(r *rand.Rand) string {
	return []string{"..", "../", "..%2F..%2Fetc%2Fpasswd", "%2e%2e", "%00", "a%00b", "%ff", "%c3%28", "%C3%A9", "%F0%9F%98%80",
		"a%20b", "a%2Fb", "x:y", "a%7Bb%7D", "*", "a*", strings.Repeat("a", 300), strings.Repeat("%41", 2000), "%2525", "%25zz",
		".", "-lead", "a%0Ab", "a%0D%0AX:1", "%E2%80%AE", "key_0000", "a;b", "a,b", "%25", "~"}[r.IntN(30)]
}

// mutatePath changes the route itself.
func mutatePath(r *rand.Rand, p string) string {
	switch r.IntN(6) {
	case 0:
		return p + "/"
	case 1:
		return strings.ToUpper(p)
	case 2:
		return strings.Replace(p, "/", "//", 2)
	case 3:
		return p + "/../" + p[strings.LastIndex(p, "/")+1:]
	case 4:
		return p + "%00"
	default:
		return strings.Replace(p, "/v1/", "/v2/", 1)
	}
}

// badMessage is malformed message i for the topic: every one must be a dead letter.
func badMessage(r *rand.Rand, i int, run string) (string, []byte) {
	id := fmt.Sprintf("0190a2b4-0000-7000-8000-%012d.0.bad-kafka-%s", i, run)
	now := time.Now().UTC()
	admitted := func() map[string]any {
		return map[string]any{
			"specversion": "1.0", "id": id, "source": "chaos", "type": "io.metergate.usage.admitted.v1",
			"subject": "kx", "time": now.Format(time.RFC3339Nano), "datacontenttype": "application/json",
			"data": map[string]any{"org": "kx", "account": "kx", "path": []any{map[string]any{"account": "kx", "kind": "org"}},
				"units": map[string]any{"requests": json.Number("1")}, "period": period.MonthLabel(now), "plan": "pro"},
		}
	}
	outcome := func() map[string]any {
		return map[string]any{
			"specversion": "1.0", "id": id + "/outcome", "source": "chaos", "type": "io.metergate.usage.outcome.v1",
			"time": now.Format(time.RFC3339Nano), "datacontenttype": "application/json",
			"data": map[string]any{"event_id": id, "status": json.Number("200"), "units": map[string]any{"tokens": json.Number("5")}},
		}
	}
	enc := func(v any) []byte {
		var buf bytes.Buffer
		encodeJSON(&buf, v)
		return buf.Bytes()
	}
	data := func(m map[string]any) map[string]any { return m["data"].(map[string]any) }
	with := func(m map[string]any, f func(map[string]any)) []byte { f(m); return enc(m) }
	cases := []struct {
		kind  string
		value func() []byte
	}{
		{"not json", func() []byte { return []byte(fmt.Sprintf("this is not json %d", i)) }},
		{"binary", func() []byte { return append([]byte{0xff, 0x00}, fuzzBytes(r, 64)...) }},
		{"empty", func() []byte { return []byte{} }},
		{"tombstone", func() []byte { return nil }},
		{"json array", func() []byte { return []byte(`[1,2,3]`) }},
		{"json string", func() []byte { return []byte(`"hello"`) }},
		{"json number", func() []byte { return []byte(`42`) }},
		{"json null", func() []byte { return []byte(`null`) }},
		{"not a cloudevent", func() []byte { return []byte(`{"hello":"world","n":1}`) }},
		{"truncated", func() []byte { b := enc(admitted()); return b[:len(b)/2] }},
		{"specversion 0.3", func() []byte { return with(admitted(), func(m map[string]any) { m["specversion"] = "0.3" }) }},
		{"specversion a number", func() []byte {
			return with(admitted(), func(m map[string]any) { m["specversion"] = json.Number("1.0") })
		}},
		{"no id", func() []byte { return with(admitted(), func(m map[string]any) { delete(m, "id") }) }},
		{"id with spaces", func() []byte { return with(admitted(), func(m map[string]any) { m["id"] = "an id" }) }},
		{"id a number", func() []byte { return with(admitted(), func(m map[string]any) { m["id"] = json.Number("7") }) }},
		{"id too long", func() []byte { return with(admitted(), func(m map[string]any) { m["id"] = strings.Repeat("i", 300) }) }},
		{"id invalid utf-8", func() []byte { return with(admitted(), func(m map[string]any) { m["id"] = rawJSON("\"id\xff\xfe\"") }) }},
		{"no source", func() []byte { return with(admitted(), func(m map[string]any) { delete(m, "source") }) }},
		{"source control char", func() []byte { return with(admitted(), func(m map[string]any) { m["source"] = "a\x01b" }) }},
		{"datacontenttype xml", func() []byte { return with(admitted(), func(m map[string]any) { m["datacontenttype"] = "text/xml" }) }},
		{"no time", func() []byte { return with(admitted(), func(m map[string]any) { delete(m, "time") }) }},
		{"time garbage", func() []byte { return with(admitted(), func(m map[string]any) { m["time"] = "yesterday" }) }},
		{"time 1970", func() []byte { return with(admitted(), func(m map[string]any) { m["time"] = "1970-01-01T00:00:00Z" }) }},
		{"time 2300", func() []byte { return with(admitted(), func(m map[string]any) { m["time"] = "2300-01-01T00:00:00Z" }) }},
		{"time zero", func() []byte { return with(admitted(), func(m map[string]any) { m["time"] = "0001-01-01T00:00:00Z" }) }},
		{"time a number", func() []byte {
			return with(admitted(), func(m map[string]any) { m["time"] = json.Number("1700000000") })
		}},
		{"no data", func() []byte { return with(admitted(), func(m map[string]any) { delete(m, "data") }) }},
		{"data a string", func() []byte { return with(admitted(), func(m map[string]any) { m["data"] = "{}" }) }},
		{"data an array", func() []byte { return with(admitted(), func(m map[string]any) { m["data"] = []any{} }) }},
		{"data null", func() []byte { return with(admitted(), func(m map[string]any) { m["data"] = nil }) }},
		{"no type", func() []byte { return with(admitted(), func(m map[string]any) { delete(m, "type") }) }},
		{"unknown type", func() []byte {
			return with(admitted(), func(m map[string]any) { m["type"] = "io.metergate.usage.admitted.v2" })
		}},
		{"type a number", func() []byte { return with(admitted(), func(m map[string]any) { m["type"] = json.Number("1") }) }},
		{"no org", func() []byte { return with(admitted(), func(m map[string]any) { delete(data(m), "org") }) }},
		{"org a number", func() []byte { return with(admitted(), func(m map[string]any) { data(m)["org"] = json.Number("1") }) }},
		{"no path", func() []byte { return with(admitted(), func(m map[string]any) { delete(data(m), "path") }) }},
		{"path not starting at org", func() []byte {
			return with(admitted(), func(m map[string]any) { data(m)["org"] = "other" })
		}},
		{"path account invalid", func() []byte {
			return with(admitted(), func(m map[string]any) {
				data(m)["org"], data(m)["account"] = "a b", "a b"
				data(m)["path"] = []any{map[string]any{"account": "a b", "kind": "org"}}
			})
		}},
		{"path account 300 chars", func() []byte {
			return with(admitted(), func(m map[string]any) {
				long := strings.Repeat("a", 300)
				data(m)["org"], data(m)["account"] = long, long
				data(m)["path"] = []any{map[string]any{"account": long, "kind": "org"}}
			})
		}},
		{"path kind unknown", func() []byte {
			return with(admitted(), func(m map[string]any) {
				data(m)["path"] = []any{map[string]any{"account": "kx", "kind": "galaxy"}}
			})
		}},
		{"path kinds out of order", func() []byte {
			return with(admitted(), func(m map[string]any) {
				data(m)["account"] = "t"
				data(m)["path"] = []any{map[string]any{"account": "kx", "kind": "org"}, map[string]any{"account": "u", "kind": "user"},
					map[string]any{"account": "t", "kind": "team"}}
			})
		}},
		{"account not the last of path", func() []byte {
			return with(admitted(), func(m map[string]any) { data(m)["account"] = "someone" })
		}},
		{"api_key_id invalid", func() []byte { return with(admitted(), func(m map[string]any) { data(m)["api_key_id"] = "key id!" }) }},
		{"idempotency_key control char", func() []byte {
			return with(admitted(), func(m map[string]any) { data(m)["idempotency_key"] = "a\x00b" })
		}},
		{"plan too long", func() []byte {
			return with(admitted(), func(m map[string]any) { data(m)["plan"] = strings.Repeat("p", 65) })
		}},
		{"tool control char", func() []byte { return with(admitted(), func(m map[string]any) { data(m)["tool"] = "x\x1by" }) }},
		{"unknown unit", func() []byte {
			return with(admitted(), func(m map[string]any) { data(m)["units"] = map[string]any{"bananas": json.Number("1")} })
		}},
		{"negative unit", func() []byte {
			return with(admitted(), func(m map[string]any) { data(m)["units"] = map[string]any{"tokens": json.Number("-5")} })
		}},
		{"fractional unit", func() []byte {
			return with(admitted(), func(m map[string]any) { data(m)["units"] = map[string]any{"tokens": json.Number("1.5")} })
		}},
		{"quoted unit", func() []byte {
			return with(admitted(), func(m map[string]any) { data(m)["units"] = map[string]any{"tokens": "5"} })
		}},
		{"overflowing unit", func() []byte {
			return with(admitted(), func(m map[string]any) { data(m)["units"] = map[string]any{"tokens": json.Number("1e30")} })
		}},
		{"units an array", func() []byte {
			return with(admitted(), func(m map[string]any) { data(m)["units"] = []any{json.Number("1")} })
		}},
		{"no period", func() []byte { return with(admitted(), func(m map[string]any) { delete(data(m), "period") }) }},
		{"period 2026-13", func() []byte { return with(admitted(), func(m map[string]any) { data(m)["period"] = "2026-13" }) }},
		{"period 1999-01", func() []byte { return with(admitted(), func(m map[string]any) { data(m)["period"] = "1999-01" }) }},
		{"deeply nested data", func() []byte {
			return with(admitted(), func(m map[string]any) {
				data(m)["org"] = rawJSON(strings.Repeat("[", 20000) + strings.Repeat("]", 20000))
			})
		}},
		{"outcome without event_id", func() []byte { return with(outcome(), func(m map[string]any) { delete(data(m), "event_id") }) }},
		{"outcome with another id", func() []byte { return with(outcome(), func(m map[string]any) { m["id"] = id + "/other" }) }},
		{"outcome status 99", func() []byte {
			return with(outcome(), func(m map[string]any) { data(m)["status"] = json.Number("99") })
		}},
		{"outcome status 600", func() []byte {
			return with(outcome(), func(m map[string]any) { data(m)["status"] = json.Number("600") })
		}},
		{"outcome status a string", func() []byte { return with(outcome(), func(m map[string]any) { data(m)["status"] = "200" }) }},
		{"outcome negative unit", func() []byte {
			return with(outcome(), func(m map[string]any) { data(m)["units"] = map[string]any{"tokens": json.Number("-1")} })
		}},
		{"huge not json", func() []byte { return bytes.Repeat([]byte("x"), 300<<10+r.IntN(200<<10)) }},
		{"huge source", func() []byte {
			return with(admitted(), func(m map[string]any) { m["source"] = strings.Repeat("s", 400<<10) })
		}},
		{"invalid utf-8", func() []byte { return []byte("{\"specversion\":\"1.0\xff\"}") }},
	}
	c := cases[i%len(cases)] // every kind in turn, so that even the short form sends each
	return c.kind, c.value()
}
