package api

import (
	"encoding/json"
	"net/http"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
)

// MaxAmendmentBodyBytes bounds the body of POST /v1/admin/amendments: invoice.MaxAmendEvents
// event ids of maxAmendEventID bytes, each quoted and followed by a comma, and room for the
// rest (MaxBodyBytes).
const MaxAmendmentBodyBytes = invoice.MaxAmendEvents*(maxAmendEventID+3) + MaxBodyBytes

// maxAmendEventID is the longest event id an amendment names, in bytes: the longest the
// meter records (invoice.MaxEventID).
const maxAmendEventID = invoice.MaxEventID

// amendmentBody is the body of POST /v1/admin/amendments: the events (event_ids, or the
// filter org, period and account), what to do to them, why, and how to settle it.
type amendmentBody struct {
	EventIDs []string                   `json:"event_ids"`
	Org      string                     `json:"org"`
	Period   string                     `json:"period"`
	Account  string                     `json:"account"`
	Action   string                     `json:"action"`
	Units    map[string]json.RawMessage `json:"units"`
	Reason   string                     `json:"reason"`
	Settle   string                     `json:"settle"`
}

// amendment reads b as invoice.Amend takes it (By is the caller's to set), checking what the API's
// codes name (invalid_event_id, invalid_org, invalid_account, invalid_period, the units')
// and what Amend would read otherwise (an empty list of events, a void with no unit). The
// rest is Amend's to check, before it reads anything (events or a filter, not both; the
// action, settle and reason: invalid_amendment, invalid_reason) or against the database.
func (b amendmentBody) amendment() (invoice.Amendment, *Error) {
	a := invoice.Amendment{EventIDs: b.EventIDs, Org: b.Org, Account: b.Account, Action: b.Action, Reason: b.Reason,
		Settle: b.Settle}
	if b.EventIDs != nil && (len(b.EventIDs) == 0 || len(b.EventIDs) > invoice.MaxAmendEvents) {
		// Amend reads an empty list as none, and would take the filter beside it.
		return a, badRequest("invalid_amendment", "event_ids lists 1 to %d events, not %d (more: several amendments, or a filter)",
			invoice.MaxAmendEvents, len(b.EventIDs))
	}
	for _, id := range b.EventIDs {
		if !validEventID(id) {
			return a, badRequest("invalid_event_id", "event id %.220q: 1 to %d printable ASCII characters without spaces, as recorded",
				id, maxAmendEventID)
		}
	}
	if b.Org != "" && !policy.ValidID(b.Org) {
		return a, badRequest("invalid_org", "org must be an account id: 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
	}
	if b.Account != "" && !policy.ValidID(b.Account) {
		return a, badRequest("invalid_account", "account must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
	}
	if b.Period != "" {
		month, err := period.ParseMonth(b.Period)
		if err != nil {
			return a, badRequest("invalid_period", "period must be a month, YYYY-MM")
		}
		a.Period = month
	}
	if b.Units != nil {
		if b.Action == invoice.AmendVoid { // {} too, which Amend reads as none
			return a, badRequest("invalid_amendment", "a void sets no units: leave units out")
		}
		units, e := decodeUnits(b.Units)
		if e != nil {
			return a, e
		}
		a.Units = make(map[string]int64, len(units))
		for u, n := range units {
			a.Units[string(u)] = n
		}
	}
	return a, nil
}

// validEventID reports whether id can be a recorded event's id: the meter records only
// printable ASCII without spaces, and an amendment names at most maxAmendEventID bytes.
func validEventID(id string) bool {
	if id == "" || len(id) > maxAmendEventID {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

func (s *Server) amend(w http.ResponseWriter, r *http.Request, store Invoices) {
	var b amendmentBody
	if _, e := decodeJSONMax(r.Body, &b, MaxAmendmentBodyBytes); e != nil {
		writeError(w, e)
		return
	}
	a, e := b.amendment()
	a.By = actor(r)
	if e != nil {
		writeError(w, e)
		return
	}
	am, err := store.Amend(r.Context(), a)
	if err != nil {
		s.invoiceError(w, "amend", err)
		return
	}
	writeJSON(w, http.StatusCreated, am)
}
