package console

import "net/http"

// opsPages are the pages of reconcile runs, dead letters, webhooks and the audit log.
// TODO(issue 32): being built.
func (c *Console) opsPages() map[string]page {
	todo := func(w http.ResponseWriter, r *http.Request, v *view) {
		c.fail(w, r, v, http.StatusNotImplemented, "This page is not built yet.")
	}
	out := map[string]page{}
	for _, p := range []string{"GET /console/runs", "GET /console/runs/{id}", "GET /console/dead-letters",
		"GET /console/webhooks", "GET /console/webhooks/{id}", "POST /console/webhooks/{id}/deliveries/{delivery}/replay",
		"GET /console/audit"} {
		out[p] = todo
	}
	return out
}
