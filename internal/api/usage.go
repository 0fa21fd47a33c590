package api

import (
	"net/http"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
)

// usageReply is the answer of GET /v1/usage/{account}: per unit with a quota, what the
// account used of it this period and what remains.
type usageReply struct {
	Account string                      `json:"account"`
	Org     string                      `json:"org"`
	Period  string                      `json:"period"`
	Units   map[policy.Unit]usageOfUnit `json:"units"`
}

type usageOfUnit struct {
	Used      int64  `json:"used"`
	Quota     int64  `json:"quota"`
	Remaining int64  `json:"remaining"`
	Period    string `json:"period"`
}

// usage is GET /v1/usage/{account}, read from the quota counters in Redis.
func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("account")
	if !policy.ValidID(id) {
		writeError(w, badRequest("invalid_account", "account must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit"))
		return
	}
	pol, err := s.cfg.Policies.Resolve(id)
	if err != nil {
		writeError(w, &Error{Status: 404, Code: "not_found", Message: "account " + id + " does not exist"})
		return
	}
	used, err := s.cfg.Decider.Usage(r.Context(), pol)
	if err != nil {
		s.cfg.Log.Warn("read usage", "account", id, "err", err)
		w.Header().Set("Retry-After", retryAfterSeconds(s.cfg.RedisDownRetryAfter))
		writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "usage cannot be read right now; retry later"})
		return
	}
	reply := usageReply{Account: id, Org: pol.Org, Units: make(map[policy.Unit]usageOfUnit, len(used))}
	for u, v := range used {
		reply.Units[u] = usageOfUnit{Used: v.Used, Quota: v.Quota, Remaining: v.Remaining, Period: v.Period}
		reply.Period = v.Period[:len(period.MonthLayout)] // the billing month, also of daily quotas
	}
	if reply.Period == "" {
		reply.Period = period.MonthLabel(s.cfg.Clock.Now())
	}
	writeJSON(w, http.StatusOK, reply)
}
