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
	//go:embed sql/lock_sequence.sql
	lockSequenceSQL string
	//go:embed sql/insert_billing_events.sql
	insertBillingEventsSQL string
)

// The kinds of numbered document, as document_sequences.kind names them.
const (
	seqInvoice    = "invoice"
	seqCreditNote = "credit_note"
)

// nextNumber takes the next number of the issuer's sequence of kind for the year of at, in
// tx: MG-2026-000123 for an invoice, MG-CN-2026-000004 for a credit note. A rollback of tx
// (or of the savepoint it is) gives the number back, so the sequence has no gap. For one
// document; a close numbers its invoices with a sequence.
func nextNumber(ctx context.Context, tx pgx.Tx, is Issuer, kind string, at time.Time) (string, error) {
	year := at.UTC().Year()
	var n int64
	if err := tx.QueryRow(ctx, nextNumberSQL, pgx.StrictNamedArgs{"issuer": is.prefix(), "kind": kind, "year": year}).Scan(&n); err != nil {
		return "", fmt.Errorf("next %s number of %s-%d: %w", kind, is.prefix(), year, err)
	}
	return formatNumber(is, kind, year, n), nil
}

func formatNumber(is Issuer, kind string, year int, n int64) string {
	if kind == seqCreditNote {
		return fmt.Sprintf("%s-CN-%d-%06d", is.prefix(), year, n)
	}
	return fmt.Sprintf("%s-%d-%06d", is.prefix(), year, n)
}

// sequence numbers the many documents of one transaction (a close's invoices): the
// sequence's row is locked and read once (lockSequence), each document's number is the
// next one (next) and is kept once the document is written (take), and the row is written
// once, at the end (save). An UPDATE of the row per document would leave, in one
// transaction, a longer chain of row versions to walk at each.
type sequence struct {
	is   Issuer
	kind string
	year int
	last int64
}

// lockSequence locks the issuer's sequence of kind for the year of at in tx (until it
// ends: concurrent issuers of the same sequence wait) and reads its last number.
func lockSequence(ctx context.Context, tx pgx.Tx, is Issuer, kind string, at time.Time) (*sequence, error) {
	s := &sequence{is: is, kind: kind, year: at.UTC().Year()}
	args := pgx.StrictNamedArgs{"issuer": is.prefix(), "kind": kind, "year": s.year}
	if err := tx.QueryRow(ctx, lockSequenceSQL, args).Scan(&s.last); err != nil {
		return nil, fmt.Errorf("lock the %s numbers of %s-%d: %w", kind, is.prefix(), s.year, err)
	}
	return s, nil
}

// next is the number the next document written takes.
func (s *sequence) next() string { return formatNumber(s.is, s.kind, s.year, s.last+1) }

// take keeps the number next gave: its document is written.
func (s *sequence) take() { s.last++ }

// save writes the last number taken to the sequence's row.
func (s *sequence) save(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `update document_sequences set last = $4 where issuer = $1 and kind = $2 and year = $3`,
		s.is.prefix(), s.kind, s.year, s.last); err != nil {
		return fmt.Errorf("save the %s numbers of %s-%d: %w", s.kind, s.is.prefix(), s.year, err)
	}
	return nil
}

// The billing events' types, as billing_events.type and webhook endpoints name them; the
// CloudEvent's type is "io.metergate." and the name.
const (
	EventInvoiceIssued        = "invoice.issued.v1"
	EventInvoiceStatusChanged = "invoice.status_changed.v1"
	EventCreditNoteIssued     = "credit_note.issued.v1"
)

// billingEvent is a row of billing_events: a CloudEvent and what webhooks match it by.
type billingEvent struct {
	id, typ, org string
	at           time.Time
	payload      []byte
}

// newEvent is the billing event id of type typ about subject (of org), with data.
func newEvent(is Issuer, id, typ, org, subject string, at time.Time, data any) (billingEvent, error) {
	ce, err := event.New(id, is.source(), "io.metergate."+typ, subject, at, data)
	if err != nil {
		return billingEvent{}, err
	}
	payload, err := json.Marshal(ce)
	if err != nil {
		return billingEvent{}, fmt.Errorf("marshal %s: %w", typ, err)
	}
	return billingEvent{id: id, typ: typ, org: org, at: at, payload: payload}, nil
}

// recordEvents writes billing events in tx, the transaction that made what they report:
// each exists exactly when that does, and its id (the primary key) makes it fire once.
func recordEvents(ctx context.Context, tx pgx.Tx, events ...billingEvent) error {
	if len(events) == 0 {
		return nil
	}
	cols := struct {
		ids, types, orgs []string
		ats              []time.Time
		payloads         [][]byte
	}{}
	for _, e := range events {
		cols.ids, cols.types, cols.orgs = append(cols.ids, e.id), append(cols.types, e.typ), append(cols.orgs, e.org)
		cols.ats, cols.payloads = append(cols.ats, e.at), append(cols.payloads, e.payload)
	}
	if _, err := tx.Exec(ctx, insertBillingEventsSQL, pgx.StrictNamedArgs{
		"ids": cols.ids, "types": cols.types, "orgs": cols.orgs, "occurred_at": cols.ats, "payloads": cols.payloads,
	}); err != nil {
		return fmt.Errorf("record %d billing events (%s first): %w", len(events), events[0].id, err)
	}
	return nil
}

// recordEvent writes one billing event in tx (recordEvents).
func recordEvent(ctx context.Context, tx pgx.Tx, is Issuer, id, typ, org, subject string, at time.Time, data any) error {
	e, err := newEvent(is, id, typ, org, subject, at, data)
	if err != nil {
		return err
	}
	return recordEvents(ctx, tx, e)
}
