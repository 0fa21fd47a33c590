// Package staff keeps named staff credentials with roles, decides what each role may do on
// the admin API, and writes the audit log of its writes (docs/console.md).
package staff

import (
	"net/http"
	"slices"
	"strings"
)

// Role is what a staff member may do.
type Role string

// The roles, from the most to the least allowed.
const (
	// Admin may do everything: the admin token acts as an admin.
	Admin Role = "admin"
	// Finance reads everything and writes invoices, credit notes, amendments, billing
	// details and grants.
	Finance Role = "finance"
	// Support reads everything and writes API keys, accounts' limits and customer tokens.
	Support Role = "support"
	// Viewer reads only.
	Viewer Role = "viewer"
	// Customer is no staff role: it is the audit log's role of a write through the
	// customer API (docs/portal.md), whose actor is the customer token. It allows nothing
	// of the admin API.
	Customer Role = "customer"
)

// Roles lists every role.
var Roles = []Role{Admin, Finance, Support, Viewer}

// Valid reports whether r is a role.
func (r Role) Valid() bool { return slices.Contains(Roles, r) }

// writers maps each admin route that writes (as "METHOD /pattern", the mux's pattern) to
// the roles besides Admin that may call it. A write not listed is Admin's alone.
var writers = map[string][]Role{
	"POST /v1/admin/api-keys":                       {Support},
	"DELETE /v1/admin/api-keys/{id}":                {Support},
	"PUT /v1/admin/accounts/{id}":                   {Support},
	"POST /v1/admin/accounts/{id}/grants":           {Finance},
	"DELETE /v1/admin/accounts/{id}/grants/{grant}": {Finance},
	"PUT /v1/admin/accounts/{id}/billing":           {Finance},
	"POST /v1/admin/invoices/{id}/status":           {Finance},
	"POST /v1/admin/invoices/{id}/void":             {Finance},
	"POST /v1/admin/invoices/{id}/reissue":          {Finance},
	"POST /v1/admin/amendments":                     {Finance},
	// Customers' access (customer tokens) is support's, like their API keys.
	"POST /v1/admin/customer-tokens":        {Support},
	"DELETE /v1/admin/customer-tokens/{id}": {Support},
	"POST /v1/admin/portal-sessions":        {Support},
}

// Allows reports whether role may call the route pattern ("METHOD /path", as the mux
// matched it): every role reads (GET, HEAD); a write is Admin's, and the roles writers
// names for it.
func (r Role) Allows(pattern string) bool {
	if r == Admin {
		return true
	}
	method, _, _ := strings.Cut(pattern, " ")
	if method == http.MethodGet || method == http.MethodHead {
		return r.Valid()
	}
	return slices.Contains(writers[pattern], r)
}

// IsWrite reports whether a route pattern writes: every method but GET and HEAD.
func IsWrite(pattern string) bool {
	method, _, _ := strings.Cut(pattern, " ")
	return method != http.MethodGet && method != http.MethodHead
}
