package billinglog_test

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/billinglog"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	org  string // unique per test: rows of parallel tests never meet
	n    int
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	return &testBundle{ctx: testenv.Context(t, time.Minute), pool: testenv.Postgres(t), org: strings.ReplaceAll(testenv.Name(t), "_", "-")}
}

// admitted is a usage_events row as the meter writes it.
type admitted struct {
	account, key, tool string
	at                 time.Time
	charged            string // "YYYY-MM"; at's month when ""
	units              [4]int64
}

// insert writes r and returns its event id.
func (b *testBundle) insert(t *testing.T, r admitted) string {
	t.Helper()
	b.n++
	id := b.org + "-e" + strconv.Itoa(b.n)
	if r.charged == "" {
		r.charged = period.MonthLabel(r.at)
	}
	charged, err := period.ParseMonth(r.charged)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `select usage_events_partition($1::date)`, period.MonthStart(r.at))
	require.NoError(t, err)
	var tool, key *string
	if r.tool != "" {
		tool = &r.tool
	}
	if r.key != "" {
		key = &r.key
	}
	_, err = b.pool.Exec(b.ctx, `
insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind, path,
    idempotency_key, tool, source, requests, tokens, credits, cost_micros, kafka_partition, kafka_offset)
values ($1, $2, $3, $4, $5, $6, 'agent', array[$5, $6], $7, $8, 'node-1', $9, $10, $11, $12, 0, 0)`,
		id, period.MonthStart(r.at), r.at, charged, b.org, r.account, key, tool, r.units[0], r.units[1], r.units[2], r.units[3])
	require.NoError(t, err)
	return id
}

// void records id in usage_voids, as the meter does from a usage.voided event.
func (b *testBundle) void(t *testing.T, id string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `insert into usage_voids (event_id, attempt, reason, void_time, source, kafka_partition, kafka_offset)
values ($1, $1, 'caller_gone', now(), 'node-1', 0, 0)`, id)
	require.NoError(t, err)
}

func TestFirst(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC().Truncate(time.Microsecond)
	since := now.Add(-24 * time.Hour)

	t.Run("the first admission of the key, its units, tool and period", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		acc := b.org + "-agent"
		first := b.insert(t, admitted{account: acc, key: "k1", tool: "llm_call", at: now.Add(-3 * time.Hour), units: [4]int64{1, 2500, 3, 0}})
		b.insert(t, admitted{account: acc, key: "k1", tool: "llm_call", at: now.Add(-time.Hour), units: [4]int64{1, 2500, 3, 0}})
		b.insert(t, admitted{account: acc, key: "k2", at: now.Add(-4 * time.Hour), units: [4]int64{1, 0, 0, 0}})
		b.insert(t, admitted{account: acc, at: now.Add(-5 * time.Hour), units: [4]int64{1, 0, 0, 0}})

		got, ok, err := billinglog.New(b.pool, billinglog.Options{}).First(b.ctx, acc, "k1", since)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, admission.LoggedAdmission{EventID: first, Period: period.MonthLabel(now.Add(-3 * time.Hour)), Tool: "llm_call",
			Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500, policy.Credits: 3}}, got)
	})

	t.Run("another account's key, an older one, a key never used: none", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		acc := b.org + "-agent"
		b.insert(t, admitted{account: acc, key: "k1", at: now.Add(-25 * time.Hour), units: [4]int64{1, 0, 0, 0}})
		b.insert(t, admitted{account: b.org + "-other", key: "k1", at: now.Add(-time.Hour), units: [4]int64{1, 0, 0, 0}})
		log := billinglog.New(b.pool, billinglog.Options{})
		for _, k := range []string{"k1", "never"} {
			_, ok, err := log.First(b.ctx, acc, k, since)
			require.NoError(t, err)
			require.False(t, ok, k)
		}
	})

	t.Run("a voided admission is not there", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		acc := b.org + "-agent"
		voided := b.insert(t, admitted{account: acc, key: "k1", at: now.Add(-3 * time.Hour), units: [4]int64{1, 10, 0, 0}})
		b.void(t, voided)
		second := b.insert(t, admitted{account: acc, key: "k1", at: now.Add(-2 * time.Hour), units: [4]int64{1, 10, 0, 0}})
		log := billinglog.New(b.pool, billinglog.Options{})
		got, ok, err := log.First(b.ctx, acc, "k1", since)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, second, got.EventID, "decided afresh after the void: the second admission is the first one billed")

		b.void(t, second)
		_, ok, err = log.First(b.ctx, acc, "k1", since)
		require.NoError(t, err)
		require.False(t, ok, "every admission of the key voided")
	})

	t.Run("across a month boundary: the previous month's partition", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		acc := b.org + "-agent"
		start := period.MonthStart(now).AddDate(0, 2, 0) // a month no other test writes
		at := start.Add(-2 * time.Hour)
		id := b.insert(t, admitted{account: acc, key: "k1", at: at, charged: period.MonthLabel(start), units: [4]int64{0, 0, 0, 7}})
		log := billinglog.New(b.pool, billinglog.Options{Clock: period.Fixed(start.Add(time.Hour))})
		got, ok, err := log.First(b.ctx, acc, "k1", start.Add(-23*time.Hour))
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, admission.LoggedAdmission{EventID: id, Period: period.MonthLabel(start),
			Units: map[policy.Unit]int64{policy.CostMicros: 7}}, got, "charged to the month its quota counter was")
	})

	t.Run("a log that does not answer in time is an error", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		acc := b.org + "-agent"
		b.insert(t, admitted{account: acc, key: "k1", at: now.Add(-time.Hour), units: [4]int64{1, 0, 0, 0}})
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()
		// The partition this lookup reads, locked as a long ALTER TABLE would hold it.
		_, err = tx.Exec(b.ctx, `lock table `+pgx.Identifier{"usage_events_" + now.Add(-time.Hour).UTC().Format("2006_01")}.Sanitize()+` in access exclusive mode`)
		require.NoError(t, err)
		start := time.Now()
		_, _, err = billinglog.New(b.pool, billinglog.Options{Timeout: 300 * time.Millisecond}).First(b.ctx, acc, "k1", since)
		require.Error(t, err)
		require.Less(t, time.Since(start), 10*time.Second)
	})
}

// The lookup reads the current and the previous month's partitions only, and can use the
// index of migration 00021 in each.
func TestFirstPrunesPartitionsAndUsesTheIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := period.MonthStart(time.Now()).AddDate(0, 5, 0).Add(6 * time.Hour) // a month ahead, its first day: since is in the previous one
	for m := -3; m <= 3; m++ {
		_, err := b.pool.Exec(b.ctx, `select usage_events_partition($1::date)`, period.MonthStart(now).AddDate(0, m, 0))
		require.NoError(t, err)
	}
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(b.ctx, `set local enable_seqscan = off`) // a small table would be scanned: is the index usable?
	require.NoError(t, err)
	var plan string
	since := now.Add(-24 * time.Hour)
	require.NoError(t, tx.QueryRow(b.ctx, "explain (format json) "+billinglog.FirstSQL, pgx.StrictNamedArgs{
		"account": "a", "key": "k", "since": since,
		"first_period": period.MonthStart(since), "last_period": period.MonthStart(now.Add(time.Hour)),
	}).Scan(&plan))
	var scanned []string
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if rel, ok := n["Relation Name"].(string); ok && strings.HasPrefix(rel, "usage_events") {
			scanned = append(scanned, rel+" "+n["Node Type"].(string)+" "+func() string { s, _ := n["Index Name"].(string); return s }())
		}
		for _, c := range n["Plans"].([]any) {
			walk(c.(map[string]any))
		}
	}
	var doc []map[string]any
	require.NoError(t, json.Unmarshal([]byte(plan), &doc))
	root := doc[0]["Plan"].(map[string]any)
	fix(root)
	walk(root)
	prev, cur := "usage_events_"+now.AddDate(0, -1, 0).Format("2006_01"), "usage_events_"+now.Format("2006_01")
	require.Len(t, scanned, 2, "%v", scanned)
	for i, want := range []string{prev, cur} {
		require.True(t, strings.HasPrefix(scanned[i], want+" "), "%v", scanned)
		require.Contains(t, scanned[i], "Index Scan "+want+"_account_idempotency_key_idx", "%v", scanned) // the child of usage_events_idempotency_idx
	}
}

// fix gives every plan node a Plans list, so that walking needs no checks.
func fix(n map[string]any) {
	if _, ok := n["Plans"]; !ok {
		n["Plans"] = []any{}
	}
	for _, c := range n["Plans"].([]any) {
		fix(c.(map[string]any))
	}
}
