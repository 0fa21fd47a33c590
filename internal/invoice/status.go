package invoice

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/document"
)

var (
	// ErrTransition is returned for a status change the invoice's status does not allow:
	// issued may become paid, void or uncollectible; uncollectible may become paid or void;
	// paid and void are final.
	ErrTransition = errors.New("status change not allowed")
	// ErrInvalidReason is returned for a missing or unreadable reason.
	ErrInvalidReason = errors.New("invalid reason")
)

// MaxReason is the longest reason of a status change, void or reissue, in bytes.
const MaxReason = 1000

// allowed lists the statuses each status may change to.
var allowed = map[string][]string{
	StatusIssued:        {StatusPaid, StatusVoid, StatusUncollectible},
	StatusUncollectible: {StatusPaid, StatusVoid},
}

// StatusChange is one change of an invoice's status: its audit row.
type StatusChange struct {
	From      string    `json:"from"`
	To        string    `json:"to"`
	Reason    string    `json:"reason"`
	ChangedBy string    `json:"changed_by"`
	ChangedAt time.Time `json:"changed_at"`
}

// CreditNote is an issued credit note: a document crediting an invoice (amounts positive:
// what is credited). A void credits the whole invoice: its lines, tax and total.
type CreditNote struct {
	ID            int64           `json:"id"`
	Number        string          `json:"number"`
	Org           string          `json:"org"`
	InvoiceID     int64           `json:"invoice_id"`
	InvoiceNumber string          `json:"invoice_number,omitempty"`
	Kind          string          `json:"kind"`                   // void, or amendment
	AmendmentID   *int64          `json:"amendment_id,omitempty"` // kind amendment: the amendment it settles
	Reason        string          `json:"reason"`
	Currency      string          `json:"currency"`
	SubtotalMinor int64           `json:"subtotal_minor"`
	TaxRateBP     int             `json:"tax_rate_bp"`
	TaxMinor      int64           `json:"tax_minor"`
	TotalMinor    int64           `json:"total_minor"`
	IssuedAt      time.Time       `json:"issued_at"`
	IssuedBy      string          `json:"issued_by"`
	Seller        *document.Party `json:"seller,omitempty"`
	Buyer         *document.Party `json:"buyer,omitempty"`
	Lines         []Line          `json:"lines,omitempty"`
}

// The statements of statuses and credit notes.
var (
	//go:embed sql/insert_status_change.sql
	insertStatusChangeSQL string
	//go:embed sql/insert_credit_note.sql
	insertCreditNoteSQL string
	//go:embed sql/credit_notes.sql
	creditNotesSQL string
	//go:embed sql/credit_note_ids.sql
	creditNoteIDsSQL string
	//go:embed sql/credit_note_lines.sql
	creditNoteLinesSQL string
	//go:embed sql/status_changes.sql
	statusChangesSQL string
)

// checkReason refuses an empty, overlong or unreadable reason.
func checkReason(reason string) error {
	switch {
	case strings.TrimSpace(reason) == "":
		return fmt.Errorf("%w: a reason is required", ErrInvalidReason)
	case len(reason) > MaxReason:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidReason, len(reason), MaxReason)
	case strings.ContainsFunc(reason, func(r rune) bool { return unicode.IsControl(r) && r != '\n' }):
		return fmt.Errorf("%w: it holds a control character", ErrInvalidReason)
	}
	return nil
}

// SetStatus changes invoice id's status to to, for reason, recorded as changed by by: in
// one transaction, the audit row, the status, the billing event
// (invoice.status_changed.v1) and, for void, the credit note of the whole invoice (and
// its credit_note.issued.v1). It returns the invoice as changed and the credit note (nil
// unless voided). Errors: ErrNotFound, ErrTransition (also for a status that does not
// exist), ErrInvalidReason. An invoice's content never changes, only its status.
func SetStatus(ctx context.Context, pool *pgxpool.Pool, is Issuer, id int64, to, reason, by string) (Invoice, *CreditNote, error) {
	if err := checkReason(reason); err != nil {
		return Invoice{}, nil, err
	}
	if err := is.Validate(); err != nil {
		return Invoice{}, nil, fmt.Errorf("issuer: %w", err)
	}
	var inv Invoice
	var note *CreditNote
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var from string
		err := tx.QueryRow(ctx, `select status from invoices where id = $1 for update`, id).Scan(&from)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("invoice %d: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("lock invoice %d: %w", id, err)
		}
		if !slices.Contains(allowed[from], to) {
			return fmt.Errorf("invoice %d is %s: to %q: %w", id, from, to, ErrTransition)
		}
		var change StatusChange
		var changeID int64
		if err := tx.QueryRow(ctx, insertStatusChangeSQL, pgx.StrictNamedArgs{
			"invoice_id": id, "from_status": from, "to_status": to, "reason": reason, "changed_by": by,
		}).Scan(&changeID, &change.ChangedAt); err != nil {
			return fmt.Errorf("record the status change of invoice %d: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `update invoices set status = $2 where id = $1`, id, to); err != nil {
			return fmt.Errorf("change the status of invoice %d: %w", id, err)
		}
		if inv, err = Get(ctx, tx, id); err != nil {
			return err
		}
		change.From, change.To, change.Reason, change.ChangedBy = from, to, reason, by
		if err := recordEvent(ctx, tx, is, fmt.Sprintf("invoice.status_changed/%d/%d", id, changeID), EventInvoiceStatusChanged,
			inv.Org, "invoice/"+inv.Number, change.ChangedAt, statusChanged{Invoice: summary(inv), StatusChange: change}); err != nil {
			return err
		}
		if to == StatusVoid {
			note, err = creditInvoice(ctx, tx, is, inv, reason, by, change.ChangedAt)
			return err
		}
		return nil
	})
	if err != nil {
		return Invoice{}, nil, err
	}
	return inv, note, nil
}

// statusChanged is the data of invoice.status_changed.v1: the invoice as it is now, and
// the change.
type statusChanged struct {
	Invoice Invoice `json:"invoice"`
	StatusChange
}

// summary is the invoice without its lines: the data of its billing events.
func summary(inv Invoice) Invoice {
	inv.Lines = nil
	return inv
}

// creditInvoice issues, in tx, the credit note of a voided invoice: its lines, tax and
// total as they were, less what its amendment credit notes credited already (a line for
// each, so that all its credit notes add up to the invoice, never more).
func creditInvoice(ctx context.Context, tx pgx.Tx, is Issuer, inv Invoice, reason, by string, at time.Time) (*CreditNote, error) {
	n := CreditNote{
		Org: inv.Org, InvoiceID: inv.ID, InvoiceNumber: inv.Number, Kind: "void", Reason: reason,
		Currency: inv.Currency, SubtotalMinor: inv.SubtotalMinor, TaxRateBP: inv.TaxRateBP, TaxMinor: inv.TaxMinor,
		TotalMinor: inv.TotalMinor, IssuedAt: at, IssuedBy: by, Seller: &is.Seller, Buyer: inv.Buyer, Lines: slices.Clone(inv.Lines),
	}
	rows, err := tx.Query(ctx, `select id from credit_notes where invoice_id = $1 and kind = 'amendment' order by id`, inv.ID)
	if err != nil {
		return nil, fmt.Errorf("read the credit notes of invoice %d: %w", inv.ID, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read the credit notes of invoice %d: %w", inv.ID, err)
	}
	earlier, err := readCreditNotes(ctx, tx, ids, false)
	if err != nil {
		return nil, err
	}
	for _, e := range earlier {
		n.Lines = append(n.Lines, Line{Kind: KindAdjustment, AccountPath: inv.Org, PerUnits: 1, AmountMinor: -e.SubtotalMinor})
		n.SubtotalMinor -= e.SubtotalMinor
		n.TaxMinor -= e.TaxMinor
		n.TotalMinor -= e.TotalMinor
	}
	if err := issueCreditNote(ctx, tx, is, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// issueCreditNote writes credit note n in tx with the next number of the credit notes'
// sequence (set on n), its lines, and credit_note.issued.v1.
func issueCreditNote(ctx context.Context, tx pgx.Tx, is Issuer, n *CreditNote) error {
	number, err := nextNumber(ctx, tx, is, seqCreditNote, n.IssuedAt)
	if err != nil {
		return err
	}
	n.Number = number
	if err := tx.QueryRow(ctx, insertCreditNoteSQL, pgx.StrictNamedArgs{
		"number": n.Number, "issuer": is.prefix(), "org": n.Org, "invoice_id": n.InvoiceID, "kind": n.Kind,
		"reason": n.Reason, "currency": n.Currency, "subtotal_minor": n.SubtotalMinor, "tax_rate_bp": n.TaxRateBP,
		"tax_minor": n.TaxMinor, "issued_at": n.IssuedAt, "issued_by": n.IssuedBy, "seller": n.Seller, "buyer": n.Buyer,
		"amendment_id": n.AmendmentID,
	}).Scan(&n.ID); err != nil {
		return fmt.Errorf("issue the credit note of invoice %d: %w", n.InvoiceID, err)
	}
	rows := make([][]any, len(n.Lines))
	for i, l := range n.Lines {
		rows[i] = lineRow(n.ID, i+1, l)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"credit_note_lines"}, lineColumns("credit_note_id"), pgx.CopyFromRows(rows)); err != nil {
		return fmt.Errorf("write the lines of credit note %s: %w", n.Number, err)
	}
	return recordEvent(ctx, tx, is, "credit_note.issued/"+n.Number, EventCreditNoteIssued, n.Org, "credit_note/"+n.Number,
		n.IssuedAt, creditSummary(*n))
}

// creditSummary is the credit note without its lines: the data of its billing event.
func creditSummary(n CreditNote) CreditNote {
	n.Lines = nil
	return n
}

// StatusHistory returns the status changes of invoice id, oldest first.
func StatusHistory(ctx context.Context, q querier, id int64) ([]StatusChange, error) {
	rows, err := q.Query(ctx, statusChangesSQL, pgx.StrictNamedArgs{"invoice_id": id})
	if err != nil {
		return nil, fmt.Errorf("read status changes of invoice %d: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StatusChange, error) {
		var c StatusChange
		err := r.Scan(&c.From, &c.To, &c.Reason, &c.ChangedBy, &c.ChangedAt)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read status changes of invoice %d: %w", id, err)
	}
	return out, nil
}

// CreditNotes returns a page of credit notes (of org; every org's when empty), oldest
// first, without their lines; limit 0 is 100.
func CreditNotes(ctx context.Context, q querier, org string, after int64, limit int) ([]CreditNote, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := q.Query(ctx, creditNoteIDsSQL, pgx.StrictNamedArgs{"org": orNull(org), "after": after, "limit": limit})
	if err != nil {
		return nil, fmt.Errorf("list credit notes: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("list credit notes: %w", err)
	}
	return readCreditNotes(ctx, q, ids, false)
}

// GetCreditNote returns credit note id with its lines; ErrNotFound when there is none.
func GetCreditNote(ctx context.Context, q querier, id int64) (CreditNote, error) {
	notes, err := readCreditNotes(ctx, q, []int64{id}, true)
	if err != nil {
		return CreditNote{}, err
	}
	if len(notes) == 0 {
		return CreditNote{}, fmt.Errorf("credit note %d: %w", id, ErrNotFound)
	}
	return notes[0], nil
}

func readCreditNotes(ctx context.Context, q querier, ids []int64, lines bool) ([]CreditNote, error) {
	if len(ids) == 0 {
		return []CreditNote{}, nil
	}
	rows, err := q.Query(ctx, creditNotesSQL, pgx.StrictNamedArgs{"ids": ids})
	if err != nil {
		return nil, fmt.Errorf("read credit notes: %w", err)
	}
	notes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (CreditNote, error) {
		var n CreditNote
		err := r.Scan(&n.ID, &n.Number, &n.Org, &n.InvoiceID, &n.InvoiceNumber, &n.Kind, &n.Reason, &n.Currency,
			&n.SubtotalMinor, &n.TaxRateBP, &n.TaxMinor, &n.TotalMinor, &n.IssuedAt, &n.IssuedBy, &n.Seller, &n.Buyer, &n.AmendmentID)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("read credit notes: %w", err)
	}
	byID := map[int64]CreditNote{}
	for _, n := range notes {
		byID[n.ID] = n
	}
	var all map[int64][]Line
	if lines {
		if all, err = readLines(ctx, q, creditNoteLinesSQL, ids); err != nil {
			return nil, err
		}
	}
	out := make([]CreditNote, 0, len(ids))
	for _, id := range ids {
		if n, ok := byID[id]; ok {
			n.Lines = all[id]
			out = append(out, n)
		}
	}
	return out, nil
}

// Document is the credit note as it is rendered: the same numbers as its JSON.
func (n CreditNote) Document() document.Document {
	d := document.Document{
		Kind: document.KindCreditNote, Number: n.Number, Status: StatusIssued, IssuedAt: n.IssuedAt, Org: n.Org,
		Buyer: n.Buyer, Currency: n.Currency, Lines: n.Lines, SubtotalMinor: n.SubtotalMinor, TaxRateBP: n.TaxRateBP,
		TaxMinor: n.TaxMinor, TotalMinor: n.TotalMinor, Reason: n.Reason,
		Refs: []document.Ref{{Label: "Credits invoice", Number: n.InvoiceNumber}},
	}
	if n.Seller != nil {
		d.Seller = *n.Seller
	}
	return d
}
