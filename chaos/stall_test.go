package chaos_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
)

// hangUp sends an admission and hangs up right after sending it: it closes its side of the
// connection, which admit sees as the caller gone (net/http cancels the request's context).
// It still reads what admit writes, so that the test knows exactly what the caller would
// have been told: a status and body when admit answered before it noticed, none when it
// answered nothing.
func hangUp(ctx context.Context, addr string, body map[string]any) (status int, out map[string]any, err error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	req := fmt.Sprintf("POST /v1/admit HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		addr, serviceToken, len(raw), raw)
	if _, err := conn.Write([]byte(req)); err != nil {
		return 0, nil, err
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, nil, nil // answered nothing
	}
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	if err := json.Unmarshal(rb, &out); err != nil {
		return 0, nil, fmt.Errorf("status %d, body %q: %w", resp.StatusCode, rb, err)
	}
	return resp.StatusCode, out, nil
}

// Scenario 10: Redis busy for 1.5 s (a slow command), twice, under load, with callers
// that hang up right after sending. A script call that times out may still run once Redis
// is free, and a caller that hung up would be charged by a decision nobody received: each
// such request is voided, so that what is billed (finance_billable_events) and what the
// quota counters hold after reconcile are exactly what callers were told 200 for: the
// same event ids, each with the units its caller sent.
//
// Of every four requests, two are sent by callers that wait for their answer, one by a
// caller that hangs up and then retries with the same idempotency key until told 200, and
// one by a caller that hangs up and never comes back. Callers that wait retry 503s with
// the same key.
func TestRedisStalledCallersHangUp(t *testing.T) {
	t.Parallel()
	sc := begin(t, "10 Redis stalled, callers hang up")
	rs := private.StartRedis(t)
	s := newStack(t, options{RedisURL: rs.URL(), AdmitEnv: []string{"REDIS_TIMEOUT=500ms"}})
	quotaOrg, rateOrg := "chaos-stall-quota", "chaos-stall-rate"
	keys := []string{
		s.account(quotaOrg, "org", "", "enterprise", map[string]any{ // a monthly quota: fails closed
			"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": 100_000_000},
			"tokens":   map[string]any{"quota": 1_000_000_000}}),
		s.account(rateOrg, "org", "", "enterprise", enterpriseRate), // rate limits only: fails open
	}
	opts, err := redis.ParseURL(rs.URL())
	require.NoError(t, err)

	var (
		stop     atomic.Bool
		next     atomic.Int64
		mu       sync.Mutex
		told     = map[string]sentRequest{} // event id → what the caller sent, for every 200
		byIdem   = map[string]string{}      // idempotency key → the event id it was told
		attempts int
		hungUp   int // attempts that hung up
		unheard  int // of them, answered nothing (admit saw the caller gone first)
		fiveXX   int
		requests int
	)
	run := testenv.Random(8)
	addr := s.admits[0].addr
	url := s.admits[0].URL() + "/v1/admit"
	ctx := testenv.Context(t, 5*time.Minute)
	var wg sync.WaitGroup
	workers := pick(24, 48)
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				for !stop.Load() {
					i := int(next.Add(1))
					req := sentRequest{Key: keys[i%len(keys)], Idem: fmt.Sprintf("stall-%s-%d", run, i)}
					req.Units, req.Tool = variedRequest(i)
					for try := 0; ; try++ {
						if try == 200 {
							return fmt.Errorf("request %d never answered 200", i)
						}
						hang := try == 0 && i%4 >= 2
						var (
							status int
							out    map[string]any
							err    error
						)
						if hang {
							status, out, err = hangUp(ctx, addr, req.body())
						} else {
							status, out, err = call(ctx, "POST", url, serviceToken, req.body())
						}
						mu.Lock()
						attempts++
						if hang {
							hungUp++
						}
						switch {
						case err != nil:
							mu.Unlock()
							return fmt.Errorf("request %d: %w", i, err)
						case hang && status == 0:
							unheard++
						case status >= 500:
							fiveXX++
						}
						if err == nil && status == 200 {
							id, _ := out["event_id"].(string)
							if byIdem[req.Idem] != "" || told[id].Key != "" {
								mu.Unlock()
								return fmt.Errorf("request %d: told 200 twice, or for another's event id %q: %v", i, id, out)
							}
							told[id], byIdem[req.Idem] = req, id
							requests++
						}
						mu.Unlock()
						if status == 200 || hang && i%4 == 3 {
							break // told, or gone for good
						}
						if status != 503 && status != 0 {
							return fmt.Errorf("request %d: status %d %v", i, status, out)
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
				return nil
			}()
		}()
	}

	stall := func() {
		done, err := private.StallRedis(ctx, opts, 1500*time.Millisecond)
		require.NoError(t, err)
		require.NoError(t, <-done)
	}
	time.Sleep(pick(2*time.Second, 5*time.Second))
	stall()
	time.Sleep(pick(2*time.Second, 5*time.Second))
	stall()
	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Positive(t, unheard, "hang-ups admit answered nothing")
	require.Positive(t, fiveXX, "calls timed out during the stalls")

	// Every told id has its row, and every other row of the stack is voided: a decision
	// nobody was told (warm-up rows aside).
	ids := make([]string, 0, len(told))
	for id := range told {
		ids = append(ids, id)
	}
	warm := make([]string, 0, len(s.warm))
	for id := range s.warm {
		warm = append(warm, id)
	}
	var pending, voided int
	deadline := time.Now().Add(2 * time.Minute)
	for {
		require.NoError(t, s.db.QueryRow(ctx, `select
  (select count(*) from unnest($1::text[]) t(id) where not exists (select 1 from usage_events e where e.event_id = t.id))
  + (select count(*) from usage_events e where not e.event_id = any($1) and not e.event_id = any($2)
       and not exists (select 1 from usage_voids v where v.event_id = e.event_id)),
  (select count(*) from usage_voids)`, ids, warm).Scan(&pending, &voided))
		if pending == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Zero(t, pending, "told ids without a row, or rows neither told nor voided")

	// What is billed is exactly what callers were told, row for row.
	all := s.bookRows(ctx, `select b.event_id, coalesce(e.idempotency_key, ''), e.org, e.account, e.account_kind, e.path,
  coalesce(e.api_key_id, ''), coalesce(e.tool, ''), b.billable_requests, b.billable_tokens, b.billable_credits, b.billable_cost_micros
from finance_billable_events b join usage_events e using (event_id, billing_period)
where not b.refunded and not b.event_id = any($1)`, warm)
	var notTold, wrong []string
	billedIDs := map[string]bool{}
	for _, r := range all {
		billedIDs[r.id] = true
		req, ok := told[r.id]
		if !ok {
			notTold = append(notTold, r.id)
			continue
		}
		if want := s.rowOf(req); !reflect.DeepEqual(want, r.bookRow) {
			wrong = append(wrong, fmt.Sprintf("%s: %+v → %+v", r.id, want, r.bookRow))
		}
	}
	var unbilled []string
	for id := range told {
		if !billedIDs[id] {
			unbilled = append(unbilled, id)
		}
	}
	sort.Strings(notTold)
	require.Empty(t, notTold, "billed, but no caller was told 200")
	require.Empty(t, unbilled, "told 200, but not billed")
	require.Empty(t, wrong, "billed rows unlike what their caller sent (sent → row)")

	var reasons map[string]int
	require.NoError(t, s.db.QueryRow(ctx, `select coalesce(jsonb_object_agg(reason, n), '{}') from
  (select reason, count(*) n from usage_voids group by reason) x`).Scan(&reasons))
	require.Positive(t, reasons["caller_gone"], "hang-ups voided")
	require.Positive(t, reasons["unavailable"], "503s after a timed-out call voided")

	// What is charged: after reconcile, the quota org's counters hold what its callers were
	// told 200 for (voided charges given back), no more, no less.
	code, out := s.reconcile(nil)
	require.Zero(t, code, out)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	var wantRequests, wantTokens int64
	for _, req := range told {
		if s.keys[req.Key].account == quotaOrg {
			wantRequests++
			wantTokens += req.Units["tokens"]
		}
	}
	counter := func(u policy.Unit) int64 { // the Redis is the scenario's own: one key matches
		t.Helper()
		suffix := keyspace.Keys{Shards: 16}.Quota(quotaOrg, quotaOrg, u, period.MonthLabel(time.Now()))
		found, err := rdb.Keys(ctx, "*"+suffix[strings.Index(suffix, "}"):]).Result()
		require.NoError(t, err)
		require.Len(t, found, 1, "%s counter of %s", u, quotaOrg)
		n, err := rdb.Get(ctx, found[0]).Int64()
		require.NoError(t, err)
		return n
	}
	require.Equal(t, wantRequests, counter(policy.Requests), "requests charged to %s after reconcile", quotaOrg)
	require.Equal(t, wantTokens, counter(policy.Tokens), "tokens charged to %s after reconcile", quotaOrg)

	sc.Requests, sc.Admitted, sc.FiveXX = int(next.Load()), requests, fiveXX
	sc.Rows, sc.Lost, sc.Duplicated = len(all), len(unbilled), len(notTold)
	sc.Note = fmt.Sprintf("2 stalls of 1.5 s; %d attempts, %d hung up (%d answered nothing), %d answered 5xx; voids by reason %v; billed = told 200, row for row; quota counters = told after reconcile",
		attempts, hungUp, unheard, fiveXX, reasons)
}
