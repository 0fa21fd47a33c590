package invoice

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/pkg/event"
)

// The statements of document numbers and billing events.
var (
	//go:embed sql/next_number.sql
	nextNumberSQL string
	//go:embed sql/insert_billing_event.sql
	insertBillingEventSQL string
)

// The kinds of numbered document, as document_sequences.kind names them.
const (
	seqInvoice    = "invoice"
	seqCreditNote = "credit_note"
)

// nextNumber takes the next number of the issuer's sequence of kind for the year of at, in
// tx: MG-2026-000123 for an invoice, MG-CN-2026-000004 for a credit note. A rollback of tx
// (or of the savepoint it is) gives the number back, so the sequence has no gap.
func nextNumber(ctx context.Context, tx pgx.Tx, is Issuer, kind string, at time.Time) (string, error) {
	year := at.UTC().Year()
	var n int64
	if err := tx.QueryRow(ctx, nextNumberSQL, pgx.StrictNamedArgs{"issuer": is.prefix(), "kind": kind, "year": year}).Scan(&n); err != nil {
		return "", fmt.Errorf("next %s number of %s-%d: %w", kind, is.prefix(), year, err)
	}
	if kind == seqCreditNote {
		return fmt.Sprintf("%s-CN-%d-%06d", is.prefix(), year, n), nil
	}
	return fmt.Sprintf("%s-%d-%06d", is.prefix(), year, n), nil
}

// The billing events' types, as billing_events.type and webhook endpoints name them; the
// CloudEvent's type is "io.metergate." and the name.
const (
	EventInvoiceIssued        = "invoice.issued.v1"
	EventInvoiceStatusChanged = "invoice.status_changed.v1"
	EventCreditNoteIssued     = "credit_note.issued.v1"
)

// recordEvent writes a billing event in tx, the transaction that made what it reports: it
// exists exactly when that does, and its id (the primary key) makes it fire once.
func recordEvent(ctx context.Context, tx pgx.Tx, is Issuer, id, typ, org, subject string, at time.Time, data any) error {
	ce, err := event.New(id, is.source(), "io.metergate."+typ, subject, at, data)
	if err != nil {
		return err
	}
	payload, err := json.Marshal(ce)
	if err != nil {
		return fmt.Errorf("marshal %s: %w", typ, err)
	}
	if _, err := tx.Exec(ctx, insertBillingEventSQL, pgx.StrictNamedArgs{
		"id": id, "type": typ, "org": org, "occurred_at": at, "payload": payload,
	}); err != nil {
		return fmt.Errorf("record %s %s: %w", typ, id, err)
	}
	return nil
}
