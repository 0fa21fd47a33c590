package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// keyedRate is the load the idempotency figure is projected to: keyed requests per second.
const keyedRate = 10_000

// redisMemory measures what Redis holds per active org and per idempotency record, from
// INFO memory's used_memory (and DBSIZE) before and after MemoryN of them, through admit
// (the default deployment, its relay inside) and with the outbox emptied both times, so
// that only what stays is counted.
func (s *stack) redisMemory(ctx context.Context, res *Results) error {
	n := s.cfg.MemoryN
	acc, err := s.activeAccounts(ctx, n)
	if err != nil {
		return fmt.Errorf("active accounts: %w", err)
	}
	key, err := s.benchKey(ctx)
	if err != nil {
		return err
	}
	idem, err := s.memoryDelta(ctx, n, `{"api_key":"`+key+`",`+decisionBody+`}`, nil, "-idempotency")
	if err != nil {
		return fmt.Errorf("idempotency records: %w", err)
	}
	res.Raw["redis_memory"] = map[string]any{"active_accounts": acc, "idempotency_records": idem,
		"idempotency_ttl": s.cfg.IdempotencyTTL.String()}

	perOrg := float64(acc.Bytes) / float64(n)
	res.add("redis_bytes_per_active_account", perOrg, "B", "",
		fmt.Sprintf("used_memory delta ÷ %d fresh orgs, each an org → team → user → agent tree with a requests and a tokens bucket at every level and a monthly quota at the org (refill slow enough that no bucket expires during the measurement), after one request from each org's agent through admit, the outbox emptied before and after; DBSIZE grew by %.2f keys per org", n, float64(acc.Keys)/float64(n)))
	perRecord := float64(idem.Bytes) / float64(n)
	window := s.cfg.IdempotencyTTL
	kept := keyedRate * window.Seconds()
	res.add("redis_bytes_per_idempotency_record", perRecord, "B", "",
		fmt.Sprintf("used_memory delta ÷ %d requests through admit with a fresh idempotency key each (one org's tree, its buckets already there), the outbox emptied before and after; at %d keyed requests/s kept for ADMIT_IDEMPOTENCY_TTL=%s that is %.3g records, %.1f GB (a layout that expires records by time bucket keeps up to twice the window)",
			n, keyedRate, window, kept, kept*perRecord/1e9))
	res.add("redis_gb_idempotency_at_10k_per_s", kept*perRecord/1e9, "GB", "",
		fmt.Sprintf("redis_bytes_per_idempotency_record × %d keyed requests/s × ADMIT_IDEMPOTENCY_TTL %s", keyedRate, window))
	return nil
}

// memDelta is what Redis grew by over a batch of requests.
type memDelta struct {
	Bytes int64   `json:"used_memory_bytes"`
	Keys  int64   `json:"dbsize_keys"`
	Load  loadRun `json:"load"`
}

// memoryDelta sends n requests (body, {{item}} from items) to admit once the outbox is
// empty, waits until it is empty again and returns used_memory's and DBSIZE's growth.
func (s *stack) memoryDelta(ctx context.Context, n int, body string, items []string, args ...string) (memDelta, error) {
	var d memDelta
	if items != nil {
		f, err := os.CreateTemp("", "bench-items-*.txt")
		if err != nil {
			return d, err
		}
		defer os.Remove(f.Name())
		if _, err := f.WriteString(strings.Join(items, "\n") + "\n"); err != nil {
			return d, err
		}
		f.Close()
		args = append(args, "-items", f.Name())
	}
	if err := s.outboxEmpty(ctx, s.admit.URL(), 2*time.Minute); err != nil {
		return d, err
	}
	used0, keys0, err := s.redisUsed(ctx)
	if err != nil {
		return d, err
	}
	args = append(args, "-requests", strconv.Itoa(n), "-warmup", "0", "-duration", "30m",
		"-concurrency", strconv.Itoa(s.cfg.Clients))
	if d.Load, err = s.loadgen(ctx, s.admit.URL()+"/v1/admit", serviceToken, body, args...); err != nil {
		return d, err
	}
	if ok := d.Load.Status["200"]; ok != int64(n) {
		return d, fmt.Errorf("%d of %d requests allowed: %v %v", ok, n, d.Load.Status, d.Load.ErrorSamples)
	}
	if err := s.outboxEmpty(ctx, s.admit.URL(), 2*time.Minute); err != nil {
		return d, err
	}
	used1, keys1, err := s.redisUsed(ctx)
	if err != nil {
		return d, err
	}
	d.Bytes, d.Keys = used1-used0, keys1-keys0
	return d, nil
}

// activeAccounts makes n fresh orgs (each a 4-level tree like the bench's, in one
// transaction), waits until admit's cache holds them and sends one request from each
// org's agent.
func (s *stack) activeAccounts(ctx context.Context, n int) (memDelta, error) {
	before, err := s.metric(ctx, s.admit.URL(), "metergate_policy_accounts")
	if err != nil {
		return memDelta{}, err
	}
	if err := seedTrees(ctx, s, n); err != nil {
		return memDelta{}, err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got, err := s.metric(ctx, s.admit.URL(), "metergate_policy_accounts")
		if err != nil {
			return memDelta{}, err
		}
		if got >= before+4*float64(n) {
			break
		}
		if time.Now().After(deadline) {
			return memDelta{}, fmt.Errorf("admit's cache holds %.0f of %.0f accounts after 3 minutes", got, before+4*float64(n))
		}
		time.Sleep(50 * time.Millisecond)
	}
	agents := make([]string, n)
	for i := range agents {
		agents[i] = fmt.Sprintf("mem-%d-a", i+1)
	}
	return s.memoryDelta(ctx, n, `{"account":"{{item}}",`+decisionBody+`}`, agents)
}

// seedTrees inserts n trees mem-<i> → mem-<i>-t → mem-<i>-u → mem-<i>-a, each level with
// a requests and a tokens bucket and a monthly requests quota at the org, in one
// transaction. The buckets refill slowly (one request leaves them short for ~15 minutes)
// so that none expires while the figure is taken, whatever expiry the layout uses.
func seedTrees(ctx context.Context, s *stack, n int) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{
		`INSERT INTO accounts (id, kind, parent, org, plan)
			SELECT 'mem-' || i, 'org', NULL, 'mem-' || i, 'enterprise' FROM generate_series(1, $1::int) i`,
		`INSERT INTO accounts (id, kind, parent, org)
			SELECT 'mem-' || i || '-' || k, kind, 'mem-' || i || p, 'mem-' || i
			FROM generate_series(1, $1::int) i,
			     (VALUES ('t', 'team', ''), ('u', 'user', '-t'), ('a', 'agent', '-u')) AS l(k, kind, p)
			ORDER BY array_position(ARRAY['t', 'u', 'a'], k)`,
		`INSERT INTO account_limits (account, unit, rate_per_s, burst, quota, quota_period)
			SELECT a.id, u.unit, u.rate, u.burst,
			       CASE WHEN a.kind = 'org' AND u.unit = 'requests' THEN 1000000000000 END,
			       CASE WHEN a.kind = 'org' AND u.unit = 'requests' THEN 'month' END
			FROM accounts a, (VALUES ('requests', 0.001, 1000000), ('tokens', 0.5, 1000000000)) AS u(unit, rate, burst)
			WHERE a.id LIKE 'mem-%'`,
	} {
		var args []any
		if strings.Contains(q, "$1") {
			args = append(args, n)
		}
		if _, err := tx.Exec(ctx, q, args...); err != nil {
			return fmt.Errorf("%s: %w", strings.Fields(q)[2], err)
		}
	}
	return tx.Commit(ctx)
}
