package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/policy"
)

// Credits grants, voids and reads prepaid credit balances (credit.Store).
type Credits interface {
	Grant(ctx context.Context, r credit.GrantRequest) (credit.Grant, bool, error)
	Void(ctx context.Context, account, id string) (credit.Grant, error)
	Balance(ctx context.Context, account string) (credit.Balance, error)
}

// grantBody is the body of POST /v1/admin/accounts/{id}/grants. amount and priority are
// read raw so that a fraction, a string or an overflow is the field's own 400.
type grantBody struct {
	Unit           string          `json:"unit"`
	Amount         json.RawMessage `json:"amount"`
	EffectiveAt    *string         `json:"effective_at"`
	ExpiresAt      *string         `json:"expires_at"`
	Priority       json.RawMessage `json:"priority"`
	Source         string          `json:"source"`
	IdempotencyKey string          `json:"idempotency_key"`
}

func (b grantBody) request(account string) (credit.GrantRequest, *Error) {
	r := credit.GrantRequest{Account: account, Unit: policy.Unit(b.Unit), Source: b.Source, IdempotencyKey: b.IdempotencyKey}
	if b.Unit == "" {
		return r, badRequest("invalid_unit", "unit is required (requests, tokens, credits or cost_micros)")
	}
	if !r.Unit.Valid() {
		return r, badRequest("unknown_unit", "unknown unit %q (known: requests, tokens, credits, cost_micros)", b.Unit)
	}
	amount, err := jsonInt(b.Amount)
	if err != nil || amount <= 0 {
		return r, badRequest("invalid_amount", "amount must be a whole number of units, at least 1")
	}
	r.Amount = amount
	if b.EffectiveAt != nil {
		t, err := time.Parse(time.RFC3339Nano, *b.EffectiveAt)
		if err != nil {
			return r, badRequest("invalid_effective_at", "effective_at must be an RFC 3339 time, e.g. 2026-12-01T00:00:00Z")
		}
		r.EffectiveAt = &t
	}
	if b.ExpiresAt != nil {
		t, err := time.Parse(time.RFC3339Nano, *b.ExpiresAt)
		if err != nil {
			return r, badRequest("invalid_expiry", "expires_at must be an RFC 3339 time, e.g. 2027-01-01T00:00:00Z")
		}
		r.ExpiresAt = &t
	}
	if b.Priority != nil {
		p, err := jsonInt(b.Priority)
		if err != nil || p < 0 || p > 100 {
			return r, badRequest("invalid_priority", "priority must be a whole number from 0 to 100")
		}
		r.Priority = int(p)
	}
	if b.IdempotencyKey != "" {
		if e := validIdempotencyKey(b.IdempotencyKey); e != nil {
			return r, e
		}
	}
	return r, nil
}

// creditsError answers err of the credit store; op names what failed in the log.
func (s *Server) creditsError(w http.ResponseWriter, op string, err error, retryAfter bool) {
	var inv *credit.InvalidError
	switch {
	case errors.As(err, &inv):
		writeError(w, badRequest("invalid_"+inv.Field, "%s", inv.Message))
	case errors.Is(err, credit.ErrUnknownAccount), errors.Is(err, credit.ErrNotFound):
		writeError(w, &Error{Status: http.StatusNotFound, Code: "not_found", Message: err.Error()})
	case errors.Is(err, credit.ErrIdempotencyKeyReused):
		writeError(w, &Error{Status: http.StatusUnprocessableEntity, Code: "idempotency_key_reused", Message: err.Error()})
	default:
		if err != nil {
			s.cfg.Log.Error(op, "err", err)
		}
		if retryAfter {
			w.Header().Set("Retry-After", retryAfterSeconds(s.cfg.RedisDownRetryAfter))
		}
		writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "credit balances are unavailable; retry later"})
	}
}

func (s *Server) createGrant(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Credits == nil {
		s.creditsError(w, "create grant: no credit store configured", nil, false)
		return
	}
	var b grantBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	req, e := b.request(r.PathValue("id"))
	if e != nil {
		writeError(w, e)
		return
	}
	g, created, err := s.cfg.Credits.Grant(r.Context(), req)
	if err != nil {
		s.creditsError(w, "create grant", err, false)
		return
	}
	code := http.StatusOK // a retry with the idempotency key of an existing grant
	if created {
		code = http.StatusCreated
	}
	writeJSON(w, code, g)
}

func (s *Server) voidGrant(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Credits == nil {
		s.creditsError(w, "void grant: no credit store configured", nil, false)
		return
	}
	g, err := s.cfg.Credits.Void(r.Context(), r.PathValue("id"), r.PathValue("grant"))
	if err != nil {
		s.creditsError(w, "void grant", err, false)
		return
	}
	writeJSON(w, http.StatusOK, g)
}

func (s *Server) balance(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("account")
	if !policy.ValidID(id) {
		writeError(w, badRequest("invalid_account", "account must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit"))
		return
	}
	if s.cfg.Credits == nil {
		s.creditsError(w, "read balance: no credit store configured", nil, true)
		return
	}
	b, err := s.cfg.Credits.Balance(r.Context(), id)
	if err != nil {
		s.creditsError(w, "read balance", err, true)
		return
	}
	writeJSON(w, http.StatusOK, b)
}
