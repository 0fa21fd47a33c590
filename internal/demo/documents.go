package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/sandbox"
)

// billingEnv is the seller of the demo's documents: customers in Germany are taxed at 19 %.
var billingEnv = []string{
	"BILLING_SELLER_NAME=Metergate Demo Ltd", "BILLING_SELLER_ADDRESS=1 Dock Road", "BILLING_SELLER_CITY=Dublin",
	"BILLING_SELLER_COUNTRY=IE", "BILLING_SELLER_TAX_ID=IE1234567X", "BILLING_TAX_RATES=DE:1900",
}

// acmeBilling is acme's billing details, as PUT /v1/admin/accounts/acme/billing takes them.
var acmeBilling = map[string]any{
	"legal_name": "Acme GmbH", "address": []string{"Hauptstraße 1"}, "city": "Berlin", "postal_code": "10115",
	"country": "DE", "email": "billing@acme.example",
}

// Documents is what the demo shows of invoices as documents: a PDF written to disk, and a
// void with its credit note.
type Documents struct {
	PDFs       []string // the PDFs written, one per invoice
	Voided     string   // the number of the invoice voided
	CreditNote *invoice.CreditNote
}

// writePDF writes the PDF of inv (GET /v1/admin/invoices/{id}.pdf) to dir/<number>.pdf.
func writePDF(ctx context.Context, admin sandbox.Admin, dir string, inv invoice.Invoice) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/admin/invoices/%d.pdf", admin.Base, inv.ID), nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+admin.Token)
	resp, err := admin.HTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET invoice %d.pdf: %s", inv.ID, resp.Status)
	}
	path := filepath.Join(dir, inv.Number+".pdf")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}

// voidOne voids inv through the admin API: the reply holds its credit note.
func voidOne(ctx context.Context, admin sandbox.Admin, inv invoice.Invoice, d *Documents) error {
	var reply struct {
		CreditNote invoice.CreditNote `json:"credit_note"`
	}
	if err := admin.Do(ctx, http.MethodPost, fmt.Sprintf("/v1/admin/invoices/%d/void", inv.ID),
		map[string]string{"reason": "demo: issued to the wrong legal entity"}, http.StatusOK, &reply); err != nil {
		return err
	}
	if reply.CreditNote.TotalMinor != inv.TotalMinor {
		return fmt.Errorf("credit note %s credits %d, invoice %s totals %d", reply.CreditNote.Number, reply.CreditNote.TotalMinor,
			inv.Number, inv.TotalMinor)
	}
	d.Voided, d.CreditNote = inv.Number, &reply.CreditNote
	return nil
}
