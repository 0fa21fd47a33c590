package api

import (
	"errors"
	"net/http"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/keyspace"
)

// outcome is POST /v1/outcomes: what became of an admitted request (its status, the
// units it really used), recorded as an outcome event that corrects its charge.
func (s *Server) outcome(w http.ResponseWriter, r *http.Request) {
	id, status, units, e := parseOutcome(r.Body)
	if e != nil {
		writeError(w, e)
		return
	}
	err := s.cfg.Decider.Outcome(r.Context(), admission.Outcome{EventID: id, Status: status, Units: units, Source: s.cfg.Source})
	switch {
	case errors.Is(err, keyspace.ErrUnknownEvent):
		writeError(w, badRequest("invalid_event_id", "event_id %q was not issued by admit", id))
	case err != nil:
		s.cfg.Log.Warn("record outcome", "event_id", id, "err", err)
		w.Header().Set("Retry-After", retryAfterSeconds(s.cfg.RedisDownRetryAfter))
		writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "the outcome cannot be recorded right now; retry later"})
	default:
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "accepted", "event_id": id})
	}
}
