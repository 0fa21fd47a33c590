package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// admitMemory starts a fresh admit, reads its resident memory, adds Accounts accounts to
// the policy tables in one transaction (what a bulk import does; the cache reloads on
// the notification), waits until the node's cache holds them and reads it again. The
// baseline is the same binary, freshly started on the same database before the import.
func (s *stack) admitMemory(ctx context.Context, res *Results) error {
	p, err := s.start(ctx, "rss")
	if err != nil {
		return err
	}
	defer func() { _ = p.Stop(30 * time.Second) }()
	before, err := s.metric(ctx, p.URL(), "metergate_policy_accounts")
	if err != nil {
		return err
	}
	base, _, err := rss(p.Pid())
	if err != nil {
		return err
	}
	seedBegin := time.Now()
	if err := seedAccounts(ctx, s, s.cfg.Accounts); err != nil {
		return fmt.Errorf("seed %d accounts: %w", s.cfg.Accounts, err)
	}
	seeded := time.Since(seedBegin)
	want := before + float64(s.cfg.Accounts)
	loadBegin := time.Now()
	for {
		n, err := s.metric(ctx, p.URL(), "metergate_policy_accounts")
		if err != nil {
			return err
		}
		if n >= want {
			break
		}
		if time.Since(loadBegin) > 3*time.Minute {
			return fmt.Errorf("admit's cache holds %.0f of %.0f accounts after 3 minutes", n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	loaded := time.Since(loadBegin)
	after, peak, err := rss(p.Pid())
	if err != nil {
		return err
	}
	res.Raw["admit_memory"] = map[string]any{"accounts": s.cfg.Accounts, "rss_mb_before": base, "rss_mb_after": after,
		"hwm_mb": peak, "insert_s": seeded.Seconds(), "cache_loaded_after_s": loaded.Seconds()}
	res.add(fmt.Sprintf("admit_rss_mb_%dk", s.cfg.Accounts/1000), after, "MB", "",
		fmt.Sprintf("VmRSS with %d accounts in the policy cache (org → team → user trees, a key per org) vs %.1f MB for the same node before (%.0f accounts): %.2f KB per account; peak %.1f MB while reloading; cache loaded %.1f s after the insert",
			s.cfg.Accounts, base, before, (after-base)*1024/float64(s.cfg.Accounts), peak, loaded.Seconds()))
	return nil
}

// rss reads VmRSS and VmHWM (peak) of a process, in MB.
func rss(pid int) (cur, peak float64, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %q", k, v)
		}
		if k == "VmRSS" {
			cur = kb / 1024
		} else {
			peak = kb / 1024
		}
	}
	if cur == 0 {
		return 0, 0, fmt.Errorf("no VmRSS for pid %d", pid)
	}
	return cur, peak, nil
}

// seedAccounts inserts n accounts as n/10 trees: an org (pro plan, with an API key), two
// teams, and seven users spread over them (some with a limit of their own). Server-side,
// in one transaction.
func seedAccounts(ctx context.Context, s *stack, n int) error {
	orgs := n / 10
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{
		`INSERT INTO accounts (id, kind, parent, org, plan)
			SELECT 'seed-' || i, 'org', NULL, 'seed-' || i, 'pro' FROM generate_series(1, $1::int) i`,
		`INSERT INTO accounts (id, kind, parent, org)
			SELECT 'seed-' || i || '-t' || t, 'team', 'seed-' || i, 'seed-' || i
			FROM generate_series(1, $1::int) i, generate_series(1, 2) t`,
		`INSERT INTO accounts (id, kind, parent, org)
			SELECT 'seed-' || i || '-u' || u, 'user', 'seed-' || i || '-t' || (u % 2 + 1), 'seed-' || i
			FROM generate_series(1, $1::int) i, generate_series(1, 7) u`,
		`INSERT INTO account_limits (account, unit, rate_per_s, burst)
			SELECT 'seed-' || i || '-u1', 'requests', 5, 20 FROM generate_series(1, $1::int) i`,
		`INSERT INTO api_keys (id, account, hash)
			SELECT 'seedkey-' || i, 'seed-' || i, sha256(('seed-secret-' || i)::bytea) FROM generate_series(1, $1::int) i`,
	} {
		if _, err := tx.Exec(ctx, q, orgs); err != nil {
			return fmt.Errorf("%s: %w", strings.Fields(q)[2], err)
		}
	}
	return tx.Commit(ctx)
}
