package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/staff"
)

// Portal authenticates customer tokens (customer.Store): the customer API's credentials.
type Portal interface {
	Authenticate(ctx context.Context, secret string) (customer.Token, error)
}

// customerKey carries the customer token of an in-process call (AsCustomer).
type customerKey struct{}

// AsCustomer returns a context whose customer API calls, served in this process
// (Server.ServeHTTP with no Authorization header), act with tok: the portal pages call the
// customer API so, with the token of their session, and its scope and subtree checks
// apply unchanged. A request from the network cannot carry a context value.
func AsCustomer(ctx context.Context, tok customer.Token) context.Context {
	return context.WithValue(ctx, customerKey{}, tok)
}

// portalRoute is a handler of the customer API, given the caller's live token.
type portalRoute func(w http.ResponseWriter, r *http.Request, tok customer.Token)

// portal opens a route of the customer API (/v1/portal/…, docs/portal.md) to a live
// customer token with scope ("" for any scope): 401 for no token or one that is unknown,
// revoked or expired, 403 missing_scope for a token without the scope (and forbidden for
// the admin or service token, which open the other APIs). The token reaches h; h answers
// 404 for anything outside the token's subtree (within), never 403, so that the answer
// does not tell another customer's account from one that does not exist. Writes are
// recorded in the audit log with the token as their actor and "customer" as its role.
func (s *Server) portal(scope customer.Scope, h portalRoute) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, e := s.customerOf(r)
		if e != nil {
			writeError(w, e)
			return
		}
		if scope != "" && !tok.Has(scope) {
			writeError(w, &Error{Status: http.StatusForbidden, Code: "missing_scope",
				Message: fmt.Sprintf("this token has no %s scope (it has %v)", scope, tok.Scopes)})
			return
		}
		if r.Method == http.MethodGet {
			h(w, r, tok)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), customerKey{}, tok)) // for the audit's before
		s.audited(w, r, staff.Member{ID: tok.ID, Name: tok.Name, Role: staff.Customer}, func(w http.ResponseWriter, r *http.Request) {
			h(w, r, tok)
		})
	}
}

// customerOf is the live customer token r carries: that of an in-process call
// (AsCustomer), else its Authorization header's.
func (s *Server) customerOf(r *http.Request) (customer.Token, *Error) {
	if tok, ok := r.Context().Value(customerKey{}).(customer.Token); ok {
		return tok, nil
	}
	portal, ok := s.cfg.Customers.(Portal)
	if s.cfg.Customers == nil || !ok {
		return customer.Token{}, unavailable("the customer API has no token store configured")
	}
	secret, hasBearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !hasBearer || !strings.HasPrefix(secret, customer.TokenPrefix) {
		code := http.StatusUnauthorized
		if bearer(r, s.cfg.AdminToken) || bearer(r, s.cfg.ServiceToken) {
			code = http.StatusForbidden // those tokens open the other APIs
		}
		return customer.Token{}, authError(code, "a customer token is required (Authorization: Bearer mgc_…)")
	}
	tok, err := portal.Authenticate(r.Context(), secret)
	switch {
	case errors.Is(err, customer.ErrNotFound):
		return customer.Token{}, authError(http.StatusUnauthorized, "this customer token is unknown, revoked or expired")
	case err != nil:
		s.cfg.Log.Error("authenticate customer token", "err", err)
		return customer.Token{}, unavailable("customer tokens cannot be checked now; retry later")
	}
	return tok, nil
}

func unavailable(msg string) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: msg}
}

// notFound is the answer for an account outside the caller's subtree, the same as for one
// that does not exist.
func notFound(what, id string) *Error {
	return &Error{Status: http.StatusNotFound, Code: "not_found", Message: fmt.Sprintf("%s %q does not exist", what, id)}
}

// within returns account id's policy, its path cut to begin at tok's account, when id is
// tok's account or below it; a 404 otherwise. The policy is this node's cache of the tree
// (at most a reload behind PostgreSQL, as admission is).
func (s *Server) within(tok customer.Token, id string) (policy.Resolved, *Error) {
	if !policy.ValidID(id) {
		return policy.Resolved{}, notFound("account", id)
	}
	pol, err := s.cfg.Policies.Resolve(id)
	if err != nil || pol.Org != tok.Org {
		return policy.Resolved{}, notFound("account", id)
	}
	for i, l := range pol.Path {
		if l.Account == tok.Account {
			pol.Path = pol.Path[i:]
			return pol, nil
		}
	}
	return policy.Resolved{}, notFound("account", id)
}

// portalMe is GET /v1/portal/me: the token itself, without its secret.
func (s *Server) portalMe(w http.ResponseWriter, _ *http.Request, tok customer.Token) {
	writeJSON(w, http.StatusOK, tok)
}
