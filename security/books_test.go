package security_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

// Finding 7: sealed books. The services' role cannot rewrite an issued invoice, its lines
// or its late-event links, empty those tables, or turn their triggers off.
func booksProbes() []probe {
	return []probe{
		{name: "F7-sealed-books", desc: "as the services' role (DATABASE_URL): INSERT/UPDATE/DELETE on an issued invoice, its lines and late events, a status change without its audit row, UPDATE/DELETE/INSERT on a credit note, its lines, the status trail and billing events, TRUNCATE (the audit log's too), DISABLE TRIGGER ALL/USER, DROP TRIGGER: each refused",
			run: sealedBooks},
	}
}

func sealedBooks(p *P, _ *stack) {
	ctx := testenv.Context(p, 2*time.Minute)
	// A schema of its own (a closed period is closed for every org of a schema), migrated
	// through the owner's pool; the books are written the way they are in production: the
	// close issues the invoices, their lines and their late-event links in one transaction.
	pool, schema := testenv.EmptySchema(p)
	_, err := migrations.Up(ctx, pool)
	require.NoError(p, err)
	_, err = pool.Exec(ctx, `insert into accounts (id, kind, org, plan, created_at) values ('sealed', 'org', 'sealed', 'pro', '2020-01-01')`)
	require.NoError(p, err)
	mar, apr := time.Date(2025, time.March, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, time.April, 1, 0, 0, 0, 0, time.UTC)
	event := func(id string, at time.Time, late bool, offset int) {
		_, err := pool.Exec(ctx, `select usage_events_partition($1)`, mar)
		require.NoError(p, err)
		_, err = pool.Exec(ctx, `
			insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind,
			                          path, source, requests, tokens, late, kafka_partition, kafka_offset)
			values ($1, $2, $3, $2, 'sealed', 'sealed', 'org', '{sealed}', 'security', 1000, 0, $4, 0, $5)`, id, mar, at, late, offset)
		require.NoError(p, err, "event %s", id)
	}
	event("ev-on-time", mar.Add(time.Hour), false, 1)
	res0, err := invoice.Close(ctx, pool, mar, invoice.Options{Force: true, By: "security suite"})
	require.NoError(p, err, "close March 2025")
	event("ev-late", mar.Add(2*time.Hour), true, 2) // billed on April's invoice
	res, err := invoice.Close(ctx, pool, apr, invoice.Options{Force: true, By: "security suite"})
	require.NoError(p, err, "close April 2025")
	require.NotEmpty(p, res.Invoices, "the close issued an invoice")
	inv := res.Invoices[0]
	require.NotEmpty(p, inv.Lines, "the issued invoice has lines")
	var links int
	require.NoError(p, pool.QueryRow(ctx, `select count(*) from invoice_late_events where invoice_id = $1`, inv.ID).Scan(&links))
	require.Equal(p, 1, links, "April's invoice bills March's late event")

	// March's invoice voided, as the invoices API does: a credit note, a status change and
	// billing events, sealed in their turn.
	_, note, err := invoice.SetStatus(ctx, pool, invoice.Issuer{}, res0.Invoices[0].ID, invoice.StatusVoid, "security suite", "security suite")
	require.NoError(p, err, "void March's invoice")
	voided, noteID := fmt.Sprint(res0.Invoices[0].ID), fmt.Sprint(note.ID)

	// The services connect with DATABASE_URL.
	conn, err := pgx.Connect(ctx, testenv.WithSearchPath(p, testenv.DatabaseURL(p), schema))
	require.NoError(p, err)
	defer conn.Close(context.WithoutCancel(ctx))
	id := fmt.Sprint(inv.ID)
	var allowed []string
	for _, sql := range []string{
		"INSERT INTO invoice_lines (invoice_id, line_no, kind, account_path, amount_minor) VALUES (" + id + ", 999, 'adjustment', 'sealed', 1)",
		"UPDATE invoices SET total_minor = total_minor + 1 WHERE id = " + id,
		"DELETE FROM invoices WHERE id = " + id,
		"UPDATE invoice_lines SET amount_minor = amount_minor + 1 WHERE invoice_id = " + id,
		"DELETE FROM invoice_lines WHERE invoice_id = " + id,
		"UPDATE invoice_late_events SET event_id = 'late-2' WHERE invoice_id = " + id,
		"DELETE FROM invoice_late_events WHERE invoice_id = " + id,
		"TRUNCATE invoices CASCADE",
		"TRUNCATE invoice_lines",
		"TRUNCATE invoice_late_events",
		"ALTER TABLE invoices DISABLE TRIGGER ALL",
		// ALL needs a superuser for the foreign keys' system triggers; a table's owner may
		// still turn the user triggers off, or drop them.
		"ALTER TABLE invoices DISABLE TRIGGER USER",
		"ALTER TABLE invoice_lines DISABLE TRIGGER USER",
		"DROP TRIGGER invoices_immutable ON invoices",
		"DROP FUNCTION invoice_immutable() CASCADE",
		"UPDATE invoices SET status = 'issued' WHERE id = " + voided, // no audit row, and not a transition
		"UPDATE invoices SET status = 'paid' WHERE id = " + id,       // no audit row
		"UPDATE credit_notes SET total_minor = 0 WHERE id = " + noteID,
		"DELETE FROM credit_notes WHERE id = " + noteID,
		"UPDATE credit_note_lines SET amount_minor = 0 WHERE credit_note_id = " + noteID,
		"DELETE FROM credit_note_lines WHERE credit_note_id = " + noteID,
		"INSERT INTO credit_note_lines (credit_note_id, line_no, kind, account_path, quantity, unit_price_minor, per_units, amount_minor) VALUES (" + noteID + ", 999, 'adjustment', 'sealed', 0, 0, 1, 1)",
		"UPDATE invoice_status_changes SET reason = 'rewritten' WHERE invoice_id = " + voided,
		"DELETE FROM invoice_status_changes WHERE invoice_id = " + voided,
		"UPDATE billing_events SET payload = '{}'",
		"DELETE FROM billing_events",
		"TRUNCATE credit_notes CASCADE",
		"TRUNCATE invoice_status_changes",
		"TRUNCATE billing_events",
		"TRUNCATE audit_log",
	} {
		// Each in a transaction rolled back: what is not refused changes nothing.
		tx, err := conn.Begin(ctx)
		require.NoError(p, err)
		tag, err := tx.Exec(ctx, sql)
		_ = tx.Rollback(ctx)
		if err == nil {
			allowed = append(allowed, fmt.Sprintf("%s (%s)", sql, tag))
		} else {
			p.Logf("refused: %s: %v", sql, err)
		}
	}
	none(p, allowed, "the services' role may change the sealed books")
}
