package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/reconcile"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.MainOrTests(m, main)) }

// Both `reconcile -migrate` and `reconcile migrate` leave a migrated schema; the second
// does not need Redis.
func TestMigrate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		redisURL string
		args     []string
	}{
		"run with -migrate":  {testenv.RedisURL(t), []string{"-migrate"}},
		"migrate subcommand": {"redis://" + testenv.FreeAddr(t) + "/0", []string{"migrate"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, schema := testenv.EmptySchema(t)
			p := testenv.StartMain(t, []string{
				"REDIS_URL=" + tc.redisURL, "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=",
				"DATABASE_URL=" + testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
			}, tc.args...)
			code, err := p.Wait(time.Minute)
			require.NoError(t, err)
			require.Equal(t, 0, code, p.Output())
			var n int
			require.NoError(t, pool.QueryRow(testenv.Context(t, time.Minute), `select count(*) from dead_letters`).Scan(&n))
		})
	}
}

func TestUnreachableRedisFails(t *testing.T) {
	t.Parallel()
	p := testenv.StartMain(t, []string{"REDIS_URL=redis://" + testenv.FreeAddr(t) + "/0", "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER="})
	code, err := p.Wait(time.Minute)
	require.NoError(t, err)
	require.Equal(t, 1, code, p.Output())
	require.True(t, strings.Contains(p.Output(), "redis"), p.Output())
}

func TestBadSetting(t *testing.T) {
	t.Parallel()
	p := testenv.StartMain(t, []string{"DATABASE_MAX_CONNS=0"})
	code, err := p.Wait(time.Minute)
	require.NoError(t, err)
	require.Equal(t, 2, code)
	require.Contains(t, p.Output(), "DATABASE_MAX_CONNS=0")
}

// help and -h list the commands (-h then the flags, as before there were commands); an
// unknown command names itself and exits 2, before any configuration is read.
func TestCommands(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args []string
		code int
		want []string
	}{
		"help":            {[]string{"help"}, 0, []string{"Commands:", "  verify ", "  close ", "(the default)"}},
		"-h":              {[]string{"-h"}, 0, []string{"Commands:", "-dry-run", "DATABASE_URL"}},
		"a command's -h":  {[]string{"close", "-h"}, 0, []string{"-period", "-force"}},
		"unknown command": {[]string{"verfy", "-json"}, 2, []string{`reconcile: unknown command "verfy"`, "  migrate "}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := testenv.StartMain(t, []string{"DATABASE_MAX_CONNS=0"}, tc.args...) // would fail a run
			code, err := p.Wait(time.Minute)
			require.NoError(t, err)
			require.Equal(t, tc.code, code, p.Output())
			for _, w := range tc.want {
				require.Contains(t, p.Output(), w)
			}
		})
	}
}

// Five requests of acme (pro: a monthly requests quota), two ending in 503. verify lists
// the counter that is off and fails; -dry-run -json plans two refunds and changes nothing;
// a run killed with SIGKILL after changing Redis and before marking the row, then a run
// again, gives back exactly two requests; a third run applies nothing; verify passes.
func TestRunVerifyAndKill(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	pool, rdb, counter, env := setupAcme(t)
	start := func(extra []string, args ...string) (int, string) {
		t.Helper()
		p := testenv.StartMain(t, append(append([]string{}, env...), extra...), args...)
		code, err := p.Wait(time.Minute)
		require.NoError(t, err)
		return code, p.Output()
	}
	summary := func(out string) reconcile.Summary {
		t.Helper()
		var s reconcile.Summary
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, `{"run_id"`) {
				require.NoError(t, json.Unmarshal([]byte(line), &s))
				return s
			}
		}
		t.Fatalf("no summary in output:\n%s", out)
		return s
	}

	code, out := start(nil, "verify")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, fmt.Sprintf("acme acme requests %s: redis 5, billable 3", counter[len(counter)-len("2006-01"):]))

	code, out = start(nil, "-dry-run", "-json")
	require.Equal(t, 0, code, out)
	s := summary(out)
	require.True(t, s.DryRun)
	require.Equal(t, 2, s.AdjustmentsPlanned)
	require.Zero(t, s.AdjustmentsApplied)
	require.Len(t, s.Plan, 2)
	require.Equal(t, "5", rdb.Get(ctx, counter).Val(), "a dry run changes nothing")

	code, out = start([]string{FailpointEnv + "=" + reconcile.AfterRedis + ":1"})
	require.Equal(t, -1, code, "killed by SIGKILL: %s", out)
	require.Equal(t, "4", rdb.Get(ctx, counter).Val(), "the first refund reached Redis")

	code, out = start(nil, "-json")
	require.Equal(t, 0, code, out)
	s = summary(out)
	require.Equal(t, 2, s.Recovered, "the killed run's rows are finished, the first without changing Redis again")
	require.Equal(t, 2, s.AdjustmentsApplied)
	require.Equal(t, map[reconcile.Kind]int{reconcile.Refund5xx: 2}, s.ByKind)
	require.Equal(t, "3", rdb.Get(ctx, counter).Val())

	code, out = start(nil, "-json")
	require.Equal(t, 0, code, out)
	require.Zero(t, summary(out).AdjustmentsApplied)

	code, out = start(nil, "verify")
	require.Equal(t, 0, code, out)
	var applied int
	require.NoError(t, pool.QueryRow(ctx, `select count(*) from adjustments where applied_at is not null and redis_before - redis_after = 1`).Scan(&applied))
	require.Equal(t, 2, applied)
}

// setupAcme migrates a schema of the test's own, creates acme (pro: a monthly requests
// quota) and records five requests of acme, two ending in 503, with acme's counter at 5.
// It returns the counter's key and the environment of a reconcile process.
func setupAcme(t *testing.T) (*pgxpool.Pool, *redis.Client, string, []string) {
	t.Helper()
	ctx := testenv.Context(t, 2*time.Minute)
	pool, schema := testenv.EmptySchema(t)
	_, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	_, err = policy.NewStore(pool).CreateAccount(ctx, policy.Account{ID: "acme", Kind: policy.Org, Plan: "pro"})
	require.NoError(t, err)
	rdb := testenv.Redis(t)
	keys := keyspace.Keys{Prefix: testenv.Prefix(t) + "mg", Shards: 16}
	now := time.Now().UTC()
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	counter := keys.Quota("acme", "acme", policy.Requests, period.MonthLabel(now))
	t.Cleanup(func() {
		ks, _ := rdb.Keys(context.Background(), keys.Prefix+"*").Result()
		if len(ks) > 0 {
			rdb.Del(context.Background(), ks...)
		}
	})
	_, err = pool.Exec(ctx, `select usage_events_partition($1)`, month)
	require.NoError(t, err)
	for i := range 5 {
		id := fmt.Sprintf("ev-%d", i)
		_, err = pool.Exec(ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, requests, kafka_partition, kafka_offset)
values ($1, $2, $3, $2, 'acme', 'acme', 'org', '{acme}', 'test', 1, 0, $4)`, id, month, now, i)
		require.NoError(t, err)
		if i < 2 {
			_, err = pool.Exec(ctx, `insert into usage_outcomes (event_id, status, outcome_time, source, kafka_partition, kafka_offset)
values ($1, 503, now(), 'test', 1, $2)`, id, i)
			require.NoError(t, err)
		}
	}
	require.NoError(t, rdb.Set(ctx, counter, 5, 0).Err())

	env := []string{"REDIS_URL=" + testenv.RedisURL(t), "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=", "ADMIT_KEY_PREFIX=" + keys.Prefix,
		"DATABASE_URL=" + testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema)}
	return pool, rdb, counter, env
}

// A reconcile process killed with SIGKILL at each failpoint (after inserting the refunds,
// after inserting the drift restore, after changing Redis and before marking, after
// marking), then run again, ends where an uninterrupted run does: the two refunds and the
// restore of three lost requests each applied once; a further run applies nothing.
func TestKilledRunConverges(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"after-insert:1", "after-insert:2", "after-redis:1", "after-redis:3", "after-mark:2"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			ctx := testenv.Context(t, 2*time.Minute)
			pool, rdb, counter, env := setupAcme(t)
			require.NoError(t, rdb.Set(ctx, counter, 2, 0).Err(), "Redis lost three of the five")
			start := func(extra ...string) (int, string) {
				p := testenv.StartMain(t, append(append([]string{}, env...), extra...))
				code, err := p.Wait(time.Minute)
				require.NoError(t, err)
				return code, p.Output()
			}
			code, out := start(FailpointEnv + "=" + point)
			require.Equal(t, -1, code, "killed by SIGKILL: %s", out)
			code, out = start()
			require.Equal(t, 0, code, out)
			require.Equal(t, "3", rdb.Get(ctx, counter).Val())

			var rows []string
			r, err := pool.Query(ctx, `select format('%s %s %s→%s', kind, amount, redis_before, redis_after) from adjustments
where applied_at is not null order by id`)
			require.NoError(t, err)
			for r.Next() {
				var row string
				require.NoError(t, r.Scan(&row))
				rows = append(rows, row)
			}
			require.NoError(t, r.Err())
			require.Equal(t, []string{"refund_5xx -1 2→1", "refund_5xx -1 1→0", "drift_restore 3 0→3"}, rows)

			code, out = start("-json")
			require.Equal(t, 0, code, out)
			require.Contains(t, out, `"adjustments_applied":0`)
			code, out = start("verify")
			require.Equal(t, 0, code, out)
		})
	}
}

// reconcile close issues the invoices of a period once (refused before the period's end
// plus the grace without -force); reconcile invoice prints one as CSV or JSON.
func TestCloseAndInvoice(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	pool, schema := testenv.EmptySchema(t)
	_, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	_, err = policy.NewStore(pool).CreateAccount(ctx, policy.Account{ID: "acme", Kind: policy.Org, Plan: "pro"})
	require.NoError(t, err)
	now := time.Now().UTC()
	past := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).AddDate(0, -2, 0)
	_, err = pool.Exec(ctx, `select usage_events_partition($1)`, past)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, requests, tokens, kafka_partition, kafka_offset)
values ('ev-1', $1, $2, $1, 'acme', 'acme', 'org', '{acme}', 'test', 1, 2500, 0, 1)`, past, past.Add(time.Hour))
	require.NoError(t, err)
	env := []string{"REDIS_URL=" + testenv.RedisURL(t), "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=", "ADMIT_KEY_PREFIX=" + testenv.Prefix(t) + "mg",
		"DATABASE_URL=" + testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema)}
	reconcile := func(args ...string) (int, string) {
		p := testenv.StartMain(t, env, args...)
		code, err := p.Wait(time.Minute)
		require.NoError(t, err)
		return code, p.Output()
	}

	code, out := reconcile("close", "-period", now.Format("2006-01"))
	require.Equal(t, 1, code, "the current month cannot be closed yet: %s", out)
	code, out = reconcile("close", "-period", past.Format("2006-01"))
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"Created":true`)
	require.Contains(t, out, `"org":"acme"`)
	code, out = reconcile("close", "-period", past.Format("2006-01"))
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"Created":false`, "a second close writes nothing")
	var invoices int
	require.NoError(t, pool.QueryRow(ctx, `select count(*) from invoices`).Scan(&invoices))
	require.Equal(t, 1, invoices)

	code, out = reconcile("verify", "-json")
	require.Equal(t, 0, code, "the issued invoice ties out: %s", out)
	require.Contains(t, out, `"invoice_differences":[]`)

	code, out = reconcile("invoice", "-period", past.Format("2006-01"), "-org", "acme", "-format", "csv")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "acme")
	code, out = reconcile("invoice", "-period", past.Format("2006-01"), "-org", "nobody")
	require.Equal(t, 1, code, out)
	code, out = reconcile("close") // the last month past its grace: last month, or the one before
	require.Equal(t, 0, code, out)
	// A line slipped in behind the close's back (by the owner, the seal's triggers off):
	// verify says the invoice no longer ties out.
	err = testenv.ExecUnsealed(ctx, pool, "invoice_lines", `insert into invoice_lines (invoice_id, line_no, kind, account_path, unit, quantity, unit_price_minor, per_units, amount_minor)
select id, 999, 'adjustment', 'acme', 'requests', 1, 1, 1, 1 from invoices`)
	require.NoError(t, err)
	code, out = reconcile("verify")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "subtotal = sum of lines")
	// A run checks the invoices too: it finishes, names the failure and exits 1.
	code, out = reconcile("-json")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, `"invariant_failures":["invoice `)
	require.Contains(t, out, "subtotal = sum of lines")
	code, out = reconcile("close", "-period", "2026-13")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "YYYY-MM")
}

// One org's bad data does not stop the books for the others (issue 28, finding 3): broke's
// tokens counter holds "1.38e+19" and huge's usage of a closed month sums past bigint.
// verify lists broke's counter (key and raw value) beside acme's difference and exits 1;
// a run corrects acme, reports broke and exits 1; a close issues acme's invoice, reports
// huge's and exits 1; once huge's usage is fixed the same close issues huge's invoice.
func TestBadDataDoesNotStopTheBooks(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	pool, rdb, counter, env := setupAcme(t)
	uncapped := int64(-1)
	_, err := policy.NewStore(pool).CreateAccount(ctx, policy.Account{ID: "broke", Kind: policy.Org, Plan: "pro",
		Limits: map[policy.Unit]policy.Limit{policy.Tokens: {Quota: &uncapped, QuotaPeriod: policy.Month}}})
	require.NoError(t, err)
	_, err = policy.NewStore(pool).CreateAccount(ctx, policy.Account{ID: "huge", Kind: policy.Org, Plan: "pro"})
	require.NoError(t, err)
	now := time.Now().UTC()
	label := period.MonthLabel(now)
	brokeKey := keyspace.Keys{Prefix: envValue(env, "ADMIT_KEY_PREFIX"), Shards: 16}.Quota("broke", "broke", policy.Tokens, label)
	require.NoError(t, rdb.Set(ctx, brokeKey, "1.38e+19", 0).Err())
	_, err = pool.Exec(ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, tokens, kafka_partition, kafka_offset)
values ('broke-1', $1, $2, $1, 'broke', 'broke', 'org', '{broke}', 'test', 100, 0, 100)`, period.MonthStart(now), now)
	require.NoError(t, err)

	past := period.MonthStart(now).AddDate(0, -2, 0)
	_, err = pool.Exec(ctx, `select usage_events_partition($1)`, past)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, requests, tokens, kafka_partition, kafka_offset)
select 'past-' || g, $1, $2, $1, case when g = 0 then 'acme' else 'huge' end, case when g = 0 then 'acme' else 'huge' end,
       'org', case when g = 0 then '{acme}'::text[] else '{huge}'::text[] end, 'test', 1, 1000000000000000, 2, g
from generate_series(0, 9300) g`, past, past.Add(time.Hour))
	require.NoError(t, err)

	start := func(args ...string) (int, string) {
		t.Helper()
		p := testenv.StartMain(t, env, args...)
		code, err := p.Wait(time.Minute)
		require.NoError(t, err)
		return code, p.Output()
	}

	code, out := start("verify", "-json")
	require.Equal(t, 1, code, out)
	var v struct {
		Differences []reconcile.Difference `json:"differences"`
		Problems    []reconcile.Problem    `json:"problems"`
	}
	require.NoError(t, json.Unmarshal([]byte(jsonLine(t, out, `{"differences"`)), &v))
	require.Len(t, v.Problems, 1, out)
	require.Equal(t, reconcile.BadCounter, v.Problems[0].Kind)
	require.Equal(t, "broke", v.Problems[0].Org)
	require.Equal(t, brokeKey, v.Problems[0].Key)
	require.Equal(t, "1.38e+19", v.Problems[0].Value)
	logLine := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "verify skipped an account's bad data") {
			logLine = line
		}
	}
	require.Contains(t, logLine, brokeKey, "the warning names the key: %s", out)
	require.Contains(t, logLine, "1.38e+19", "and the raw value")
	require.Contains(t, logLine, "broke", "and the org")
	var acme []string
	for _, d := range v.Differences {
		acme = append(acme, d.String())
	}
	require.Contains(t, acme, fmt.Sprintf("acme acme requests %s: redis 5, billable 3", label), "acme is still checked")

	code, out = start("verify")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, `problem: bad_counter broke broke tokens `+label+` key `+brokeKey+` value "1.38e+19"`)

	code, out = start("-json")
	require.Equal(t, 1, code, out)
	var s reconcile.Summary
	require.NoError(t, json.Unmarshal([]byte(jsonLine(t, out, `{"run_id"`)), &s))
	require.Equal(t, 2, s.ByKind[reconcile.Refund5xx], "acme's refunds are applied")
	require.Equal(t, "3", rdb.Get(ctx, counter).Val())
	require.Len(t, s.Problems, 1, out)
	require.Equal(t, brokeKey, s.Problems[0].Key)
	require.Equal(t, "1.38e+19", rdb.Get(ctx, brokeKey).Val())

	code, out = start("close", "-period", past.Format("2006-01"))
	require.Equal(t, 1, code, out)
	var res struct {
		Created  bool
		Issued   int
		Invoices []struct{ Org string }
		Failed   []struct{ Org, Error string }
	}
	require.NoError(t, json.Unmarshal([]byte(jsonLine(t, out, `{"Period"`)), &res))
	require.True(t, res.Created)
	require.Equal(t, 1, res.Issued)
	require.Len(t, res.Invoices, 1)
	require.Equal(t, "acme", res.Invoices[0].Org)
	require.Len(t, res.Failed, 1)
	require.Equal(t, "huge", res.Failed[0].Org)
	require.Contains(t, res.Failed[0].Error, "bigint")

	_, err = pool.Exec(ctx, `insert into usage_voids (event_id, attempt, reason, void_time, source, kafka_partition, kafka_offset)
select 'past-' || g, 'past-' || g, 'unavailable', now(), 'test', 3, g from generate_series(2, 9300) g`)
	require.NoError(t, err)
	code, out = start("close", "-period", past.Format("2006-01"))
	require.Equal(t, 0, code, out)
	require.NoError(t, json.Unmarshal([]byte(jsonLine(t, out, `{"Period"`)), &res))
	require.False(t, res.Created)
	require.Equal(t, 1, res.Issued, "huge's invoice, once its usage is fixed")
	require.Len(t, res.Invoices, 2)
	require.Empty(t, res.Failed)
	code, out = start("close", "-period", past.Format("2006-01"))
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"Issued":0`)
}

// envValue is the value of name in a process environment.
func envValue(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// jsonLine is the line of out that starts with prefix.
func jsonLine(t *testing.T, out, prefix string) string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	t.Fatalf("no line starting with %s in:\n%s", prefix, out)
	return ""
}
