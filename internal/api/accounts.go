package api

import (
	"context"
	"net/http"
	"time"

	"github.com/metergate/metergate/internal/policy"
)

// accountBody is the body of POST and PUT /v1/admin/accounts.
type accountBody struct {
	ID          string                       `json:"id"`
	Kind        policy.Kind                  `json:"kind"`
	Parent      string                       `json:"parent"`
	Plan        string                       `json:"plan"`
	Limits      map[policy.Unit]policy.Limit `json:"limits"`
	Concurrency *int                         `json:"concurrency"`
	Priority    *int                         `json:"priority"`
	Shadow      bool                         `json:"shadow"`
}

// account is the node the body describes, id aside.
func (b accountBody) account(id string) policy.Account {
	return policy.Account{ID: id, Kind: b.Kind, Parent: b.Parent, Plan: b.Plan, Limits: b.Limits, Concurrency: b.Concurrency, Priority: b.Priority, Shadow: b.Shadow}
}

type accountReply struct {
	policy.Account
	Effective *policy.Resolved `json:"effective,omitempty"`
}

// writeAccount answers with the account and its effective policy. After a write (since
// not zero) it waits, briefly, for the cache to load the write; if that does not happen
// in time the effective policy is omitted rather than stale.
func (s *Server) writeAccount(w http.ResponseWriter, r *http.Request, code int, a policy.Account, since time.Time) {
	reply := accountReply{Account: a}
	fresh := true
	if !since.IsZero() {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		fresh = s.cfg.Policies.WaitFresh(ctx, since) == nil
		cancel()
	}
	if eff, err := s.cfg.Policies.Resolve(a.ID); err == nil && fresh {
		reply.Effective = &eff
	}
	writeJSON(w, code, reply)
}

func (s *Server) adminError(w http.ResponseWriter, op string, err error) {
	if e, ok := errorFor(err); ok {
		writeError(w, e)
		return
	}
	s.cfg.Log.Error(op, "err", err)
	writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "the policy store is unavailable; retry later"})
}

func (s *Server) createAccount(w http.ResponseWriter, r *http.Request) {
	var b accountBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	a, err := s.cfg.Admin.CreateAccount(r.Context(), b.account(b.ID))
	if err != nil {
		s.adminError(w, "create account", err)
		return
	}
	since := time.Now() // after the commit: a load that starts later sees the write
	s.writeAccount(w, r, http.StatusCreated, a, since)
}

func (s *Server) updateAccount(w http.ResponseWriter, r *http.Request) {
	var b accountBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	id := r.PathValue("id")
	if b.ID != "" && b.ID != id {
		writeError(w, badRequest("invalid_id", "the body's id %q differs from the path's %q", b.ID, id))
		return
	}
	a, err := s.cfg.Admin.UpdateAccount(r.Context(), b.account(id))
	if err != nil {
		s.adminError(w, "update account", err)
		return
	}
	since := time.Now() // after the commit: a load that starts later sees the write
	s.writeAccount(w, r, http.StatusOK, a, since)
}

func (s *Server) getAccount(w http.ResponseWriter, r *http.Request) {
	a, err := s.cfg.Admin.GetAccount(r.Context(), r.PathValue("id"))
	if err != nil {
		s.adminError(w, "get account", err)
		return
	}
	s.writeAccount(w, r, http.StatusOK, a, time.Time{})
}

func (s *Server) createAPIKey(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Account string `json:"account"`
	}
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	if !policy.ValidID(b.Account) {
		writeError(w, badRequest("invalid_account", "account must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit"))
		return
	}
	key, secret, err := s.cfg.Admin.CreateAPIKey(r.Context(), b.Account)
	if err != nil {
		s.adminError(w, "create api key", err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"id": key.ID, "account": key.Account, "api_key": secret, "created_at": key.CreatedAt})
}

func (s *Server) revokeAPIKey(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Admin.RevokeAPIKey(r.Context(), r.PathValue("id")); err != nil {
		s.adminError(w, "revoke api key", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
