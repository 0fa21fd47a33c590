// Package demo is `make demo`: a guided run of the whole pipeline on the local stack. It
// starts admit and meter (the binaries of bin/) on a database, a Redis key prefix and a
// Kafka topic of their own, creates a price plan, the seeds' account tree, a free, an
// enterprise and a prepaid org (and its credit grants) through admit's admin API, drives
// synthetic traffic through pkg/client, waits until every admitted event is a row in
// PostgreSQL, runs reconcile and a period close, and prints a report. See docs/demo.md.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/reconcile"
	"github.com/metergate/metergate/internal/sandbox"
	"github.com/metergate/metergate/internal/topic"
	"github.com/metergate/metergate/pkg/client"
)

// Config is what a demo run uses.
type Config struct {
	// BinDir holds the admit, meter and reconcile binaries (make build: bin/).
	BinDir string
	// RedisURL, DatabaseURL and Brokers locate the stack (.run/env: REDIS_URL,
	// DATABASE_URL, KAFKA_BROKERS). DatabaseURL names the server and the credentials of a
	// role that may create schemas (DATABASE_MIGRATE_URL when the stack has two roles): the
	// demo works in a database of its own on it (see Database), its services as that role.
	RedisURL    string
	DatabaseURL string
	Brokers     []string
	// Duration of the traffic.
	Duration time.Duration
	// Database is the name of the demo's own database, dropped and created at each run.
	// When the role may not create databases, it is a schema of that name in DatabaseURL's
	// database instead, dropped and created the same way.
	Database string
	// KeyPrefix is the Redis key prefix (admit's ADMIT_KEY_PREFIX); its keys are deleted at
	// the start of a run.
	KeyPrefix string
	// Topic is the Kafka topic, created for the run and deleted at its end; empty: a name
	// of this run ("metergate.demo.<time>").
	Topic string
	// LogDir receives admit.log, meter.log and reconcile.log.
	LogDir string
	// DrainTimeout bounds the wait for the last rows (1 minute when zero).
	DrainTimeout time.Duration
	// Console, after the report, serves the console of the demo's data until ctx ends
	// (make demo-console): admit again, on loopback, signed into with the admin token.
	Console bool
	// Cleanup drops the database (or schema) and deletes the Redis keys at the end too
	// (tests); otherwise they are left for inspection until the next run.
	Cleanup bool
	// Seed of the traffic's random choices (timings make runs differ anyway).
	Seed uint64
}

// Tokens of the demo's admit.
const (
	serviceToken = "demo-service-token-0123456789"
	adminToken   = "demo-admin-token-0123456789"
)

// Run runs the demo, printing its steps, a progress line and the report to out. It returns
// the report (as far as the run got) and an error when a step failed or the books do not
// add up (Report.Check). A step before the traffic that fails ends the run; one after it
// (reconcile, close, verify, stopping) is one of the report's Problems, and the report is
// printed anyway. admit and meter never outlive Run.
func Run(ctx context.Context, cfg Config, out io.Writer) (*Report, error) {
	if cfg.Duration <= 0 {
		return nil, errors.New("duration: want more than 0")
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = time.Minute
	}
	for _, b := range []string{"admit", "meter", "reconcile"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("binary %s: %w (make build puts it in bin/)", b, err)
		}
	}
	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return nil, err
	}
	stale := cfg.Topic == "" // topics of earlier runs (killed before their end) go too
	if cfg.Topic == "" {
		cfg.Topic = topicPrefix + time.Now().UTC().Format("20060102-150405")
	}
	r := &Report{Duration: cfg.Duration}
	step := func(format string, args ...any) func(error) error {
		msg := fmt.Sprintf(format, args...)
		fmt.Fprintf(out, "• %s ", msg)
		begin := time.Now()
		return func(err error) error {
			if err != nil {
				fmt.Fprintln(out, "FAILED")
				return fmt.Errorf("%s: %w", msg, err)
			}
			fmt.Fprintf(out, "ok (%s)\n", time.Since(begin).Round(10*time.Millisecond))
			return nil
		}
	}
	fmt.Fprintf(out, "metergate demo: %s of traffic through admit → Redis outbox → Kafka → meter → PostgreSQL, then reconcile and a period close\n\n", cfg.Duration)

	// PostgreSQL: a database (or schema) of the demo's own.
	done := step("PostgreSQL: fresh %q", cfg.Database)
	dbURL, where, err := sandbox.FreshDatabase(ctx, cfg.DatabaseURL, cfg.Database)
	if err := done(err); err != nil {
		return r, err
	}
	if strings.HasPrefix(where, "schema") {
		fmt.Fprintf(out, "  (this role may not create databases: %s instead)\n", where)
	}
	r.Where = where
	if cfg.Cleanup {
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = sandbox.DropDatabase(cctx, cfg.DatabaseURL, cfg.Database)
		}()
	}

	// Redis: the prefix's keys of an earlier run go.
	rdbOpts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return r, fmt.Errorf("REDIS_URL: %w", err)
	}
	rdb := redis.NewClient(rdbOpts)
	defer rdb.Close()
	done = step("Redis: delete the keys of prefix %q", cfg.KeyPrefix)
	n, err := sandbox.DeleteKeys(ctx, rdb, cfg.KeyPrefix)
	if err := done(err); err != nil {
		return r, err
	}
	fmt.Fprintf(out, "  (%d keys deleted)\n", n)
	if cfg.Cleanup {
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_, _ = sandbox.DeleteKeys(cctx, rdb, cfg.KeyPrefix)
		}()
	}

	// Kafka: a topic of this run.
	done = step("Kafka: create topic %s", cfg.Topic)
	tctx, cancel := context.WithTimeout(ctx, time.Minute)
	var removed []string
	if stale {
		removed, err = sandbox.DeleteTopics(tctx, cfg.Brokers, topicPrefix)
	}
	if err == nil {
		err = topic.Ensure(tctx, cfg.Brokers, topic.Spec{Name: cfg.Topic, Partitions: 4, ReplicationFactor: 1})
	}
	cancel()
	if err := done(err); err != nil {
		return r, err
	}
	if len(removed) > 0 {
		fmt.Fprintf(out, "  (topics of earlier runs deleted: %s)\n", strings.Join(removed, ", "))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = topic.Delete(cctx, cfg.Brokers, cfg.Topic)
	}()

	env := []string{
		// DATABASE_MIGRATE_URL= : the services migrate the demo's space, not the one the
		// environment's owner URL names.
		"DATABASE_URL=" + dbURL, "DATABASE_MIGRATE_URL=", "REDIS_URL=" + cfg.RedisURL, "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=",
		"KAFKA_BROKERS=" + strings.Join(cfg.Brokers, ","), "KAFKA_TOPIC=" + cfg.Topic, "KAFKA_TOPIC_PARTITIONS=4",
		"ADMIT_KEY_PREFIX=" + cfg.KeyPrefix, "ADMIT_SHARDS=16", "LOG_FORMAT=text", "LOG_LEVEL=info", "MIGRATE=false",
		// The demo's webhook receiver listens on 127.0.0.1.
		"WEBHOOK_ALLOW_PRIVATE=true",
	}
	env = append(env, billingEnv...)

	// meter first, with -migrate: the schema is there once it is ready.
	meterAddr, err := sandbox.FreeAddr()
	if err != nil {
		return r, err
	}
	done = step("start meter on %s (-migrate)", meterAddr)
	meter, err := sandbox.Start(cfg.BinDir, cfg.LogDir, "meter", meterAddr,
		append(env, "METER_ADDR="+meterAddr, "METER_GROUP=metergate-demo-"+cfg.Topic), "-migrate")
	if err == nil {
		defer meter.Kill()
		err = meter.WaitReady(ctx, 90*time.Second)
	}
	if err := done(err); err != nil {
		return r, err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return r, err
	}
	defer pool.Close()

	admitAddr, err := sandbox.FreeAddr()
	if err != nil {
		return r, err
	}
	done = step("start admit on %s (relay inside)", admitAddr)
	admitP, err := sandbox.Start(cfg.BinDir, cfg.LogDir, "admit", admitAddr,
		admitEnv(env, admitAddr))
	if err == nil {
		defer admitP.Kill()
		err = admitP.WaitReady(ctx, 90*time.Second)
	}
	if err := done(err); err != nil {
		return r, err
	}

	httpClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	admin := sandbox.Admin{Base: admitP.URL(), Token: adminToken, HTTP: httpClient}
	done = step("add the price plan %q (POST /v1/admin/plans): %s", teamPlan, teamPlanSummary)
	if err := done(addTeamPlan(ctx, admin)); err != nil {
		return r, err
	}
	tree := accounts(cfg.Duration)
	done = step("create %d accounts and their API keys (POST /v1/admin/accounts, /v1/admin/api-keys)", len(tree))
	keys, err := setup(ctx, admin, tree)
	if err := done(err); err != nil {
		return r, err
	}
	printTree(out, tree)
	done = step("billing details of acme (PUT /v1/admin/accounts/acme/billing): Acme GmbH, Berlin, taxed at 19 %%")
	if err := done(admin.Do(ctx, http.MethodPut, "/v1/admin/accounts/acme/billing", acmeBilling, http.StatusOK, nil)); err != nil {
		return r, err
	}
	r.Credits = Credits{Account: prepaidOrg, Unit: prepaidUnit, Expect: true}
	firstGrant, topUp := prepaidGrants(cfg.Duration)
	done = step("grant %s %s %s (POST /v1/admin/accounts/%s/grants, idempotency key %s), then retry it",
		prepaidOrg, num(firstGrant), prepaidUnit, prepaidOrg, grantKey)
	if err := done(grantPrepaid(ctx, admin, &r.Credits, firstGrant)); err != nil {
		return r, err
	}
	fmt.Fprintf(out, "  grant %s: 201; the retry: 200, grant %s\n", r.Credits.Grants[0].ID, r.Credits.RetryID)
	rc, stopReceiver, err := startReceiver()
	if err != nil {
		return r, err
	}
	defer stopReceiver()
	done = step("webhook endpoint %s (POST /v1/admin/webhooks) and alert rules (POST /v1/admin/alerts)", rc.url)
	if err := done(setupAlerts(ctx, admin, rc, &r.Alerts)); err != nil {
		return r, err
	}
	fmt.Fprintf(out, "  free plan: 50, 80, 100 %% of the month's requests quota; %s: balance of %s below 50 %% of what was granted\n",
		prepaidOrg, prepaidUnit)
	done = step("wait until admit's policy cache holds the accounts and the grant")
	if err := done(waitLoaded(ctx, admin, tree)); err != nil {
		return r, err
	}
	if err := printReserved(ctx, out, admin, tree); err != nil {
		return r, fmt.Errorf("effective policy: %w", err)
	}

	// Traffic.
	fmt.Fprintf(out, "\n• traffic for %s through pkg/client (decisions by result; outcomes reported):\n", cfg.Duration)
	st := newStats()
	begin := time.Now()
	t := &traffic{c: &client.Client{BaseURL: admitP.URL(), Token: serviceToken, HTTP: httpClient, Log: discard},
		keys: keys, st: st, begin: begin, end: begin.Add(cfg.Duration), seed: cfg.Seed,
		topUp: func(ctx context.Context) (GrantMade, error) {
			g, err := grant(ctx, admin, prepaidOrg, prepaidUnit, topUp, topUpKey, http.StatusCreated)
			return GrantMade{ID: g.ID, Amount: g.Amount, Key: g.IdempotencyKey}, err
		}}
	stop := make(chan struct{})
	printed := make(chan struct{})
	go func() { progress(out, st, begin, cfg.Duration, stop); close(printed) }()
	t.run(ctx, cfg.Duration)
	close(stop)
	<-printed
	if err := ctx.Err(); err != nil {
		return r, err
	}
	r.Guarantees = guarantees(tree)
	r.ExpectBorrowing = len(r.Guarantees) > 0
	st.snapshot(r)
	priority := map[string]int{}
	for _, a := range tree {
		priority[a.ID] = a.Priority
	}
	for i := range r.Waits {
		r.Waits[i].Priority = priority[r.Waits[i].Account]
	}
	sort.SliceStable(r.Waits, func(i, j int) bool { return r.Waits[i].Priority > r.Waits[j].Priority })

	// Drain: every admitted event a row, every outcome metered.
	done = step("wait until the pipeline is drained (%d events, %d outcomes; at most %s)", r.Admitted, r.OutcomesReported, cfg.DrainTimeout)
	drainBegin := time.Now()
	err = drain(ctx, pool, r, cfg.DrainTimeout)
	r.DrainTime = time.Since(drainBegin)
	if err != nil { // the books are checked and reported below; go on
		fmt.Fprintf(out, "NOT DRAINED: %v\n", err)
	} else {
		_ = done(nil)
	}
	// From here on a failed step is a problem of the report, which is printed anyway.
	problem := func(err error) { r.Problems = append(r.Problems, err.Error()) }
	if err := compareRows(ctx, pool, st.eventIDs(), r); err != nil {
		problem(fmt.Errorf("read usage_events: %w", err))
	}
	if err := borrowings(ctx, pool, r); err != nil {
		problem(fmt.Errorf("read usage_borrowings: %w", err))
	}
	r.Alerts.told = st.eventIDs()
	done = step("wait until every alert reached the receiver (usage_alerts, webhook deliveries)")
	if err := done(readAlerts(ctx, pool, rc, begin, 30*time.Second, &r.Alerts)); err != nil {
		problem(err)
	}

	// Reconcile, then close the period(s) and export the invoices.
	done = step("bin/reconcile -json")
	outJSON, err := sandbox.RunTool(ctx, cfg.BinDir, cfg.LogDir, "reconcile", env, "-json")
	if err == nil {
		err = json.Unmarshal([]byte(sandbox.LastLine(outJSON)), &r.Reconcile)
	}
	if err == nil {
		err = adjustments(ctx, pool, r)
	}
	if err := done(err); err != nil {
		problem(err)
	}
	for _, p := range r.Periods {
		done = step("bin/reconcile close -force -period %s", p)
		outJSON, err := sandbox.RunTool(ctx, cfg.BinDir, cfg.LogDir, "reconcile", env, "close", "-force", "-period", p)
		var res struct{ Invoices []invoice.Invoice }
		if err == nil {
			err = json.Unmarshal([]byte(sandbox.LastLine(outJSON)), &res)
		}
		if err := done(err); err != nil {
			problem(err)
			continue
		}
		for _, inv := range res.Invoices {
			done = step("bin/reconcile invoice -period %s -org %s", p, inv.Org)
			outJSON, err := sandbox.RunTool(ctx, cfg.BinDir, cfg.LogDir, "reconcile", env, "invoice", "-period", p, "-org", inv.Org, "-format", "json")
			var exp invoice.Invoice
			if err == nil {
				err = json.Unmarshal([]byte(outJSON), &exp)
			}
			if err := done(err); err != nil {
				problem(err)
				continue
			}
			r.Invoices = append(r.Invoices, exp)
			done = step("GET /v1/admin/invoices/%d.pdf: write %s.pdf", exp.ID, exp.Number)
			path, err := writePDF(ctx, admin, cfg.LogDir, exp)
			if err := done(err); err != nil {
				problem(err)
				continue
			}
			r.Documents.PDFs = append(r.Documents.PDFs, path)
		}
	}
	if len(r.Invoices) > 0 {
		inv := r.Invoices[0]
		done = step("void invoice %s (POST /v1/admin/invoices/%d/void): a credit note of its total", inv.Number, inv.ID)
		if err := done(voidOne(ctx, admin, inv, &r.Documents)); err != nil {
			problem(err)
		}
	}
	done = step("bin/reconcile verify (counters = billable totals, invoices tie out)")
	_, err = sandbox.RunTool(ctx, cfg.BinDir, cfg.LogDir, "reconcile", env, "verify")
	r.Verified = err == nil
	if err := done(err); err != nil {
		problem(err)
	}
	done = step("read %s's credits: finance_credit_balances, and GET /v1/balance/%s", prepaidOrg, prepaidOrg)
	svc := sandbox.Admin{Base: admitP.URL(), Token: serviceToken, HTTP: httpClient}
	if err := done(readCredits(ctx, pool, svc, &r.Credits)); err != nil {
		problem(err)
	}

	// Stop admit, then meter, gracefully.
	done = step("stop admit and meter (SIGTERM)")
	err = errors.Join(admitP.Stop(30*time.Second), meter.Stop(30*time.Second))
	if err := done(err); err != nil {
		problem(err)
	}
	if err := ctx.Err(); err != nil {
		return r, err
	}

	fmt.Fprintln(out)
	r.Print(out)
	r.Printed = true
	if cfg.Cleanup {
		fmt.Fprintf(out, "\nRemoving the demo's data (%s, Redis keys %s{N}:*). Logs in %s.\n", where, cfg.KeyPrefix, cfg.LogDir)
	} else {
		fmt.Fprintf(out, "\nThe demo's data stay until the next run, for a look: PostgreSQL %s, Redis keys %s{N}:*, logs in %s.\n", where, cfg.KeyPrefix, cfg.LogDir)
	}
	if err := r.Check(); err != nil || !cfg.Console {
		return r, err
	}
	return r, serveConsole(ctx, cfg, env, out)
}

// admitEnv is the environment of the demo's admit on addr: its tokens, and the console's
// session cookie without Secure, as the console is reached over plain HTTP on loopback.
func admitEnv(env []string, addr string) []string {
	return append(env, "ADMIT_ADDR="+addr, "ADMIT_NODE=demo", "REDIS_TIMEOUT=5s",
		"ADMIT_SERVICE_TOKEN="+serviceToken, "ADMIT_ADMIN_TOKEN="+adminToken, "CONSOLE_INSECURE_COOKIES=true",
		"PORTAL_ENABLED=true", "PORTAL_BRAND_NAME=Demo Cloud")
}

// serveConsole starts admit again on the demo's data and serves its console until ctx
// ends (Ctrl-C).
func serveConsole(ctx context.Context, cfg Config, env []string, out io.Writer) error {
	addr, err := sandbox.FreeAddr()
	if err != nil {
		return err
	}
	p, err := sandbox.Start(cfg.BinDir, cfg.LogDir, "admit", addr, admitEnv(env, addr))
	if err != nil {
		return err
	}
	defer p.Kill()
	if err := p.WaitReady(ctx, 90*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nThe console of the demo's data: %s/console/\nSign in with the admin token %s (or a staff token: admit staff -create NAME -role ROLE,\nwith DATABASE_URL of the demo's database). Ctrl-C stops it.\n", p.URL(), adminToken)
	// acme's customer portal, as the seller's backend would open it (docs/portal.md).
	admin := sandbox.Admin{Base: p.URL(), Token: adminToken, HTTP: &http.Client{Timeout: 10 * time.Second}}
	var link struct {
		URL string `json:"url"`
	}
	if err := admin.Do(ctx, http.MethodPost, "/v1/admin/portal-sessions", map[string]any{"account": "acme",
		"scopes": []string{"usage:read", "billing:read", "keys:write", "accounts:write"}, "return_url": p.URL() + "/console/"},
		http.StatusCreated, &link); err != nil {
		return err
	}
	fmt.Fprintf(out, "acme's customer portal, a link that opens once within 5 minutes: %s%s\n", p.URL(), link.URL)
	<-ctx.Done()
	return p.Stop(30 * time.Second)
}

// drain polls PostgreSQL until it holds a row per admitted event and every reported
// outcome, or the timeout passes.
func drain(ctx context.Context, pool *pgxpool.Pool, r *Report, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_events), (SELECT count(*) FROM usage_outcomes)`).
			Scan(&r.Rows, &r.OutcomesMetered)
		if err != nil {
			return err
		}
		if r.Rows >= r.Admitted && r.OutcomesMetered >= r.OutcomesReported {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %d of %d events and %d of %d outcomes in PostgreSQL", timeout, r.Rows, r.Admitted, r.OutcomesMetered, r.OutcomesReported)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// compareRows compares the rows of usage_events with the event ids the callers got.
func compareRows(ctx context.Context, pool *pgxpool.Pool, ids map[string]bool, r *Report) error {
	rows, err := pool.Query(ctx, `SELECT event_id FROM usage_events`)
	if err != nil {
		return err
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	r.Rows = len(got)
	seen := map[string]bool{}
	for _, id := range got {
		switch {
		case seen[id]:
			r.Duplicates++
		case !ids[id]:
			r.Unexpected++
		}
		seen[id] = true
	}
	for id := range ids {
		if !seen[id] {
			r.Missing++
		}
	}
	return nil
}

// adjustments reads what reconcile recorded, per kind, level, account and unit.
func adjustments(ctx context.Context, pool *pgxpool.Pool, r *Report) error {
	rows, err := pool.Query(ctx, `
		SELECT kind, level, account, unit, count(*), sum(amount), count(*) FILTER (WHERE applied_at IS NULL)
		FROM adjustments GROUP BY kind, level, account, unit`)
	if err != nil {
		return err
	}
	r.Adjustments, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Adjustment, error) {
		var a Adjustment
		err := row.Scan(&a.Kind, &a.Level, &a.Account, &a.Unit, &a.Rows, &a.Amount, &a.NotApplied)
		return a, err
	})
	sort.Slice(r.Adjustments, func(i, j int) bool {
		a, b := r.Adjustments[i], r.Adjustments[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if levelRank(a.Level) != levelRank(b.Level) {
			return levelRank(a.Level) < levelRank(b.Level)
		}
		return a.Account+" "+a.Unit < b.Account+" "+b.Unit
	})
	return err
}

// borrowings reads the chargeback view, finance_borrowing, and the sum of the table under
// it, usage_borrowings.
func borrowings(ctx context.Context, pool *pgxpool.Pool, r *Report) error {
	rows, err := pool.Query(ctx, `
		SELECT account, lender, unit, period, events, units FROM finance_borrowing
		ORDER BY org, lender, account, unit, period`)
	if err != nil {
		return err
	}
	r.Borrowings, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Borrowing, error) {
		var b Borrowing
		err := row.Scan(&b.Account, &b.Lender, &b.Unit, &b.Period, &b.Events, &b.Units)
		return b, err
	})
	if err != nil {
		return err
	}
	r.BorrowedView = 0
	for _, b := range r.Borrowings {
		r.BorrowedView += b.Units
	}
	return pool.QueryRow(ctx, `SELECT coalesce(sum(units), 0)::bigint FROM usage_borrowings`).Scan(&r.BorrowedUnits)
}

// topicPrefix starts the names of the topics the demo makes (one per run).
const topicPrefix = "metergate.demo."

// Summary is reconcile's -json summary.
type Summary = reconcile.Summary
