// Package document is the model of a billing document (an invoice or a credit note) as
// people read it, and its renderings: HTML, PDF and CSV. It reads no database: internal/invoice
// builds a Document from what it issued (invoice.Invoice.Document), the one source of the
// numbers that the JSON of the invoices API also gives.
package document

import "time"

// Kind is what a document is.
type Kind string

// The kinds of document.
const (
	KindInvoice    Kind = "invoice"
	KindCreditNote Kind = "credit_note"
)

// Party is who issues a document (the seller) or receives it (the buyer), as it was when
// the document was issued.
type Party struct {
	LegalName  string   `json:"legal_name"`
	Address    []string `json:"address,omitempty"` // street lines, at most 4
	City       string   `json:"city,omitempty"`
	PostalCode string   `json:"postal_code,omitempty"`
	Region     string   `json:"region,omitempty"`
	Country    string   `json:"country"` // ISO 3166-1 alpha-2
	Email      string   `json:"email,omitempty"`
	TaxID      string   `json:"tax_id,omitempty"`
}

// Line is one line of a document, as invoice_lines and credit_note_lines hold it. Amounts
// are integer minor units of the document's currency.
type Line struct {
	Kind           string `json:"kind"` // base_fee, usage, credits_applied, included, overage_tier, late, adjustment
	AccountPath    string `json:"account_path"`
	Unit           string `json:"unit,omitempty"`
	Quantity       int64  `json:"quantity"`
	UnitPriceMinor int64  `json:"unit_price_minor"`
	PerUnits       int64  `json:"per_units"`
	AmountMinor    int64  `json:"amount_minor"`
	ForPeriod      string `json:"for_period,omitempty"` // YYYY-MM-DD: a closed period's late units or correction
}

// Ref is a document another one refers to: the invoice a credit note credits, the voided
// invoice a reissue replaces.
type Ref struct {
	Label  string // e.g. "Credits invoice", "Replaces"
	Number string
}

// Document is an invoice or a credit note as it is rendered.
type Document struct {
	Kind     Kind
	Number   string // e.g. MG-2026-000123, MG-CN-2026-000004; empty for invoices issued before numbering
	Status   string // invoices: issued, paid, void or uncollectible; credit notes: issued
	IssuedAt time.Time
	DueAt    time.Time // zero: none (credit notes)
	Period   string    // the billing period, YYYY-MM
	Org      string    // the customer's account id
	Seller   Party
	Buyer    *Party // nil: the customer gave no billing details (the org id stands in)
	Currency string // ISO 4217
	Lines    []Line
	// SubtotalMinor is the sum of the lines' amounts; TaxMinor is SubtotalMinor ×
	// TaxRateBP / 10000 rounded half away from zero; TotalMinor is their sum.
	SubtotalMinor int64
	TaxRateBP     int
	TaxMinor      int64
	TotalMinor    int64
	Refs          []Ref
	Reason        string // why a credit note or a reissue was issued
}
