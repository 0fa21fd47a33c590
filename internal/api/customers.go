package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/policy"
)

// Customers issues, lists and revokes customer tokens (customer.Store; docs/portal.md).
type Customers interface {
	Create(ctx context.Context, account string, scopes []customer.Scope, ttl time.Duration, name, by string) (customer.Token, string, error)
	List(ctx context.Context, f customer.Filter) ([]customer.Token, error)
	Get(ctx context.Context, id string) (customer.Token, error)
	Revoke(ctx context.Context, id, by string) (customer.Token, error)
}

// customers wraps a handler of the customer-token routes, opened by admin: 503 when no
// store of customer tokens is configured.
func (s *Server) customers(h func(w http.ResponseWriter, r *http.Request, store Customers)) http.HandlerFunc {
	return s.admin(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Customers == nil {
			s.customerError(w, "customer tokens: no store configured", nil)
			return
		}
		h(w, r, s.cfg.Customers)
	})
}

// customerError answers err of the customer-token store; op names what failed in the log.
func (s *Server) customerError(w http.ResponseWriter, op string, err error) {
	var inv *customer.InvalidError
	switch {
	case errors.As(err, &inv):
		writeError(w, badRequest("invalid_"+inv.Field, "%s", inv.Message))
	case errors.Is(err, customer.ErrUnknownAccount):
		writeError(w, &Error{Status: http.StatusNotFound, Code: "not_found", Message: err.Error()})
	case errors.Is(err, customer.ErrNotFound):
		writeError(w, &Error{Status: http.StatusNotFound, Code: "not_found", Message: err.Error()})
	default:
		if err != nil {
			s.cfg.Log.Error(op, "err", err)
		}
		writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
			Message: "customer tokens are unavailable; retry later"})
	}
}

// maxTTLSeconds is the largest ttl_s: customer.MaxTTL.
const maxTTLSeconds = int64(customer.MaxTTL / time.Second)

// newCustomerToken is the reply of POST /v1/admin/customer-tokens: the token and its
// secret, shown this once (the audit log keeps it redacted).
type newCustomerToken struct {
	customer.Token
	Secret string `json:"token"`
}

func (s *Server) createCustomerToken(w http.ResponseWriter, r *http.Request, store Customers) {
	var b struct {
		Account string           `json:"account"`
		Scopes  []customer.Scope `json:"scopes"`
		// TTL is the token's lifetime in seconds; customer.DefaultTTL when left out.
		TTL  *int64 `json:"ttl_s"`
		Name string `json:"name"`
	}
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	ttl := customer.DefaultTTL
	if b.TTL != nil {
		if *b.TTL < 1 || *b.TTL > maxTTLSeconds {
			writeError(w, badRequest("invalid_ttl", "ttl_s must be a whole number of seconds, 1-%d (90 days)", maxTTLSeconds))
			return
		}
		ttl = time.Duration(*b.TTL) * time.Second
	}
	who, e := s.staffOf(r)
	if e != nil {
		writeError(w, e)
		return
	}
	t, secret, err := store.Create(r.Context(), b.Account, b.Scopes, ttl, b.Name, who.ID)
	if err != nil {
		s.customerError(w, "issue a customer token", err)
		return
	}
	writeJSON(w, http.StatusCreated, newCustomerToken{Token: t, Secret: secret})
}

func (s *Server) listCustomerTokens(w http.ResponseWriter, r *http.Request, store Customers) {
	q := r.URL.Query()
	var f customer.Filter
	var e *Error
	if f.Org, e = orgQuery(q); e != nil {
		writeError(w, e)
		return
	}
	if f.Account = q.Get("account"); f.Account != "" && !policy.ValidID(f.Account) {
		writeError(w, badRequest("invalid_account", "account must be an account id: 1-64 of [A-Za-z0-9._-], starting with a letter or digit"))
		return
	}
	if v := q.Get("include_revoked"); v != "" {
		// strconv.ParseBool reads what the OpenAPI document's boolean takes (kin-openapi's).
		all, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, badRequest("invalid_include_revoked", "include_revoked must be true or false"))
			return
		}
		f.IncludeRevoked = all
	}
	list, err := store.List(r.Context(), f)
	if err != nil {
		s.customerError(w, "list customer tokens", err)
		return
	}
	if list == nil {
		list = []customer.Token{}
	}
	writeJSON(w, http.StatusOK, map[string][]customer.Token{"customer_tokens": list})
}

func (s *Server) getCustomerToken(w http.ResponseWriter, r *http.Request, store Customers) {
	t, err := store.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.customerError(w, "read a customer token", err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// revokeCustomerToken revokes a token and replies it as revoked.
func (s *Server) revokeCustomerToken(w http.ResponseWriter, r *http.Request, store Customers) {
	who, e := s.staffOf(r)
	if e != nil {
		writeError(w, e)
		return
	}
	t, err := store.Revoke(r.Context(), r.PathValue("id"), who.ID)
	if errors.Is(err, customer.ErrNotFound) {
		writeError(w, &Error{Status: http.StatusNotFound, Code: "not_found", Message: err.Error() + " (or revoked already)"})
		return
	}
	if err != nil {
		s.customerError(w, "revoke a customer token", err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}
