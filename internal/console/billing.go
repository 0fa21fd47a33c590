package console

import "net/http"

// billingPages are the pages of plans, invoices and credit notes. TODO(issue 32): being built.
func (c *Console) billingPages() map[string]page {
	todo := func(w http.ResponseWriter, r *http.Request, v *view) {
		c.fail(w, r, v, http.StatusNotImplemented, "This page is not built yet.")
	}
	out := map[string]page{}
	for _, p := range []string{"GET /console/plans", "GET /console/plans/{id}", "GET /console/invoices",
		"GET /console/invoices/{id}", "GET /console/invoices/{id}/pdf", "GET /console/invoices/{id}/void",
		"POST /console/invoices/{id}/void", "GET /console/invoices/{id}/reissue", "POST /console/invoices/{id}/reissue",
		"GET /console/credit-notes", "GET /console/credit-notes/{id}", "GET /console/credit-notes/{id}/pdf"} {
		out[p] = todo
	}
	return out
}
