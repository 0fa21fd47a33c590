package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

// sealedBundle is a migrated schema of the test's own with two closed months, as the
// services (app) and as the owner that migrated it (owner). January's invoice of acme is
// issued; February's bills an event of January that arrived after its close (a late line
// and an invoice_late_events row).
type sealedBundle struct {
	ctx        context.Context
	app, owner *pgxpool.Pool
	jan, feb   int64 // acme's invoices
	lateEvent  string
	seq        atomic.Int64
	own        string // the owner's role name
}

var (
	january  = time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC)
	february = time.Date(2025, time.February, 1, 0, 0, 0, 0, time.UTC)
)

func setupSealed(t *testing.T) *sealedBundle {
	t.Helper()
	testenv.RequireRoles(t)
	ctx := testenv.Context(t, 2*time.Minute)
	owner, schema := testenv.EmptySchema(t)
	_, err := migrations.Up(ctx, owner)
	require.NoError(t, err)
	app, err := pgxpool.New(ctx, testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema))
	require.NoError(t, err)
	t.Cleanup(app.Close)
	b := &sealedBundle{ctx: ctx, app: app, owner: owner}
	require.NoError(t, owner.QueryRow(ctx, `select current_user`).Scan(&b.own))

	// Everything below runs as the services do: the app role adds a partition, writes
	// usage, closes two months.
	_, err = app.Exec(ctx, `insert into accounts (id, kind, org, plan, created_at) values ('acme', 'org', 'acme', 'pro', '2020-01-01')`)
	require.NoError(t, err)
	b.event(t, january.Add(time.Hour))
	jan, err := invoice.Close(ctx, app, january, invoice.Options{Force: true})
	require.NoError(t, err, "the close works as the app role")
	require.Len(t, jan.Invoices, 1)
	b.jan = jan.Invoices[0].ID
	b.lateEvent = b.event(t, january.Add(2*time.Hour)) // ingested after January's close: late
	b.event(t, february.Add(time.Hour))
	feb, err := invoice.Close(ctx, app, february, invoice.Options{Force: true})
	require.NoError(t, err)
	require.Len(t, feb.Invoices, 1)
	b.feb = feb.Invoices[0].ID
	require.Equal(t, int64(1), b.count(t, `select count(*) from invoice_late_events where invoice_id = $1`, b.feb),
		"February's invoice billed January's late event")
	return b
}

// event writes one admitted request of acme at the given time, as the meter does (its
// month's partition added through usage_events_partition), and returns its id.
func (b *sealedBundle) event(t *testing.T, at time.Time) string {
	t.Helper()
	id := fmt.Sprintf("ev-%d", b.seq.Add(1))
	_, err := b.app.Exec(b.ctx, `select usage_events_partition($1)`, at)
	require.NoError(t, err, "the app role adds a month's partition")
	_, err = b.app.Exec(b.ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, requests, kafka_partition, kafka_offset)
values ($1, date_trunc('month', $2::timestamptz at time zone 'UTC')::date, $2, date_trunc('month', $2::timestamptz at time zone 'UTC')::date,
  'acme', 'acme', 'org', '{acme}', 'test', 1, 0, $3)`, id, at, b.seq.Load())
	require.NoError(t, err)
	return id
}

func (b *sealedBundle) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.app.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

// refused runs sql through pool and requires an error with SQLSTATE code whose message
// holds want.
func refused(t *testing.T, ctx context.Context, pool *pgxpool.Pool, code, want, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(ctx, sql, args...)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: want an error %s %q, got %v", sql, code, want, err)
	require.Equal(t, code, pgErr.Code, "%s: %s", sql, pgErr.Message)
	require.Contains(t, pgErr.Message, want, sql)
}

const (
	raised = "P0001" // a trigger's RAISE EXCEPTION
	denied = "42501" // insufficient_privilege
)

// Rows of an issued invoice, its lines and its late events can be neither added, changed
// nor removed, by the services or by the owner: triggers refuse them.
func TestIssuedInvoiceIsSealed(t *testing.T) {
	t.Parallel()
	b := setupSealed(t)
	lines := b.count(t, `select count(*) from invoice_lines`)
	for _, who := range []struct {
		name string
		pool *pgxpool.Pool
	}{{"app", b.app}, {"owner", b.owner}} {
		t.Run(who.name, func(t *testing.T) {
			for _, c := range []struct{ want, sql string }{
				{"invoice %d is issued and sealed: INSERT into invoice_lines refused", `insert into invoice_lines (invoice_id, line_no, kind, account_path, amount_minor) values ($1, 100, 'adjustment', 'acme', -4900)`},
				{"invoice %d is issued and immutable: UPDATE refused", `update invoices set total_minor = 0 where id = $1`},
				{"invoice %d is issued and immutable: DELETE refused", `delete from invoices where id = $1`},
				{"invoice %d is issued and immutable: UPDATE on its line", `update invoice_lines set amount_minor = 0 where invoice_id = $1`},
				{"invoice %d is issued and immutable: DELETE on its line", `delete from invoice_lines where invoice_id = $1`},
				{"invoice %d is issued and sealed: INSERT into invoice_late_events refused", `insert into invoice_late_events (event_id, billing_period, invoice_id) select event_id, billing_period, $1 from usage_events where billing_period = '2025-02-01'`},
			} {
				refused(t, b.ctx, who.pool, raised, fmt.Sprintf(c.want, b.jan), c.sql, b.jan)
			}
			// The late event billed by February's invoice is billed there for good: deleting
			// its row would bill it a second time on the next invoice.
			refused(t, b.ctx, who.pool, raised, "invoice_late_events is append-only", `delete from invoice_late_events where event_id = $1`, b.lateEvent)
			refused(t, b.ctx, who.pool, raised, "invoice_late_events is append-only", `update invoice_late_events set invoice_id = $2 where event_id = $1`, b.lateEvent, b.jan)
			refused(t, b.ctx, who.pool, raised, "periods is append-only", `update periods set closed_at = closed_at + interval '1 day'`)
			refused(t, b.ctx, who.pool, raised, "periods is append-only", `delete from periods where period = '2025-02-01'`)
		})
	}
	require.Equal(t, lines, b.count(t, `select count(*) from invoice_lines`))
	require.Equal(t, int64(1), b.count(t, `select count(*) from invoice_late_events`))
	require.Equal(t, int64(2), b.count(t, `select count(*) from periods`))
	var tieout int64
	require.NoError(t, b.app.QueryRow(b.ctx, `select count(*) from finance_invoice_tieout`).Scan(&tieout))
	require.Zero(t, tieout, "every invoice ties out")
}

// The services may not TRUNCATE (no privilege); the owner may, but the triggers refuse it.
func TestSealedTablesRefuseTruncate(t *testing.T) {
	t.Parallel()
	b := setupSealed(t)
	for _, table := range []string{"invoices", "invoice_lines", "invoice_late_events", "periods", "adjustments", "credit_adjustments"} {
		refused(t, b.ctx, b.app, denied, "permission denied for table "+table, `truncate `+table+` cascade`)
		var want string
		switch table {
		case "invoices", "invoice_lines":
			want = "issued invoices are immutable: TRUNCATE on " + table + " refused"
		case "invoice_late_events", "periods":
			want = table + " is append-only"
		default:
			want = table + " holds audit rows: TRUNCATE refused"
		}
		refused(t, b.ctx, b.owner, raised, want, `truncate `+table+` cascade`)
	}
}

// The services' role owns nothing, so it can neither disable, drop nor replace a trigger,
// nor alter or drop a table; and it cannot forge the migrations' history.
func TestAppRoleCannotUnsealTheBooks(t *testing.T) {
	t.Parallel()
	b := setupSealed(t)
	for _, sql := range []string{
		`alter table invoices disable trigger invoices_immutable`,
		`alter table invoice_lines disable trigger user`,
		`alter table invoice_late_events disable trigger invoice_late_events_append_only`,
		`alter table invoices alter column total_minor drop not null`,
		`drop trigger invoice_lines_sealed on invoice_lines`,
		`drop table invoice_late_events`,
		`alter function usage_events_partition(date) security invoker`,
	} {
		refused(t, b.ctx, b.app, denied, "must be owner", sql)
	}
	refused(t, b.ctx, b.app, denied, "permission denied for table invoices", `create trigger sneak before insert on invoices for each row execute function invoice_stamp_issue()`)
	refused(t, b.ctx, b.app, denied, "permission denied", `create table mine (x int)`)
	refused(t, b.ctx, b.app, denied, "permission denied", `create or replace function append_only() returns trigger language plpgsql as $$ begin return new; end $$`)
	refused(t, b.ctx, b.app, denied, "permission denied", `delete from goose_db_version`)
	refused(t, b.ctx, b.app, denied, "permission denied", `set session_replication_role = replica`)

	var owned int64
	require.NoError(t, b.app.QueryRow(b.ctx, `select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace
		where n.nspname = current_schema() and c.relowner = (select oid from pg_roles where rolname = current_user)`).Scan(&owned))
	require.Zero(t, owned, "the app role owns no table, view, sequence or index")
	var partitionOwner string
	require.NoError(t, b.app.QueryRow(b.ctx, `select pg_get_userbyid(c.relowner) from pg_class c
		where c.oid = to_regclass('usage_events_2025_02')`).Scan(&partitionOwner))
	require.Equal(t, b.own, partitionOwner, "a partition the app role added belongs to the owner")
}

// issued_xact is the issuing transaction's, whatever the INSERT says: a forged value cannot
// reopen an invoice for another transaction.
func TestIssuedXactCannotBeForged(t *testing.T) {
	t.Parallel()
	b := setupSealed(t)
	_, err := b.app.Exec(b.ctx, `insert into accounts (id, kind, org, plan, created_at) values ('forger', 'org', 'forger', 'pro', '2020-01-01')`)
	require.NoError(t, err)
	tx, err := b.app.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	var id int64
	var stamped, mine string
	require.NoError(t, tx.QueryRow(b.ctx, `insert into invoices (org, period, plan, price_version, currency, subtotal_minor, total_minor, issued_at, issued_xact)
		values ('forger', '2025-01-01', 'pro', 1, 'EUR', 0, 0, now(), '1') returning id, issued_xact::text, pg_current_xact_id()::text`).Scan(&id, &stamped, &mine))
	require.Equal(t, mine, stamped, "the trigger stamps the inserting transaction")
	// Its own transaction adds the lines (as the close does)...
	_, err = tx.Exec(b.ctx, `insert into invoice_lines (invoice_id, line_no, kind, account_path, amount_minor) values ($1, 1, 'base_fee', 'forger', 0)`, id)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	// ...and no other.
	refused(t, b.ctx, b.app, raised, fmt.Sprintf("invoice %d is issued and sealed: INSERT into invoice_lines refused", id),
		`insert into invoice_lines (invoice_id, line_no, kind, account_path, amount_minor) values ($1, 2, 'adjustment', 'forger', 1)`, id)
}

// A line for an invoice that another transaction is issuing, not committed yet, is refused
// by the trigger itself: the foreign key's check, at the end of the statement, could find
// the invoice committed by then and let the line in.
func TestLineForAnInvoiceBeingIssuedIsRefused(t *testing.T) {
	t.Parallel()
	b := setupSealed(t)
	_, err := b.app.Exec(b.ctx, `insert into accounts (id, kind, org, plan, created_at) values ('racer', 'org', 'racer', 'pro', '2020-01-01')`)
	require.NoError(t, err)
	issuing, err := b.app.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = issuing.Rollback(b.ctx) }()
	var id int64
	require.NoError(t, issuing.QueryRow(b.ctx, `insert into invoices (org, period, plan, price_version, currency, subtotal_minor, total_minor, issued_at)
		values ('racer', '2025-01-01', 'pro', 1, 'EUR', 0, 0, now()) returning id`).Scan(&id))

	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	conn, err := b.app.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `set statement_timeout = '3s'`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `insert into invoice_lines (invoice_id, line_no, kind, account_path, amount_minor) values ($1, 1, 'adjustment', 'racer', 1)`, id)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want an error, got %v", err)
	require.Equal(t, "23503", pgErr.Code, pgErr.Message) // foreign_key_violation
	require.Contains(t, pgErr.Message, fmt.Sprintf("invoice %d does not exist: INSERT into invoice_lines refused", id))
	_, err = conn.Exec(ctx, `reset statement_timeout`)
	require.NoError(t, err)
	require.NoError(t, issuing.Commit(b.ctx))
}

// reconcile's audit rows: a pending correction may be marked applied, once; nothing else
// about it changes.
func TestAdjustmentsAreMarkedAppliedOnly(t *testing.T) {
	t.Parallel()
	b := setupSealed(t)
	var adj, credit int64
	grant := fmt.Sprintf("gr_%032x", 1)
	_, err := b.app.Exec(b.ctx, `insert into reconcile_runs (run_id) values ('00000000-0000-0000-0000-000000000001')`)
	require.NoError(t, err)
	require.NoError(t, b.app.QueryRow(b.ctx, `insert into adjustments (run_id, kind, org, account, level, unit, period, amount, reason, source_event)
		values ('00000000-0000-0000-0000-000000000001', 'refund_5xx', 'acme', 'acme', 'org', 'requests', '2025-01-01', -1, 'test', 'ev-1') returning id`).Scan(&adj))
	_, err = b.app.Exec(b.ctx, `insert into credit_grants (id, org, account, unit, amount, effective_at, source) values ($1, 'acme', 'acme', 'requests', 10, now(), 'purchase')`, grant)
	require.NoError(t, err)
	require.NoError(t, b.app.QueryRow(b.ctx, `insert into credit_adjustments (kind, grant_id, event_id, units, reason) values ('refund', $1, 'ev-1', 1, 'test') returning id`, grant).Scan(&credit))

	for _, c := range []struct {
		table string
		id    int64
	}{{"adjustments", adj}, {"credit_adjustments", credit}} {
		prefix := fmt.Sprintf("%s row %d", c.table, c.id)
		refused(t, b.ctx, b.app, raised, prefix+" is an audit row: UPDATE refused", `update `+c.table+` set reason = 'rewritten' where id = $1`, c.id)
		refused(t, b.ctx, b.app, raised, prefix+" is an audit row: UPDATE refused", `update `+c.table+` set reason = 'rewritten', applied_at = now(), redis_before = 0, redis_after = 1 where id = $1`, c.id)
		// What reconcile does (internal/reconcile/sql/mark_applied.sql, credits.go).
		_, err := b.app.Exec(b.ctx, `update `+c.table+` set applied_at = now(), redis_before = 0, redis_after = 1 where id = $1 and applied_at is null`, c.id)
		require.NoError(t, err)
		refused(t, b.ctx, b.app, raised, prefix+" is applied and sealed: UPDATE refused", `update `+c.table+` set redis_after = 2 where id = $1`, c.id)
		refused(t, b.ctx, b.owner, raised, prefix+" is applied and sealed: UPDATE refused", `update `+c.table+` set applied_at = null, redis_before = null, redis_after = null where id = $1`, c.id)
	}
}

// Migrations a later version adds are the owner's too, and the services get their
// privileges on them through the default privileges of 00019.
func TestLaterTablesAreTheServicesToo(t *testing.T) {
	t.Parallel()
	b := setupSealed(t)
	_, err := b.owner.Exec(b.ctx, `create table later_table (id bigint generated always as identity primary key, v text)`)
	require.NoError(t, err)
	_, err = b.app.Exec(b.ctx, `insert into later_table (v) values ('x')`)
	require.NoError(t, err)
	_, err = b.app.Exec(b.ctx, `update later_table set v = 'y'`)
	require.NoError(t, err)
	_, err = b.app.Exec(b.ctx, `delete from later_table`)
	require.NoError(t, err)
	refused(t, b.ctx, b.app, denied, "permission denied", `truncate later_table`)
	refused(t, b.ctx, b.app, denied, "must be owner", `alter table later_table add column w int`)
}

// An invoice's status changes only along an audit row of invoice_status_changes written by
// the same transaction, and only its status: a forged status, a change of anything else
// under an audit row, a transition the table refuses, and any change of a credit note or
// of the audit trail are refused.
func TestStatusChangesOnlyWithItsAuditRow(t *testing.T) {
	t.Parallel()
	b := setupSealed(t)
	refused(t, b.ctx, b.app, raised, "only its status changes, with a row of invoice_status_changes",
		`update invoices set status = 'paid' where id = $1`, b.jan)
	refused(t, b.ctx, b.app, "23514", "invoice_status_changes_allowed",
		`insert into invoice_status_changes (invoice_id, from_status, to_status, reason, changed_by) values ($1, 'void', 'paid', 'x', 'test')`, b.jan)

	audit := `insert into invoice_status_changes (invoice_id, from_status, to_status, reason, changed_by) values ($1, 'issued', 'paid', 'paid by wire', 'test')`
	tx, err := b.app.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, audit, b.jan)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `update invoices set status = 'paid', total_minor = 0 where id = $1`, b.jan)
	require.ErrorContains(t, err, "is issued and immutable", "an audit row allows the status alone")
	require.NoError(t, tx.Rollback(b.ctx))

	// The audit row of another transaction does not do.
	_, err = b.app.Exec(b.ctx, audit, b.jan)
	require.NoError(t, err)
	refused(t, b.ctx, b.app, raised, "only its status changes", `update invoices set status = 'paid' where id = $1`, b.jan)

	tx, err = b.app.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, audit, b.jan)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `update invoices set status = 'paid' where id = $1`, b.jan)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	require.Equal(t, int64(1), b.count(t, `select count(*) from invoices where id = $1 and status = 'paid'`, b.jan))

	refused(t, b.ctx, b.app, raised, "invoice_status_changes is append-only", `delete from invoice_status_changes where invoice_id = $1`, b.jan)
	refused(t, b.ctx, b.app, raised, "invoice_status_changes is append-only", `update invoice_status_changes set reason = 'x' where invoice_id = $1`, b.jan)
}
