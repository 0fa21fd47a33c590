package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/staff"
)

// Invoices reads issued invoices and credit notes, changes invoices' statuses (a void
// issues a credit note), amends closed periods' usage and keeps the customers' billing
// details (InvoiceStore).
type Invoices interface {
	Invoices(ctx context.Context, f invoice.Filter) ([]invoice.Invoice, error)
	// Invoice returns an invoice with its lines, status history and credit notes.
	Invoice(ctx context.Context, id int64) (InvoiceRecord, error)
	SetStatus(ctx context.Context, id int64, to, reason, by string) (invoice.Invoice, *invoice.CreditNote, error)
	// Reissue issues the replacement of a voided invoice (invoice.Reissue).
	Reissue(ctx context.Context, id int64, reason, by string) (invoice.Invoice, error)
	CreditNotes(ctx context.Context, org string, after int64, limit int) ([]invoice.CreditNote, error)
	CreditNote(ctx context.Context, id int64) (invoice.CreditNote, error)
	// Amend records an amendment of recorded events of a closed period (invoice.Amend).
	Amend(ctx context.Context, a invoice.Amendment) (invoice.Amended, error)
	PutBillingDetails(ctx context.Context, d invoice.BillingDetails) (invoice.BillingDetails, error)
	BillingDetails(ctx context.Context, org string) (invoice.BillingDetails, error)
}

// InvoiceRecord is an invoice as GET /v1/admin/invoices/{id} shows it: the invoice with its
// lines, and what happened to it since it was issued. Its renderings come from the same
// value (Document).
type InvoiceRecord struct {
	invoice.Invoice
	// ReplacesNumber is the number of the voided invoice a reissue replaces.
	ReplacesNumber string                 `json:"replaces_number,omitempty"`
	StatusHistory  []invoice.StatusChange `json:"status_history"`
	CreditNotes    []CreditNoteRef        `json:"credit_notes"`
}

// Document is the record as it is rendered.
func (r InvoiceRecord) Document() document.Document { return r.Invoice.Document(r.ReplacesNumber) }

// CreditNoteRef names a credit note of an invoice.
type CreditNoteRef struct {
	ID     int64  `json:"id"`
	Number string `json:"number"`
}

// InvoiceStore is Invoices over PostgreSQL (internal/invoice), changing statuses as Issuer.
type InvoiceStore struct {
	Pool   *pgxpool.Pool
	Issuer invoice.Issuer
	// Clock picks the month whose price a customer's currency is checked against (nil:
	// the system clock).
	Clock period.Clock
}

// Invoices returns a page of the invoices f selects.
func (s InvoiceStore) Invoices(ctx context.Context, f invoice.Filter) ([]invoice.Invoice, error) {
	return invoice.List(ctx, s.Pool, f)
}

// Invoice reads invoice id, its history, its credit notes and the number of the invoice it
// replaces in one snapshot, so that they agree.
func (s InvoiceStore) Invoice(ctx context.Context, id int64) (InvoiceRecord, error) {
	var rec InvoiceRecord
	err := pgx.BeginTxFunc(ctx, s.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		if rec.Invoice, err = invoice.Get(ctx, tx, id); err != nil {
			return err
		}
		if rec.StatusHistory, err = invoice.StatusHistory(ctx, tx, id); err != nil {
			return err
		}
		if rec.ReplacesNumber, err = invoice.ReplacedNumber(ctx, tx, rec.Invoice); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `select id, number from credit_notes where invoice_id = $1 order by id`, id)
		if err != nil {
			return fmt.Errorf("read the credit notes of invoice %d: %w", id, err)
		}
		rec.CreditNotes, err = pgx.CollectRows(rows, pgx.RowToStructByPos[CreditNoteRef])
		if err != nil {
			return fmt.Errorf("read the credit notes of invoice %d: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return InvoiceRecord{}, err
	}
	if rec.StatusHistory == nil {
		rec.StatusHistory = []invoice.StatusChange{}
	}
	if rec.CreditNotes == nil {
		rec.CreditNotes = []CreditNoteRef{}
	}
	return rec, nil
}

// SetStatus changes invoice id's status (invoice.SetStatus).
func (s InvoiceStore) SetStatus(ctx context.Context, id int64, to, reason, by string) (invoice.Invoice, *invoice.CreditNote, error) {
	return invoice.SetStatus(ctx, s.Pool, s.Issuer, id, to, reason, by)
}

// Reissue issues the replacement of voided invoice id (invoice.Reissue).
func (s InvoiceStore) Reissue(ctx context.Context, id int64, reason, by string) (invoice.Invoice, error) {
	return invoice.Reissue(ctx, s.Pool, s.Issuer, id, reason, by, s.Clock.Now())
}

// CreditNotes returns a page of org's credit notes (every org's when empty).
func (s InvoiceStore) CreditNotes(ctx context.Context, org string, after int64, limit int) ([]invoice.CreditNote, error) {
	return invoice.CreditNotes(ctx, s.Pool, org, after, limit)
}

// CreditNote returns credit note id with its lines.
func (s InvoiceStore) CreditNote(ctx context.Context, id int64) (invoice.CreditNote, error) {
	return invoice.GetCreditNote(ctx, s.Pool, id)
}

// Amend records amendment a of a closed period's usage, settled on the next invoice or by
// a credit note issued as Issuer (invoice.Amend).
func (s InvoiceStore) Amend(ctx context.Context, a invoice.Amendment) (invoice.Amended, error) {
	return invoice.Amend(ctx, s.Pool, s.Issuer, a)
}

// PutBillingDetails writes d (invoice.PutBillingDetails), checking its currency against
// the org's plan this month.
func (s InvoiceStore) PutBillingDetails(ctx context.Context, d invoice.BillingDetails) (invoice.BillingDetails, error) {
	return invoice.PutBillingDetails(ctx, s.Pool, d, s.Clock.Now())
}

// BillingDetails returns org's billing details.
func (s InvoiceStore) BillingDetails(ctx context.Context, org string) (invoice.BillingDetails, error) {
	return invoice.GetBillingDetails(ctx, s.Pool, org)
}

// adminActor is who the admin API records as making a change with the admin token, which
// names no one.
const adminActor = "admin"

// actor is who the admin API records on a document as making a change: the staff member
// of the request (its id), or adminActor for the admin token.
func actor(r *http.Request) string {
	if m, ok := r.Context().Value(staffKey{}).(staff.Member); ok && m.ID != staff.AdminToken {
		return m.ID
	}
	return adminActor
}

// Bounds of a page of invoices or credit notes.
const (
	defaultPage = 100
	maxPage     = 500
)

// invoices wraps an invoices handler: the admin token, then 503 when no store is configured.
func (s *Server) invoices(h func(w http.ResponseWriter, r *http.Request, store Invoices)) http.HandlerFunc {
	return s.admin(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Invoices == nil {
			s.invoiceError(w, "invoices: no invoice store configured", nil)
			return
		}
		h(w, r, s.cfg.Invoices)
	})
}

// invoiceError answers err of the invoice store; op names what failed in the log.
func (s *Server) invoiceError(w http.ResponseWriter, op string, err error) {
	switch {
	case errors.Is(err, invoice.ErrNotFound):
		writeError(w, &Error{Status: http.StatusNotFound, Code: "not_found", Message: err.Error()})
	case errors.Is(err, invoice.ErrAlreadyReissued):
		writeError(w, &Error{Status: http.StatusConflict, Code: "already_reissued", Message: err.Error()})
	case errors.Is(err, invoice.ErrTransition):
		writeError(w, &Error{Status: http.StatusConflict, Code: "invalid_transition", Message: err.Error() +
			" (issued may become paid, void or uncollectible; uncollectible paid or void; paid and void are final)"})
	case errors.Is(err, invoice.ErrInvalidReason):
		writeError(w, badRequest("invalid_reason", "%s", err.Error()))
	case errors.Is(err, invoice.ErrInvalidDetails):
		writeError(w, badRequest("invalid_billing_details", "%s", err.Error()))
	case errors.Is(err, invoice.ErrNotOrg):
		writeError(w, &Error{Status: http.StatusConflict, Code: "not_an_org", Message: err.Error()})
	case errors.Is(err, invoice.ErrCurrencyMismatch):
		writeError(w, &Error{Status: http.StatusConflict, Code: "currency_mismatch", Message: err.Error()})
	case errors.Is(err, invoice.ErrInvalidAmendment):
		writeError(w, badRequest("invalid_amendment", "%s", err.Error()))
	case errors.Is(err, invoice.ErrUnknownEvent):
		writeError(w, &Error{Status: http.StatusNotFound, Code: "unknown_event", Message: err.Error()})
	case errors.Is(err, invoice.ErrPeriodOpen):
		writeError(w, &Error{Status: http.StatusConflict, Code: "period_open", Message: err.Error()})
	case errors.Is(err, invoice.ErrNotACredit):
		writeError(w, &Error{Status: http.StatusConflict, Code: "not_a_credit", Message: err.Error()})
	case errors.Is(err, invoice.ErrNoLiveInvoice):
		writeError(w, &Error{Status: http.StatusConflict, Code: "no_live_invoice", Message: err.Error()})
	default:
		if err != nil {
			s.cfg.Log.Error(op, "err", err)
		}
		writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "invoices are unavailable; retry later"})
	}
}

// The renderings of a document, by the suffix of its id: /v1/admin/invoices/123.pdf.
var renderings = map[string]struct {
	contentType string
	render      func(io.Writer, document.Document) error
	attachment  bool
}{
	"pdf":  {"application/pdf", document.PDF, true},
	"html": {"text/html; charset=utf-8", document.HTML, false},
	"csv":  {"text/csv; charset=utf-8", document.CSV, true},
}

// documentCSP lets a rendered page use its inline style and nothing else: no script, no
// image, no request anywhere.
const documentCSP = "default-src 'none'; style-src 'unsafe-inline'"

// documentID reads a document's id from the path: 123 (JSON), or 123.pdf, 123.html or
// 123.csv (a rendering) when renderable.
func documentID(raw string, renderable bool) (id int64, format string, e *Error) {
	digits := raw
	if renderable {
		if i := strings.LastIndexByte(raw, '.'); i >= 0 {
			digits, format = raw[:i], raw[i+1:]
			if _, ok := renderings[format]; !ok {
				return 0, "", badRequest("invalid_id", "%q: a document is its id, or its id with .pdf, .html or .csv", raw)
			}
		}
	}
	id, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || id < 1 || strconv.FormatInt(id, 10) != digits {
		if renderable {
			return 0, "", badRequest("invalid_id", "%q: a document is its id (a whole number from 1), or its id with .pdf, .html or .csv", raw)
		}
		return 0, "", badRequest("invalid_id", "%q: an id is a whole number from 1", raw)
	}
	return id, format, nil
}

// writeDocument answers d rendered as format, named name (its number) for a download. It
// renders in full first, so that a failure is an error reply, not half a document.
func (s *Server) writeDocument(w http.ResponseWriter, format, name string, d document.Document) {
	out := renderings[format]
	var buf bytes.Buffer
	if err := out.render(&buf, d); err != nil {
		s.cfg.Log.Error("render document", "number", d.Number, "format", format, "err", err)
		writeError(w, &Error{Status: http.StatusInternalServerError, Code: "internal", Message: "the document could not be rendered"})
		return
	}
	h := w.Header()
	h.Set("Content-Type", out.contentType)
	h.Set("X-Content-Type-Options", "nosniff")
	if format == "html" {
		h.Set("Content-Security-Policy", documentCSP)
	}
	if out.attachment {
		h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name+"."+format))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf.Bytes()) // a failed write means the client left
}

// pageQuery reads after (0 when absent) and limit (defaultPage when absent).
func pageQuery(q url.Values) (after int64, limit int, e *Error) {
	limit = defaultPage
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, 0, badRequest("invalid_after", "after must be the id that ended the previous page (next_after), a whole number from 0")
		}
		after = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPage {
			return 0, 0, badRequest("invalid_limit", "limit must be a whole number, 1-%d", maxPage)
		}
		limit = n
	}
	return after, limit, nil
}

// orgQuery reads the org filter (empty: every org).
func orgQuery(q url.Values) (string, *Error) {
	org := q.Get("org")
	if org != "" && !policy.ValidID(org) {
		return "", badRequest("invalid_org", "org must be an account id: 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
	}
	return org, nil
}

// nextAfter is the after of the next page: the last id of a full page, nil after a page
// that is not full (the last).
func nextAfter(n, limit int, last func() int64) *int64 {
	if n < limit || n == 0 {
		return nil
	}
	id := last()
	return &id
}

// invoicePage is the reply of GET /v1/admin/invoices.
type invoicePage struct {
	Invoices  []invoice.Invoice `json:"invoices"`
	NextAfter *int64            `json:"next_after"`
}

func (s *Server) listInvoices(w http.ResponseWriter, r *http.Request, store Invoices) {
	q := r.URL.Query()
	var f invoice.Filter
	var e *Error
	if f.Org, e = orgQuery(q); e != nil {
		writeError(w, e)
		return
	}
	if v := q.Get("period"); v != "" {
		month, err := period.ParseMonth(v)
		if err != nil {
			writeError(w, badRequest("invalid_period", "period must be a month, YYYY-MM"))
			return
		}
		f.Period = month
	}
	switch f.Status = q.Get("status"); f.Status {
	case "", invoice.StatusIssued, invoice.StatusPaid, invoice.StatusVoid, invoice.StatusUncollectible:
	default:
		writeError(w, badRequest("invalid_status", "status must be issued, paid, void or uncollectible"))
		return
	}
	if f.After, f.Limit, e = pageQuery(q); e != nil {
		writeError(w, e)
		return
	}
	invs, err := store.Invoices(r.Context(), f)
	if err != nil {
		s.invoiceError(w, "list invoices", err)
		return
	}
	writeJSON(w, http.StatusOK, invoicePage{Invoices: invs,
		NextAfter: nextAfter(len(invs), f.Limit, func() int64 { return invs[len(invs)-1].ID })})
}

func (s *Server) getInvoice(w http.ResponseWriter, r *http.Request, store Invoices) {
	id, format, e := documentID(r.PathValue("id"), true)
	if e != nil {
		writeError(w, e)
		return
	}
	rec, err := store.Invoice(r.Context(), id)
	if err != nil {
		s.invoiceError(w, "read invoice", err)
		return
	}
	if format == "" {
		writeJSON(w, http.StatusOK, rec)
		return
	}
	s.writeDocument(w, format, rec.fileName(), rec.Document())
}

// fileName names the record's renderings: its number, or invoice-<id> for an invoice
// issued before numbering.
func (r InvoiceRecord) fileName() string {
	if r.Number == "" {
		return "invoice-" + strconv.FormatInt(r.ID, 10)
	}
	return r.Number
}

// statusBody is the body of POST /v1/admin/invoices/{id}/status; voidBody of .../void and
// .../reissue.
type (
	statusBody struct {
		Status string `json:"status"`
		Reason string `json:"reason"`
	}
	voidBody struct {
		Reason string `json:"reason"`
	}
)

// statusReply is the reply of a status change: the invoice as changed and, for a void,
// its credit note.
type statusReply struct {
	Invoice    invoice.Invoice     `json:"invoice"`
	CreditNote *invoice.CreditNote `json:"credit_note,omitempty"`
}

// invoiceAction reads an invoice action's path id and JSON body into b; false when it
// answered an error.
func invoiceAction(w http.ResponseWriter, r *http.Request, b any) (int64, bool) {
	id, _, e := documentID(r.PathValue("id"), false)
	if e == nil {
		e = decodeJSON(r.Body, b)
	}
	if e != nil {
		writeError(w, e)
		return 0, false
	}
	return id, true
}

func (s *Server) setInvoiceStatus(w http.ResponseWriter, r *http.Request, store Invoices) {
	var b statusBody
	id, ok := invoiceAction(w, r, &b)
	if !ok {
		return
	}
	switch b.Status {
	case invoice.StatusPaid, invoice.StatusUncollectible:
	case invoice.StatusVoid:
		writeError(w, badRequest("invalid_status", "void with POST /v1/admin/invoices/%d/void, which issues the credit note", id))
		return
	default:
		writeError(w, badRequest("invalid_status", "status must be paid or uncollectible (void: POST /v1/admin/invoices/%d/void)", id))
		return
	}
	s.changeStatus(w, r, store, id, b.Status, b.Reason)
}

func (s *Server) voidInvoice(w http.ResponseWriter, r *http.Request, store Invoices) {
	var b voidBody
	if id, ok := invoiceAction(w, r, &b); ok {
		s.changeStatus(w, r, store, id, invoice.StatusVoid, b.Reason)
	}
}

func (s *Server) reissueInvoice(w http.ResponseWriter, r *http.Request, store Invoices) {
	var b voidBody
	id, ok := invoiceAction(w, r, &b)
	if !ok {
		return
	}
	inv, err := store.Reissue(r.Context(), id, b.Reason, actor(r))
	if err != nil {
		s.invoiceError(w, "reissue invoice", err)
		return
	}
	writeJSON(w, http.StatusCreated, statusReply{Invoice: inv})
}

func (s *Server) changeStatus(w http.ResponseWriter, r *http.Request, store Invoices, id int64, to, reason string) {
	inv, note, err := store.SetStatus(r.Context(), id, to, reason, actor(r))
	if err != nil {
		s.invoiceError(w, "change invoice status", err)
		return
	}
	writeJSON(w, http.StatusOK, statusReply{Invoice: inv, CreditNote: note})
}

// creditNotePage is the reply of GET /v1/admin/credit-notes.
type creditNotePage struct {
	CreditNotes []invoice.CreditNote `json:"credit_notes"`
	NextAfter   *int64               `json:"next_after"`
}

func (s *Server) listCreditNotes(w http.ResponseWriter, r *http.Request, store Invoices) {
	q := r.URL.Query()
	org, e := orgQuery(q)
	if e != nil {
		writeError(w, e)
		return
	}
	after, limit, e := pageQuery(q)
	if e != nil {
		writeError(w, e)
		return
	}
	notes, err := store.CreditNotes(r.Context(), org, after, limit)
	if err != nil {
		s.invoiceError(w, "list credit notes", err)
		return
	}
	writeJSON(w, http.StatusOK, creditNotePage{CreditNotes: notes,
		NextAfter: nextAfter(len(notes), limit, func() int64 { return notes[len(notes)-1].ID })})
}

func (s *Server) getCreditNote(w http.ResponseWriter, r *http.Request, store Invoices) {
	id, format, e := documentID(r.PathValue("id"), true)
	if e != nil {
		writeError(w, e)
		return
	}
	n, err := store.CreditNote(r.Context(), id)
	if err != nil {
		s.invoiceError(w, "read credit note", err)
		return
	}
	if format == "" {
		writeJSON(w, http.StatusOK, n)
		return
	}
	s.writeDocument(w, format, n.Number, n.Document())
}

// billingBody is the body of PUT /v1/admin/accounts/{id}/billing: the billing details
// but the org (the path's) and who changed them when (the server's).
type billingBody struct {
	LegalName  string   `json:"legal_name"`
	Address    []string `json:"address"`
	City       string   `json:"city"`
	PostalCode string   `json:"postal_code"`
	Region     string   `json:"region"`
	Country    string   `json:"country"`
	Email      string   `json:"email"`
	TaxID      string   `json:"tax_id"`
	Currency   string   `json:"currency"`
	TaxRateBP  *int     `json:"tax_rate_bp"`
}

// accountID reads the path's account id.
func accountID(r *http.Request) (string, *Error) {
	id := r.PathValue("id")
	if !policy.ValidID(id) {
		return "", badRequest("invalid_account", "account must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
	}
	return id, nil
}

func (s *Server) putBillingDetails(w http.ResponseWriter, r *http.Request, store Invoices) {
	org, e := accountID(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var b billingBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	d := invoice.BillingDetails{Org: org, Party: document.Party{LegalName: b.LegalName, Address: b.Address, City: b.City,
		PostalCode: b.PostalCode, Region: b.Region, Country: b.Country, Email: b.Email, TaxID: b.TaxID},
		Currency: b.Currency, TaxRateBP: b.TaxRateBP, UpdatedBy: actor(r)}
	stored, err := store.PutBillingDetails(r.Context(), d)
	if err != nil {
		s.invoiceError(w, "write billing details", err)
		return
	}
	writeJSON(w, http.StatusOK, stored)
}

func (s *Server) getBillingDetails(w http.ResponseWriter, r *http.Request, store Invoices) {
	org, e := accountID(r)
	if e != nil {
		writeError(w, e)
		return
	}
	d, err := store.BillingDetails(r.Context(), org)
	if err != nil {
		s.invoiceError(w, "read billing details", err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}
