package console

import (
	"fmt"
	"net/http"
)

// Routes lists every route of the console, as the mux's patterns. A test walks them all
// with every role (console_test.go).
var Routes = []string{
	"GET /console/static/{file}",
	"GET /console/login",
	"POST /console/login",
	"POST /console/logout",

	"GET /console/{$}",
	"GET /console/accounts",
	"POST /console/accounts",
	"GET /console/accounts/{id}",
	"POST /console/accounts/{id}",
	"POST /console/accounts/{id}/keys",
	"POST /console/accounts/{id}/keys/{key}/revoke",
	"POST /console/accounts/{id}/grants",
	"POST /console/accounts/{id}/grants/{grant}/void",
	"GET /console/why",

	"GET /console/plans",
	"GET /console/plans/{id}",
	"GET /console/invoices",
	"GET /console/invoices/{id}",
	"GET /console/invoices/{id}/pdf",
	"GET /console/invoices/{id}/void",
	"POST /console/invoices/{id}/void",
	"GET /console/invoices/{id}/reissue",
	"POST /console/invoices/{id}/reissue",
	"GET /console/credit-notes",
	"GET /console/credit-notes/{id}",
	"GET /console/credit-notes/{id}/pdf",

	"GET /console/runs",
	"GET /console/runs/{id}",
	"GET /console/dead-letters",
	"GET /console/webhooks",
	"GET /console/webhooks/{id}",
	"POST /console/webhooks/{id}/deliveries/{delivery}/replay",
	"GET /console/audit",

	"GET /console/staff",
	"POST /console/staff",
	"POST /console/staff/{id}/revoke",
	"GET /console/sessions",
	"POST /console/sessions/{id}/revoke",
}

// Writes maps each write of the console to the admin API route it performs: the console
// offers it only to a role that route allows, and the API checks the role again. The
// console's own writes (its sessions) name themselves: a role may do them when Allows
// says so of that pattern (an admin's alone).
var Writes = map[string]string{
	"POST /console/accounts":                                   "POST /v1/admin/accounts",
	"POST /console/accounts/{id}":                              "PUT /v1/admin/accounts/{id}",
	"POST /console/accounts/{id}/keys":                         "POST /v1/admin/api-keys",
	"POST /console/accounts/{id}/keys/{key}/revoke":            "DELETE /v1/admin/api-keys/{id}",
	"POST /console/accounts/{id}/grants":                       "POST /v1/admin/accounts/{id}/grants",
	"POST /console/accounts/{id}/grants/{grant}/void":          "DELETE /v1/admin/accounts/{id}/grants/{grant}",
	"POST /console/invoices/{id}/void":                         "POST /v1/admin/invoices/{id}/void",
	"POST /console/invoices/{id}/reissue":                      "POST /v1/admin/invoices/{id}/reissue",
	"POST /console/webhooks/{id}/deliveries/{delivery}/replay": "POST /v1/admin/webhooks/{id}/deliveries/{delivery}/replay",
	"POST /console/staff":                                      "POST /v1/admin/staff",
	"POST /console/staff/{id}/revoke":                          "DELETE /v1/admin/staff/{id}",
	"POST /console/sessions/{id}/revoke":                       "POST /console/sessions/{id}/revoke",
}

// Open are the routes served without a session: the stylesheet and signing in and out.
var Open = map[string]bool{
	"GET /console/static/{file}": true,
	"GET /console/login":         true,
	"POST /console/login":        true,
	"POST /console/logout":       true,
}

func (c *Console) routes() {
	handlers := map[string]http.HandlerFunc{
		"GET /console/static/{file}": static,
		"GET /console/login":         c.loginPage,
		"POST /console/login":        c.login,
		"POST /console/logout":       c.logout,
	}
	for _, group := range []map[string]page{c.sessionPages(), c.accountPages(), c.billingPages(), c.opsPages()} {
		for pattern, p := range group {
			if _, dup := handlers[pattern]; dup {
				panic("console: two pages for " + pattern)
			}
			if api, ok := Writes[pattern]; ok {
				p = c.allowed(api, p)
			}
			handlers[pattern] = c.signedIn(p)
		}
	}
	for _, pattern := range Routes {
		h, ok := handlers[pattern]
		if !ok {
			panic("console: no page for " + pattern)
		}
		c.mux.HandleFunc(pattern, h)
		delete(handlers, pattern)
	}
	for pattern := range handlers {
		panic("console: a page not in Routes: " + pattern)
	}
	c.mux.HandleFunc("/console/", c.signedIn(func(w http.ResponseWriter, r *http.Request, v *view) {
		c.fail(w, r, v, http.StatusNotFound, "There is no such page.")
	}))
}

// allowed refuses a write with 403 to a role the admin API route it performs does not
// allow (the API would refuse it too).
func (c *Console) allowed(apiPattern string, p page) page {
	return func(w http.ResponseWriter, r *http.Request, v *view) {
		if !v.Can(apiPattern) {
			c.fail(w, r, v, http.StatusForbidden, fmt.Sprintf("Your role (%s) may not do this.", v.Me().Role))
			return
		}
		p(w, r, v)
	}
}
