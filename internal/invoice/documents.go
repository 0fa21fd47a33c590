package invoice

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/document"
)

// Invoice is an issued invoice: the document as stored, its lines (when loaded with them)
// and its status now. The numbers of its JSON and of its renderings (Document) are these.
type Invoice struct {
	ID           int64  `json:"id"`
	Number       string `json:"number,omitempty"` // empty: issued before numbering (migration 00022)
	Org          string `json:"org"`
	Period       string `json:"period"` // first day of the month, YYYY-MM-DD
	Plan         string `json:"plan"`
	PriceVersion int    `json:"price_version"` // the version of the plan's price it was priced with
	Currency     string `json:"currency"`
	Status       string `json:"status"` // issued, paid, void or uncollectible
	// Seller and Buyer are the issuer's and the customer's details when it was issued (nil:
	// none recorded).
	Seller        *document.Party `json:"seller,omitempty"`
	Buyer         *document.Party `json:"buyer,omitempty"`
	SubtotalMinor int64           `json:"subtotal_minor"`
	TaxRateBP     int             `json:"tax_rate_bp"`
	TaxMinor      int64           `json:"tax_minor"`
	TotalMinor    int64           `json:"total_minor"`
	IssuedAt      time.Time       `json:"issued_at"`
	DueAt         *time.Time      `json:"due_at,omitempty"`
	// Replaces is the voided invoice a reissue replaces, and Reason why it was reissued.
	Replaces *int64 `json:"replaces,omitempty"`
	Reason   string `json:"reason,omitempty"`
	IssuedBy string `json:"issued_by,omitempty"` // the close (reconcile close), or who reissued it
	Lines    []Line `json:"lines,omitempty"`
}

// The invoice statuses.
const (
	StatusIssued        = "issued"
	StatusPaid          = "paid"
	StatusVoid          = "void"
	StatusUncollectible = "uncollectible"
)

// The statements that read invoices.
var (
	//go:embed sql/invoices.sql
	invoicesSQL string
	//go:embed sql/invoice_lines.sql
	invoiceLinesSQL string
	//go:embed sql/invoice_ids.sql
	invoiceIDsSQL string
)

// orNull is s as a query argument, NULL when empty: an optional filter or column.
func orNull(s string) any {
	if s == "" {
		return nil
	}
	return s
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Filter selects invoices for List; a zero field matches every invoice.
type Filter struct {
	Org    string
	Period time.Time // first day of the month
	Status string
	After  int64 // the last id of the previous page
	Limit  int   // at most; 0: 100
}

// List returns a page of invoices matching f, oldest first, without their lines.
func List(ctx context.Context, q querier, f Filter) ([]Invoice, error) {
	var p any
	if !f.Period.IsZero() {
		p = f.Period
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := q.Query(ctx, invoiceIDsSQL, pgx.StrictNamedArgs{
		"org": orNull(f.Org), "period": p, "status": orNull(f.Status), "after": f.After, "limit": f.Limit,
	})
	if err != nil {
		return nil, fmt.Errorf("list invoices: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("list invoices: %w", err)
	}
	return readInvoices(ctx, q, ids, false)
}

// Get returns the invoice id with its lines; ErrNotFound when there is none.
func Get(ctx context.Context, q querier, id int64) (Invoice, error) {
	invs, err := readInvoices(ctx, q, []int64{id}, true)
	if err != nil {
		return Invoice{}, err
	}
	if len(invs) == 0 {
		return Invoice{}, fmt.Errorf("invoice %d: %w", id, ErrNotFound)
	}
	return invs[0], nil
}

// loadInvoices reads the invoices of a period with their lines, by org and id.
func loadInvoices(ctx context.Context, q querier, period time.Time) ([]Invoice, error) {
	rows, err := q.Query(ctx, `select id from invoices where period = $1 order by org, id`, period)
	if err != nil {
		return nil, fmt.Errorf("read invoices: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read invoices: %w", err)
	}
	return readInvoices(ctx, q, ids, true)
}

// readInvoices reads the invoices ids, in that order, with their lines when lines is true.
func readInvoices(ctx context.Context, q querier, ids []int64, lines bool) ([]Invoice, error) {
	if len(ids) == 0 {
		return []Invoice{}, nil
	}
	rows, err := q.Query(ctx, invoicesSQL, pgx.StrictNamedArgs{"ids": ids})
	if err != nil {
		return nil, fmt.Errorf("read invoices: %w", err)
	}
	byID := map[int64]*Invoice{}
	for rows.Next() {
		var inv Invoice
		if err := rows.Scan(&inv.ID, &inv.Number, &inv.Org, &inv.Period, &inv.Plan, &inv.PriceVersion, &inv.Currency,
			&inv.Status, &inv.Seller, &inv.Buyer, &inv.SubtotalMinor, &inv.TaxRateBP, &inv.TaxMinor, &inv.TotalMinor,
			&inv.IssuedAt, &inv.DueAt, &inv.Replaces, &inv.Reason, &inv.IssuedBy); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read invoices: %w", err)
		}
		byID[inv.ID] = &inv
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read invoices: %w", err)
	}
	if lines {
		all, err := readLines(ctx, q, invoiceLinesSQL, ids)
		if err != nil {
			return nil, err
		}
		for id, inv := range byID {
			inv.Lines = all[id]
		}
	}
	out := make([]Invoice, 0, len(ids))
	for _, id := range ids {
		if inv, ok := byID[id]; ok {
			out = append(out, *inv)
		}
	}
	return out, nil
}

// readLines reads the lines of the documents ids with query (invoiceLinesSQL or
// creditNoteLinesSQL), by document id.
func readLines(ctx context.Context, q querier, query string, ids []int64) (map[int64][]Line, error) {
	rows, err := q.Query(ctx, query, pgx.StrictNamedArgs{"ids": ids})
	if err != nil {
		return nil, fmt.Errorf("read lines: %w", err)
	}
	defer rows.Close()
	out := map[int64][]Line{}
	for rows.Next() {
		var id int64
		var l Line
		if err := rows.Scan(&id, &l.Kind, &l.AccountPath, &l.Unit, &l.Quantity, &l.UnitPriceMinor, &l.PerUnits,
			&l.AmountMinor, &l.ForPeriod); err != nil {
			return nil, fmt.Errorf("read lines: %w", err)
		}
		out[id] = append(out[id], l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read lines: %w", err)
	}
	return out, nil
}

// Document is the invoice as it is rendered (document.HTML, PDF, CSV): the same numbers
// as its JSON. replaces is the number of the invoice a reissue replaces ("" for none).
func (inv Invoice) Document(replaces string) document.Document {
	d := document.Document{
		Kind: document.KindInvoice, Number: inv.Number, Status: inv.Status, IssuedAt: inv.IssuedAt,
		Period: inv.Period[:min(7, len(inv.Period))], Org: inv.Org, Buyer: inv.Buyer, Currency: inv.Currency,
		Lines: slices.Clone(inv.Lines), SubtotalMinor: inv.SubtotalMinor, TaxRateBP: inv.TaxRateBP,
		TaxMinor: inv.TaxMinor, TotalMinor: inv.TotalMinor, Reason: inv.Reason,
	}
	if inv.Seller != nil {
		d.Seller = *inv.Seller
	}
	if inv.DueAt != nil {
		d.DueAt = *inv.DueAt
	}
	if replaces != "" {
		d.Refs = append(d.Refs, document.Ref{Label: "Replaces", Number: replaces})
	}
	return d
}
