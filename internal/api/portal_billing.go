package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/policy"
)

// The customer API's API keys, balances, invoices and credit notes (docs/portal.md).

// keyPage is the reply of GET /v1/portal/accounts/{id}/api-keys.
type keyPage struct {
	APIKeys []policy.APIKey `json:"api_keys"`
}

// portalKeys is GET /v1/portal/accounts/{id}/api-keys: the account's keys, revoked ones
// too, newest first (at most policy.MaxPage), never their secrets.
func (s *Server) portalKeys(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	id := r.PathValue("id")
	if _, e := s.within(tok, id); e != nil {
		writeError(w, e)
		return
	}
	keys, err := s.cfg.Admin.APIKeys(r.Context(), id)
	if err != nil {
		s.adminError(w, "portal: list api keys", err)
		return
	}
	writeJSON(w, http.StatusOK, keyPage{APIKeys: append([]policy.APIKey{}, keys...)})
}

// portalCreateKey is POST /v1/portal/accounts/{id}/api-keys: a key of the account, its
// secret shown this once.
func (s *Server) portalCreateKey(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	id := r.PathValue("id")
	if _, e := s.within(tok, id); e != nil {
		writeError(w, e)
		return
	}
	key, secret, err := s.cfg.Admin.CreateAPIKey(r.Context(), id)
	if err != nil {
		s.adminError(w, "portal: create api key", err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"id": key.ID, "account": key.Account, "api_key": secret, "created_at": key.CreatedAt})
}

// portalRevokeKey is DELETE /v1/portal/api-keys/{id}: revoke a key of the subtree.
func (s *Server) portalRevokeKey(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	id := r.PathValue("id")
	key, err := s.cfg.Admin.APIKey(r.Context(), id)
	if err != nil {
		if e, ok := errorFor(err); ok && e.Status == http.StatusNotFound {
			writeError(w, notFound("api key", id))
			return
		}
		s.adminError(w, "portal: read api key", err)
		return
	}
	if _, e := s.within(tok, key.Account); e != nil {
		writeError(w, notFound("api key", id))
		return
	}
	if err := s.cfg.Admin.RevokeAPIKey(r.Context(), id); err != nil {
		s.adminError(w, "portal: revoke api key", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// portalBalance is GET /v1/portal/accounts/{id}/balance: the account's prepaid balances
// and grants, as GET /v1/balance/{account} shows them.
func (s *Server) portalBalance(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	id := r.PathValue("id")
	if _, e := s.within(tok, id); e != nil {
		writeError(w, e)
		return
	}
	if s.cfg.Credits == nil {
		s.creditsError(w, "portal: read balance: no credit store configured", nil, true)
		return
	}
	b, err := s.cfg.Credits.Balance(r.Context(), id)
	if err != nil {
		s.creditsError(w, "portal: read balance", err, true)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// ownsBilling reports whether tok sees its org's invoices and credit notes: a token of
// the org itself, with billing:read. Billing documents are the org's; a team's token sees
// none, as it sees nothing above its team.
func ownsBilling(tok customer.Token) bool { return tok.Account == tok.Org }

// portalInvoice is an invoice as the customer sees it: who at the seller issued it is the
// seller's business.
type portalInvoice struct {
	invoice.Invoice
	ReplacesNumber string          `json:"replaces_number,omitempty"`
	CreditNotes    []CreditNoteRef `json:"credit_notes,omitempty"`
}

// portalInvoices is GET /v1/portal/invoices?period=&status=&after=&limit=: the org's
// invoices, newest first, without lines.
func (s *Server) portalInvoices(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	store := s.cfg.Invoices
	if store == nil {
		s.invoiceError(w, "portal: invoices: no invoice store configured", nil)
		return
	}
	q := r.URL.Query()
	var f invoice.Filter
	var e *Error
	if f.After, f.Limit, e = pageQuery(q); e != nil {
		writeError(w, e)
		return
	}
	page := invoicePage{Invoices: []invoice.Invoice{}}
	if ownsBilling(tok) {
		f.Org = tok.Org
		invs, err := store.Invoices(r.Context(), f)
		if err != nil {
			s.invoiceError(w, "portal: list invoices", err)
			return
		}
		for i := range invs {
			invs[i].IssuedBy = ""
		}
		page.Invoices = append(page.Invoices, invs...)
		page.NextAfter = nextAfter(len(invs), f.Limit, func() int64 { return invs[len(invs)-1].ID })
	}
	writeJSON(w, http.StatusOK, page)
}

// portalGetInvoice is GET /v1/portal/invoices/{id} (and its renderings, {id}.pdf, .html,
// .csv): an invoice of the token's org.
func (s *Server) portalGetInvoice(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	store := s.cfg.Invoices
	if store == nil {
		s.invoiceError(w, "portal: invoices: no invoice store configured", nil)
		return
	}
	id, format, e := documentID(r.PathValue("id"), true)
	if e != nil {
		writeError(w, e)
		return
	}
	rec, err := store.Invoice(r.Context(), id)
	if errors.Is(err, invoice.ErrNotFound) || err == nil && (!ownsBilling(tok) || rec.Org != tok.Org) {
		writeError(w, notFound("invoice", strconv.FormatInt(id, 10))) // one answer for both
		return
	}
	if err != nil {
		s.invoiceError(w, "portal: read invoice", err)
		return
	}
	if format != "" {
		s.writeDocument(w, format, rec.fileName(), rec.Document())
		return
	}
	rec.IssuedBy = ""
	writeJSON(w, http.StatusOK, portalInvoice{Invoice: rec.Invoice, ReplacesNumber: rec.ReplacesNumber, CreditNotes: rec.CreditNotes})
}

// portalCreditNotes is GET /v1/portal/credit-notes?after=&limit=: the org's credit notes.
func (s *Server) portalCreditNotes(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	store := s.cfg.Invoices
	if store == nil {
		s.invoiceError(w, "portal: credit notes: no invoice store configured", nil)
		return
	}
	after, limit, e := pageQuery(r.URL.Query())
	if e != nil {
		writeError(w, e)
		return
	}
	page := creditNotePage{CreditNotes: []invoice.CreditNote{}}
	if ownsBilling(tok) {
		notes, err := store.CreditNotes(r.Context(), tok.Org, after, limit)
		if err != nil {
			s.invoiceError(w, "portal: list credit notes", err)
			return
		}
		for i := range notes {
			notes[i].IssuedBy = ""
		}
		page.CreditNotes = append(page.CreditNotes, notes...)
		page.NextAfter = nextAfter(len(notes), limit, func() int64 { return notes[len(notes)-1].ID })
	}
	writeJSON(w, http.StatusOK, page)
}

// portalGetCreditNote is GET /v1/portal/credit-notes/{id} (and {id}.pdf, .html, .csv).
func (s *Server) portalGetCreditNote(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	store := s.cfg.Invoices
	if store == nil {
		s.invoiceError(w, "portal: credit notes: no invoice store configured", nil)
		return
	}
	id, format, e := documentID(r.PathValue("id"), true)
	if e != nil {
		writeError(w, e)
		return
	}
	n, err := store.CreditNote(r.Context(), id)
	if errors.Is(err, invoice.ErrNotFound) || err == nil && (!ownsBilling(tok) || n.Org != tok.Org) {
		writeError(w, notFound("credit note", strconv.FormatInt(id, 10))) // one answer for both
		return
	}
	if err != nil {
		s.invoiceError(w, "portal: read credit note", err)
		return
	}
	if format != "" {
		s.writeDocument(w, format, n.Number, n.Document())
		return
	}
	n.IssuedBy = ""
	writeJSON(w, http.StatusOK, n)
}
