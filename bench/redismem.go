package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/keyspace"
)

// keyedRate is the load the idempotency figure is projected to: keyed requests per second.
const keyedRate = 10_000

// redisMemory measures what Redis holds per active org, from INFO memory's used_memory (and
// DBSIZE) before and after MemoryN of them, and what idempotency costs at keyedRate: the hot
// records and the Bloom filters, from MEMORY USAGE of the keys MemoryN keyed requests wrote
// (idempotencyMemory). Requests go through admit (the default deployment, its relay
// inside), with the outbox emptied before and after, so that only what stays is counted.
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
	idem, err := s.idempotencyMemory(ctx, n, key)
	if err != nil {
		return fmt.Errorf("idempotency records: %w", err)
	}
	res.Raw["redis_memory"] = map[string]any{"active_accounts": acc, "idempotency": idem,
		"idempotency_ttl": s.cfg.IdempotencyTTL.String(), "idempotency_hot": keyspace.DefaultIdempotencyHot.String()}

	perOrg := float64(acc.Bytes) / float64(n)
	res.add("redis_bytes_per_active_account", perOrg, "B", "",
		fmt.Sprintf("used_memory delta ÷ %d fresh orgs, each an org → team → user → agent tree with a requests and a tokens bucket at every level and a monthly quota at the org (refill slow enough that no bucket expires during the measurement), after one request from each org's agent through admit, the outbox emptied before and after; DBSIZE grew by %.2f keys per org", n, float64(acc.Keys)/float64(n)))

	hot, ttl := keyspace.DefaultIdempotencyHot, s.cfg.IdempotencyTTL
	perRecord := float64(idem.HotBytes) / float64(n)
	records := keyedRate * 2 * hot.Seconds()
	hotGB := records * perRecord / 1e9
	filtersGB := float64(3*shards*idem.FilterBytes) / 1e9
	res.add("redis_bytes_per_idempotency_record", perRecord, "B", "",
		fmt.Sprintf("MEMORY USAGE of the shards' hot idempotency buckets (hashes mg{N}:h:<floor(ms / H)>) grown over %d requests through admit with a fresh idempotency key each (one org's tree, its buckets already there) ÷ %d; at %d keyed requests/s the hot window H=%s keeps up to 2H of them (the current and the previous bucket: the relay's janitor deletes older ones once their events are in PostgreSQL): %.3g records, %.2f GB",
			n, n, keyedRate, hot, records, hotGB))
	res.add("redis_gb_idempotency_at_10k_per_s", hotGB+filtersGB, "GB", "≤ 4",
		fmt.Sprintf("hot records (redis_bytes_per_idempotency_record × %d/s × 2H, H=%s: %.2f GB) + Bloom filters for ADMIT_IDEMPOTENCY_TTL=%s (3 alive per shard × %d shards, each %d bits: 9.6 per key a shard admits in TTL/2 at %d/s, for 1%% false positives; MEMORY USAGE of a filter of that size: %d B; %.2f GB). Before issue 29 every record stayed in Redis for the TTL: 106 GB",
			keyedRate, hot, hotGB, ttl, shards, idem.FilterBits10k, keyedRate, idem.FilterBytes, filtersGB))
	return nil
}

// idemMemory is what keyed requests cost Redis: the hot buckets' growth, the filters the
// sample wrote, and the size of a filter sized for keyedRate.
type idemMemory struct {
	Load memDelta `json:"load"`
	// HotBytes is the growth of MEMORY USAGE summed over the shards' recent hot buckets.
	HotBytes int64 `json:"hot_bytes"`
	// SampleFilterBytes is STRLEN of the filters the sample wrote (one per shard), each
	// ADMIT_IDEMPOTENCY_FILTER_BITS / 8 long.
	SampleFilterBytes []int64 `json:"sample_filter_bytes"`
	// FilterBits10k and FilterBytes: a filter sized for keyedRate over half the TTL, and
	// MEMORY USAGE of a string of that many bits.
	FilterBits10k int64 `json:"filter_bits_10k"`
	FilterBytes   int64 `json:"filter_bytes"`
}

// idempotencyMemory sends n requests with a fresh idempotency key each through admit and
// reads MEMORY USAGE of the hot buckets (the current and the previous of every shard, by
// Redis TIME, before and after), then of one filter sized for keyedRate (written with
// SETBIT on a scratch key and deleted).
func (s *stack) idempotencyMemory(ctx context.Context, n int, apiKey string) (idemMemory, error) {
	var m idemMemory
	keys := keyspace.Keys{Prefix: s.cfg.KeyPrefix, Shards: shards}
	hot := keyspace.DefaultIdempotencyHot.Milliseconds()
	half := s.cfg.IdempotencyTTL.Milliseconds() / 2
	// usage reads MEMORY USAGE of the current and the previous hot buckets of every shard
	// (and the next: a bucket boundary during the load), by Redis TIME; absent keys are left
	// out.
	usage := func() (map[string]int64, error) {
		now, err := s.rdb.Time(ctx).Result()
		if err != nil {
			return nil, err
		}
		out := map[string]int64{}
		b := now.UnixMilli() / hot
		for shard := range shards {
			for i := b - 1; i <= b+1; i++ {
				k := keys.IdempotencyHotBucket(shard, i)
				v, err := s.rdb.MemoryUsage(ctx, k, 0).Result()
				switch {
				case errors.Is(err, redis.Nil):
				case err != nil:
					return nil, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
				default:
					out[k] = v
				}
			}
		}
		return out, nil
	}
	before, err := usage()
	if err != nil {
		return m, err
	}
	if m.Load, err = s.memoryDelta(ctx, n, `{"api_key":"`+apiKey+`",`+decisionBody+`}`, nil, "-idempotency"); err != nil {
		return m, err
	}
	after, err := usage()
	if err != nil {
		return m, err
	}
	// The growth of each bucket there after the load (a bucket the janitor deleted
	// meanwhile, older than the sample's, is left out).
	for k, v := range after {
		m.HotBytes += v - before[k]
	}
	if m.HotBytes <= 0 {
		return m, fmt.Errorf("the hot buckets did not grow (%d B): are idempotency records in hot buckets (ADMIT_IDEMPOTENCY_HOT)?", m.HotBytes)
	}
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return m, err
	}
	for shard := range shards {
		l, err := s.rdb.StrLen(ctx, keys.IdempotencyFilter(shard, now.UnixMilli()/half)).Result()
		if err != nil {
			return m, err
		}
		m.SampleFilterBytes = append(m.SampleFilterBytes, l)
	}
	m.FilterBits10k = int64(math.Ceil(9.6 * keyedRate * float64(half) / 1000 / shards))
	scratch := keys.IdempotencyFilter(0, -1) // generation -1: never one of admit's
	defer s.rdb.Del(context.WithoutCancel(ctx), scratch)
	if err := s.rdb.SetBit(ctx, scratch, m.FilterBits10k-1, 1).Err(); err != nil {
		return m, err
	}
	if m.FilterBytes, err = s.rdb.MemoryUsage(ctx, scratch, 0).Result(); err != nil {
		return m, err
	}
	return m, nil
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
