package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
)

// portalAccount is the reply of GET /v1/portal/accounts/{id}: the account, each level of its
// path from the token's account down to it with its limits and what is left of its quotas
// now, and what the account may still use.
type portalAccount struct {
	Account portalNode    `json:"account"`
	Levels  []portalLevel `json:"levels"`
	// Remaining is, per unit with a quota at a level shown, the least any of them has
	// left: what the account may still use of it this period (-1: uncapped). Levels above
	// the token's account may bind sooner; they are the seller's and are not shown.
	Remaining map[policy.Unit]int64 `json:"remaining"`
	// Writable: the token may change this account's limits (accounts:write, and the
	// account is below the token's own).
	Writable bool `json:"writable"`
}

// portalNode is an account as the customer API shows it: no shadow mode, no priority.
type portalNode struct {
	ID     string      `json:"id"`
	Kind   policy.Kind `json:"kind"`
	Parent string      `json:"parent,omitempty"` // left out for the token's own account
	Plan   string      `json:"plan,omitempty"`
	// Limits are the account's own limits (the levels' are the effective ones).
	Limits      map[policy.Unit]policy.Limit `json:"limits,omitempty"`
	Concurrency *int                         `json:"concurrency,omitempty"`
}

type portalLevel struct {
	Account     string                       `json:"account"`
	Kind        policy.Kind                  `json:"kind"`
	Plan        string                       `json:"plan,omitempty"`
	Limits      map[policy.Unit]policy.Limit `json:"limits"`
	Concurrency int                          `json:"concurrency,omitempty"`
	Quotas      map[policy.Unit]portalQuota  `json:"quotas"`
}

// portalQuota is a level's quota of a unit in its current period, live from Redis.
type portalQuota struct {
	Used      int64     `json:"used"`
	Quota     int64     `json:"quota"`     // -1: counted, uncapped
	Remaining int64     `json:"remaining"` // -1: uncapped
	Period    string    `json:"period"`
	ResetsAt  time.Time `json:"resets_at"`
}

// portalAccountView reads account id (within tok's subtree: pol) and what is left of its
// quotas; the error is the reply to send.
func (s *Server) portalAccountView(ctx context.Context, tok customer.Token, pol policy.Resolved) (portalAccount, *Error) {
	id := pol.Path[len(pol.Path)-1].Account
	a, err := s.cfg.Admin.GetAccount(ctx, id)
	if err != nil {
		if e, ok := errorFor(err); ok {
			return portalAccount{}, e
		}
		s.cfg.Log.Error("portal: read account", "account", id, "err", err)
		return portalAccount{}, unavailable("the account cannot be read now; retry later")
	}
	v := portalAccount{
		Account:   portalNode{ID: a.ID, Kind: a.Kind, Plan: a.Plan, Limits: a.Limits, Concurrency: a.Concurrency},
		Remaining: map[policy.Unit]int64{},
		Writable:  id != tok.Account && tok.Has(customer.AccountsWrite),
	}
	if id != tok.Account {
		v.Account.Parent = a.Parent
	}
	for _, l := range pol.Path {
		lv := portalLevel{Account: l.Account, Kind: l.Kind, Plan: l.Plan, Limits: l.Limits, Concurrency: l.Concurrency,
			Quotas: map[policy.Unit]portalQuota{}}
		lp, err := s.cfg.Policies.Resolve(l.Account)
		if err != nil {
			return portalAccount{}, notFound("account", id) // gone since pol was read
		}
		used, err := s.cfg.Decider.Usage(ctx, lp)
		if err != nil {
			s.cfg.Log.Warn("portal: read usage", "account", l.Account, "err", err)
			return portalAccount{}, unavailable("usage cannot be read right now; retry later")
		}
		for u, x := range used {
			q := portalQuota{Used: x.Used, Quota: x.Quota, Remaining: x.Remaining, Period: x.Period}
			q.ResetsAt, _ = period.End(x.Period)
			lv.Quotas[u] = q
			if r, seen := v.Remaining[u]; !seen || r < 0 || (x.Remaining >= 0 && x.Remaining < r) {
				v.Remaining[u] = x.Remaining
			}
		}
		v.Levels = append(v.Levels, lv)
	}
	return v, nil
}

// portalGetAccount is GET /v1/portal/accounts/{id}.
func (s *Server) portalGetAccount(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	pol, e := s.within(tok, r.PathValue("id"))
	if e == nil {
		var v portalAccount
		if v, e = s.portalAccountView(r.Context(), tok, pol); e == nil {
			writeJSON(w, http.StatusOK, v)
			return
		}
	}
	writeError(w, e)
}

// childrenPage is the reply of GET /v1/portal/accounts/{id}/children.
type childrenPage struct {
	Accounts []portalNode `json:"accounts"`
	Next     string       `json:"next"` // the after of the next page; "" on the last
}

// portalChildren is GET /v1/portal/accounts/{id}/children?after=&limit=: the account's
// children by id, limit (1-200, 50 by default) at a time.
func (s *Server) portalChildren(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	id := r.PathValue("id")
	if _, e := s.within(tok, id); e != nil {
		writeError(w, e)
		return
	}
	kids, next, e := s.children(r, id)
	if e != nil {
		writeError(w, e)
		return
	}
	page := childrenPage{Accounts: []portalNode{}, Next: next}
	for _, k := range kids {
		page.Accounts = append(page.Accounts, portalNode{ID: k.ID, Kind: k.Kind, Parent: k.Parent, Plan: k.Plan, Concurrency: k.Concurrency})
	}
	writeJSON(w, http.StatusOK, page)
}

// children reads a page of account id's children: after (an account id, "" for the first
// page) and limit (1 to policy.MaxPage-1, 50 when absent) from r's query; next is the
// after of the page that follows ("" on the last).
func (s *Server) children(r *http.Request, id string) (kids []policy.Account, next string, e *Error) {
	q := r.URL.Query()
	after, limit := q.Get("after"), 50
	if after != "" && !policy.ValidID(after) {
		return nil, "", badRequest("invalid_after", "after must be the next of the previous page, an account id")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n >= policy.MaxPage {
			return nil, "", badRequest("invalid_limit", "limit must be a whole number from 1 to %d", policy.MaxPage-1)
		}
		limit = n
	}
	kids, err := s.cfg.Admin.Children(r.Context(), id, after, limit+1)
	if err != nil {
		s.cfg.Log.Error("portal: list children", "account", id, "err", err)
		return nil, "", unavailable("the accounts cannot be read now; retry later")
	}
	if len(kids) > limit {
		kids, next = kids[:limit], kids[limit-1].ID
	}
	return kids, next, nil
}

// portalAccountBody is the body of POST and PUT /v1/portal/accounts: what a customer may
// set of an account below its token's. Plans, priorities and shadow mode are the seller's.
type portalAccountBody struct {
	ID          string                       `json:"id"`
	Kind        policy.Kind                  `json:"kind"`
	Parent      string                       `json:"parent"`
	Limits      map[policy.Unit]policy.Limit `json:"limits"`
	Concurrency *int                         `json:"concurrency"`
}

// beyond checks limits and concurrency, of an account placed below path's last level,
// against every level of path: a customer divides what its account has, never more.
func beyond(path []policy.Level, limits map[policy.Unit]policy.Limit, concurrency *int) *Error {
	for _, l := range path {
		for u, lim := range limits {
			if why := lim.Normalize().Beyond(l.Limits[u]); why != "" {
				return badRequest("limit_exceeds_parent", "%s: %s at %s %s", u, why, l.Kind, l.Account)
			}
		}
		if concurrency != nil && l.Concurrency > 0 && (*concurrency == 0 || *concurrency > l.Concurrency) {
			return badRequest("limit_exceeds_parent", "concurrency: %d is more than the %d at %s %s (0, no cap, is too)",
				*concurrency, l.Concurrency, l.Kind, l.Account)
		}
	}
	return nil
}

// portalCreateAccount is POST /v1/portal/accounts: a team, user or agent below an account
// of the token's subtree, with limits within those above it.
func (s *Server) portalCreateAccount(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	var b portalAccountBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	if b.Parent == "" {
		writeError(w, badRequest("invalid_parent", "parent is required: an account of this token's (%s or below it)", tok.Account))
		return
	}
	parent, e := s.within(tok, b.Parent)
	if e != nil {
		writeError(w, e)
		return
	}
	if e := s.bound(parent, b); e != nil {
		writeError(w, e)
		return
	}
	a, err := s.cfg.Admin.CreateAccount(r.Context(), policy.Account{ID: b.ID, Kind: b.Kind, Parent: b.Parent,
		Limits: b.Limits, Concurrency: b.Concurrency})
	if err != nil {
		s.adminError(w, "portal: create account", err)
		return
	}
	s.writePortalAccount(w, r, tok, http.StatusCreated, a.ID, time.Now())
}

// portalUpdateAccount is PUT /v1/portal/accounts/{id}: the limits and concurrency of an
// account below the token's own (its own are what the seller gave it).
func (s *Server) portalUpdateAccount(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	var b portalAccountBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	id := r.PathValue("id")
	pol, e := s.within(tok, id)
	if e != nil {
		writeError(w, e)
		return
	}
	if b.ID != "" && b.ID != id || b.Kind != "" || b.Parent != "" {
		writeError(w, badRequest("invalid_body", "only limits and concurrency can be changed"))
		return
	}
	if id == tok.Account {
		writeError(w, &Error{Status: http.StatusForbidden, Code: "forbidden",
			Message: "a token cannot change its own account's limits: they are what the seller gave it"})
		return
	}
	parent := pol
	parent.Path = pol.Path[:len(pol.Path)-1]
	if e := s.bound(parent, b); e != nil {
		writeError(w, e)
		return
	}
	cur, err := s.cfg.Admin.GetAccount(r.Context(), id)
	if err != nil {
		s.adminError(w, "portal: read account", err)
		return
	}
	cur.Limits, cur.Concurrency = b.Limits, b.Concurrency
	if _, err := s.cfg.Admin.UpdateAccount(r.Context(), cur); err != nil {
		s.adminError(w, "portal: update account", err)
		return
	}
	s.writePortalAccount(w, r, tok, http.StatusOK, id, time.Now())
}

// bound checks b's limits against every level of parent's whole path: the seller's levels
// above the token's account too, for what the customer bought is at most what they allow.
func (s *Server) bound(parent policy.Resolved, b portalAccountBody) *Error {
	id := parent.Path[len(parent.Path)-1].Account
	full, err := s.cfg.Policies.Resolve(id)
	if err != nil {
		return notFound("account", id)
	}
	return beyond(full.Path, b.Limits, b.Concurrency)
}

// writePortalAccount answers a write with the account as GET shows it, once this node's
// policies hold the write (committed before since); if they do not within 2 s, the
// account as stored, without its levels.
func (s *Server) writePortalAccount(w http.ResponseWriter, r *http.Request, tok customer.Token, code int, id string, since time.Time) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	fresh := s.cfg.Policies.WaitFresh(ctx, since) == nil
	cancel()
	if fresh {
		if pol, e := s.within(tok, id); e == nil {
			if v, e := s.portalAccountView(r.Context(), tok, pol); e == nil {
				writeJSON(w, code, v)
				return
			}
		}
	}
	a, err := s.cfg.Admin.GetAccount(r.Context(), id)
	if err != nil {
		s.adminError(w, "portal: read account", err)
		return
	}
	writeJSON(w, code, portalAccount{Account: portalNode{ID: a.ID, Kind: a.Kind, Parent: a.Parent, Plan: a.Plan,
		Limits: a.Limits, Concurrency: a.Concurrency}, Remaining: map[policy.Unit]int64{}, Writable: tok.Has(customer.AccountsWrite)})
}
