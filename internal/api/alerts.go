package api

import (
	"encoding/json"
	"net/http"

	"github.com/metergate/metergate/internal/policy"
)

// alertBody is the body of POST and PUT /v1/admin/alerts. Thresholds are read raw so that a
// fraction or a string is a 400 of its own.
type alertBody struct {
	Account    string            `json:"account"`
	Plan       string            `json:"plan"`
	Kind       string            `json:"kind"`
	Unit       string            `json:"unit"`
	Period     string            `json:"period"`
	Thresholds []json.RawMessage `json:"thresholds"`
}

func (b alertBody) rule(id string) (policy.AlertRule, *Error) {
	r := policy.AlertRule{ID: id, Account: b.Account, Plan: b.Plan, Alert: policy.Alert{
		Kind: policy.AlertKind(b.Kind), Unit: policy.Unit(b.Unit), Period: policy.QuotaPeriod(b.Period)}}
	for _, raw := range b.Thresholds {
		n, err := jsonInt(raw)
		if err != nil {
			return r, badRequest("invalid_thresholds", "thresholds must be whole numbers: percentages from 1 to 100, or amounts of units for balance_below")
		}
		r.Thresholds = append(r.Thresholds, n)
	}
	return r, nil
}

func (s *Server) createAlert(w http.ResponseWriter, r *http.Request) {
	var b alertBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	rule, e := b.rule("")
	if e != nil {
		writeError(w, e)
		return
	}
	out, err := s.cfg.Admin.CreateAlert(r.Context(), rule)
	if err != nil {
		s.adminError(w, "create alert rule", err)
		return
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) updateAlert(w http.ResponseWriter, r *http.Request) {
	var b alertBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	if b.Account != "" || b.Plan != "" {
		writeError(w, badRequest("invalid_owner", "a rule's account or plan cannot change: delete it and create another"))
		return
	}
	rule, e := b.rule(r.PathValue("id"))
	if e != nil {
		writeError(w, e)
		return
	}
	out, err := s.cfg.Admin.UpdateAlert(r.Context(), rule)
	if err != nil {
		s.adminError(w, "update alert rule", err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getAlert(w http.ResponseWriter, r *http.Request) {
	out, err := s.cfg.Admin.GetAlert(r.Context(), r.PathValue("id"))
	if err != nil {
		s.adminError(w, "get alert rule", err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listAlerts(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	account, plan := q.Get("account"), q.Get("plan")
	for name, v := range map[string]string{"account": account, "plan": plan} {
		if v != "" && !policy.ValidID(v) {
			writeError(w, badRequest("invalid_"+name, "%s must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit", name))
			return
		}
	}
	rules, err := s.cfg.Admin.Alerts(r.Context(), account, plan)
	if err != nil {
		s.adminError(w, "list alert rules", err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Alerts []policy.AlertRule `json:"alerts"`
	}{rules})
}

func (s *Server) deleteAlert(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Admin.DeleteAlert(r.Context(), r.PathValue("id")); err != nil {
		s.adminError(w, "delete alert rule", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
