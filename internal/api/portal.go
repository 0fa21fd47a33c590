package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/metergate/metergate/internal/customer"
)

// Portal authenticates customer tokens (customer.Store): the customer API's credentials.
type Portal interface {
	Authenticate(ctx context.Context, secret string) (customer.Token, error)
}

// portal opens a route of the customer API (/v1/portal/…, docs/portal.md) to a live
// customer token with scope: 401 for no token or one that is unknown, revoked or expired,
// 403 missing_scope for a token without the scope (and forbidden for the admin or service
// token, which open the other APIs). The token reaches h; h answers 404 for anything
// outside the token's subtree (inSubtree), never 403, so that the answer does not tell
// another customer's account from one that does not exist (to come with the routes that
// take an account: its resolved path must pass through the token's account).
func (s *Server) portal(scope customer.Scope, h func(w http.ResponseWriter, r *http.Request, tok customer.Token)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		portal, ok := s.cfg.Customers.(Portal)
		if s.cfg.Customers == nil || !ok {
			s.customerError(w, "customer API: no store configured", nil)
			return
		}
		secret, hasBearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !hasBearer || !strings.HasPrefix(secret, customer.TokenPrefix) {
			code := http.StatusUnauthorized
			if bearer(r, s.cfg.AdminToken) || bearer(r, s.cfg.ServiceToken) {
				code = http.StatusForbidden // those tokens open the other APIs
			}
			writeError(w, authError(code, "a customer token is required (Authorization: Bearer mgc_…)"))
			return
		}
		tok, err := portal.Authenticate(r.Context(), secret)
		switch {
		case errors.Is(err, customer.ErrNotFound):
			writeError(w, authError(http.StatusUnauthorized, "this customer token is unknown, revoked or expired"))
			return
		case err != nil:
			s.customerError(w, "authenticate customer token", err)
			return
		}
		if !tok.Has(scope) {
			writeError(w, &Error{Status: http.StatusForbidden, Code: "missing_scope",
				Message: fmt.Sprintf("this token has no %s scope (it has %v)", scope, tok.Scopes)})
			return
		}
		h(w, r, tok)
	}
}

// portalMe is GET /v1/portal/me: the token itself, without its secret.
func (s *Server) portalMe(w http.ResponseWriter, _ *http.Request, tok customer.Token) {
	writeJSON(w, http.StatusOK, tok)
}
