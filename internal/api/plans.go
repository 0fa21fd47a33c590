package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
)

// planBody is the body of POST and PUT /v1/admin/plans.
type planBody struct {
	ID          string                        `json:"id"`
	Rank        *int                          `json:"rank"`
	Limits      map[policy.Unit]policy.Limit  `json:"limits"`
	Concurrency int                           `json:"concurrency"`
	Priority    int                           `json:"priority"`
	Shadow      bool                          `json:"shadow"`
	Price       *priceBody                    `json:"price"`
	Grants      map[policy.Unit]planGrantBody `json:"grants"`
}

// planGrantBody is a plan's recurring grant of a unit, its amount read from its raw JSON.
type planGrantBody struct {
	Amount   json.RawMessage `json:"amount"`
	Priority int             `json:"priority"`
}

// priceBody is a price version as written. Amounts and counts are read from their raw JSON
// so that 4900.5, 1e3 and "4900" are refused, not rounded or converted.
type priceBody struct {
	Currency        string                   `json:"currency"`
	BaseFeeMinor    json.RawMessage          `json:"base_fee_minor"`
	EffectivePeriod string                   `json:"effective_period"`
	Units           map[string]unitPriceBody `json:"units"`
}

type unitPriceBody struct {
	Included json.RawMessage `json:"included"`
	Tiers    []tierBody      `json:"tiers"`
}

type tierBody struct {
	From       json.RawMessage `json:"from"`
	UpTo       json.RawMessage `json:"up_to"`
	PriceMinor json.RawMessage `json:"price_minor"`
	PerUnits   json.RawMessage `json:"per_units"`
}

// wholeNumber reads a JSON integer of 0 or more written as one (no fraction, exponent or
// quotes); absent (or null) gives def, or an error when def is negative (required).
func wholeNumber(raw json.RawMessage, def int64) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		if def < 0 {
			return 0, fmt.Errorf("is required")
		}
		return def, nil
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("must be a whole number of 0 or more within int64, got %s", raw)
	}
	return n, nil
}

// price turns the body into the price version to add; the pricing rules themselves (tiers
// contiguous, currency shape, ...) are invoice.Plan.Validate's, applied by the store.
func (b *priceBody) price() (*invoice.Plan, *Error) {
	if b == nil {
		return nil, nil
	}
	p := &invoice.Plan{Currency: b.Currency}
	var err error
	if p.BaseFeeMinor, err = wholeNumber(b.BaseFeeMinor, 0); err != nil {
		return nil, badRequest("invalid_price_base_fee_minor", "price.base_fee_minor: %s", err.Error())
	}
	if b.EffectivePeriod != "" {
		if p.EffectivePeriod, err = period.ParseMonth(b.EffectivePeriod); err != nil {
			return nil, badRequest("invalid_price_effective_period", "price.effective_period: want the month as YYYY-MM, got %q", b.EffectivePeriod)
		}
	}
	for _, unit := range policy.Units { // in the units' order: a stable order for the lines
		u, ok := b.Units[string(unit)]
		if !ok {
			continue
		}
		up := invoice.UnitPrice{Unit: string(unit), Tiers: []invoice.Tier{}}
		if up.Included, err = wholeNumber(u.Included, 0); err != nil {
			return nil, badRequest("invalid_price_units", "price.units.%s.included: %s", unit, err.Error())
		}
		for i, t := range u.Tiers {
			var tier invoice.Tier
			for _, f := range []struct {
				name string
				raw  json.RawMessage
				def  int64
				dst  *int64
			}{{"from", t.From, -1, &tier.From}, {"up_to", t.UpTo, 0, &tier.UpTo}, {"price_minor", t.PriceMinor, -1, &tier.PriceMinor}, {"per_units", t.PerUnits, 1, &tier.PerUnits}} {
				if *f.dst, err = wholeNumber(f.raw, f.def); err != nil {
					return nil, badRequest("invalid_price_units", "price.units.%s.tiers[%d].%s: %s", unit, i, f.name, err.Error())
				}
			}
			if tier.UpTo == 0 && len(t.UpTo) > 0 && string(t.UpTo) != "null" { // 0 would read as "no end"
				return nil, badRequest("invalid_price_units", "price.units.%s.tiers[%d].up_to: must be above from, or left out for no end", unit, i)
			}
			up.Tiers = append(up.Tiers, tier)
		}
		p.Units = append(p.Units, up)
	}
	for name := range b.Units {
		if !policy.Unit(name).Valid() {
			return nil, badRequest("invalid_price_units", "price.units: unknown unit %q (want requests, tokens, credits or cost_micros)", name)
		}
	}
	return p, nil
}

// plan is the plan the body describes, id aside.
func (b planBody) plan(id string) (policy.Plan, *invoice.Plan, *Error) {
	if b.Rank == nil {
		return policy.Plan{}, nil, badRequest("invalid_rank", "rank is required: plans are ordered by rank, the lowest is the smallest")
	}
	price, e := b.Price.price()
	if e != nil {
		return policy.Plan{}, nil, e
	}
	var grants map[policy.Unit]policy.PlanGrant
	for u, g := range b.Grants {
		amount, err := wholeNumber(g.Amount, -1)
		if err != nil || amount == 0 {
			return policy.Plan{}, nil, badRequest("invalid_grants", "grants.%s.amount must be a whole number of units, at least 1", u)
		}
		if grants == nil {
			grants = map[policy.Unit]policy.PlanGrant{}
		}
		grants[u] = policy.PlanGrant{Amount: amount, Priority: g.Priority}
	}
	return policy.Plan{ID: id, Rank: *b.Rank, Limits: b.Limits, Concurrency: b.Concurrency, Priority: b.Priority, Grants: grants, Shadow: b.Shadow}, price, nil
}

type planReply struct {
	ID          string                       `json:"id"`
	Rank        int                          `json:"rank"`
	Limits      map[policy.Unit]policy.Limit `json:"limits"`
	Concurrency int                          `json:"concurrency"`
	Priority    int                          `json:"priority"`
	Prices      []priceReply                 `json:"prices"`
	// Grants are the plan's recurring credit grants, per unit (docs/credits.md).
	Grants map[policy.Unit]policy.PlanGrant `json:"grants,omitempty"`
	Shadow bool                             `json:"shadow,omitempty"`
	// CurrentPriceVersion is the version that prices the current month; left out when the
	// plan has no price.
	CurrentPriceVersion int `json:"current_price_version,omitempty"`
}

type priceReply struct {
	Version         int                       `json:"version"`
	EffectivePeriod string                    `json:"effective_period,omitempty"` // left out: from the start
	Currency        string                    `json:"currency"`
	BaseFeeMinor    int64                     `json:"base_fee_minor"`
	Units           map[string]unitPriceReply `json:"units"`
	CreatedAt       time.Time                 `json:"created_at"`
}

type unitPriceReply struct {
	Included int64       `json:"included"`
	Tiers    []tierReply `json:"tiers"`
}

type tierReply struct {
	From       int64  `json:"from"`
	UpTo       *int64 `json:"up_to,omitempty"` // left out: no end
	PriceMinor int64  `json:"price_minor"`
	PerUnits   int64  `json:"per_units"`
}

func (s *Server) planReply(p policy.Plan) planReply {
	out := planReply{ID: p.ID, Rank: p.Rank, Limits: p.Limits, Concurrency: p.Concurrency, Priority: p.Priority, Prices: []priceReply{},
		Grants: p.Grants, Shadow: p.Shadow}
	if out.Limits == nil {
		out.Limits = map[policy.Unit]policy.Limit{}
	}
	for _, v := range p.Prices {
		r := priceReply{Version: v.Version, Currency: v.Currency, BaseFeeMinor: v.BaseFeeMinor, Units: map[string]unitPriceReply{}, CreatedAt: v.CreatedAt}
		if !v.EffectivePeriod.IsZero() {
			r.EffectivePeriod = period.MonthLabel(v.EffectivePeriod)
		}
		for _, up := range v.Units {
			u := unitPriceReply{Included: up.Included, Tiers: []tierReply{}}
			for _, t := range up.Tiers {
				tr := tierReply{From: t.From, PriceMinor: t.PriceMinor, PerUnits: t.PerUnits}
				if t.UpTo != 0 {
					tr.UpTo = &t.UpTo
				}
				u.Tiers = append(u.Tiers, tr)
			}
			r.Units[up.Unit] = u
		}
		out.Prices = append(out.Prices, r)
	}
	if cur, ok := invoice.VersionAt(p.Prices, period.MonthStart(s.cfg.Clock.Now())); ok {
		out.CurrentPriceVersion = cur.Version
	}
	return out
}

func (s *Server) createPlan(w http.ResponseWriter, r *http.Request) {
	var b planBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	p, price, e := b.plan(b.ID)
	if e != nil {
		writeError(w, e)
		return
	}
	out, err := s.cfg.Admin.CreatePlan(r.Context(), p, price)
	if err != nil {
		s.adminError(w, "create plan", err)
		return
	}
	writeJSON(w, http.StatusCreated, s.planReply(out))
}

func (s *Server) updatePlan(w http.ResponseWriter, r *http.Request) {
	var b planBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	id := r.PathValue("id")
	if b.ID != "" && b.ID != id {
		writeError(w, badRequest("invalid_id", "the body's id %q differs from the path's %q", b.ID, id))
		return
	}
	p, price, e := b.plan(id)
	if e != nil {
		writeError(w, e)
		return
	}
	out, err := s.cfg.Admin.UpdatePlan(r.Context(), p, price)
	if err != nil {
		s.adminError(w, "update plan", err)
		return
	}
	writeJSON(w, http.StatusOK, s.planReply(out))
}

func (s *Server) getPlan(w http.ResponseWriter, r *http.Request) {
	p, err := s.cfg.Admin.GetPlan(r.Context(), r.PathValue("id"))
	if err != nil {
		s.adminError(w, "get plan", err)
		return
	}
	writeJSON(w, http.StatusOK, s.planReply(p))
}

func (s *Server) listPlans(w http.ResponseWriter, r *http.Request) {
	plans, err := s.cfg.Admin.Plans(r.Context())
	if err != nil {
		s.adminError(w, "list plans", err)
		return
	}
	out := struct {
		Plans []planReply `json:"plans"`
	}{Plans: make([]planReply, 0, len(plans))}
	for _, p := range plans {
		out.Plans = append(out.Plans, s.planReply(p))
	}
	writeJSON(w, http.StatusOK, out)
}
