// Package reconcile corrects the Redis quota counters that admission charges from the
// billing log in PostgreSQL. Each correction is recorded as a row of adjustments, applied to
// Redis exactly once (lua/adjust.lua writes a marker key named after the row in the same
// script as the counter change), then marked applied. A run that dies anywhere is finished
// by the next one, and a run right after a clean one applies nothing.
//
// Monthly counters are corrected for the open months (the run's and the one before), daily
// counters for the open days (the run's and the one before).
package reconcile

import (
	"errors"

	"github.com/metergate/metergate/internal/policy"
)

// Kind is the kind of a correction.
type Kind string

// The kinds of correction, in the order a run computes them.
const (
	// PeriodMove moves usage charged to another month than its event time's: minus from
	// the charged month's counter, plus to the event time's.
	PeriodMove Kind = "period_move"
	// Refund5xx gives back the quota of a request whose outcome was a 5xx.
	Refund5xx Kind = "refund_5xx"
	// RefundVoid gives back the quota of a request that no caller was told 200 for
	// (usage_voids): admit answered 503 after an unknown outcome, or the caller hung up.
	RefundVoid Kind = "refund_void"
	// SettleTokens replaces estimated units by the actual ones an outcome reported.
	SettleTokens Kind = "settle_tokens"
	// DriftRestore raises a counter found below PostgreSQL's billable total.
	DriftRestore Kind = "drift_restore"
)

// ErrRunning is returned when another run holds the run lock.
var ErrRunning = errors.New("another reconcile run is in progress")

// ErrInvariant is returned, with the summary, when a run finished but the checks after it
// failed (Summary.InvariantFailures lists them).
var ErrInvariant = errors.New("reconcile invariant check failed")

// Policies resolves an account's effective policy (a *policy.Cache).
type Policies interface {
	Resolve(account string) (policy.Resolved, error)
}

// Adjustment is one correction of one quota counter.
type Adjustment struct {
	ID      int64       `json:"id,omitempty"`
	Kind    Kind        `json:"kind"`
	Org     string      `json:"org"`
	Account string      `json:"account"`
	Level   policy.Kind `json:"level"`
	Unit    policy.Unit `json:"unit"`
	// QuotaPeriod is the window of the counter: month (Period is YYYY-MM) or day (YYYY-MM-DD).
	QuotaPeriod policy.QuotaPeriod `json:"quota_period"`
	Period      string             `json:"period"`
	Amount      int64              `json:"amount"`
	Reason      string             `json:"reason"`
	SourceEvent string             `json:"source_event,omitempty"`
}

// quotas lists the units that a level counts with a quota counter of window q (capped or
// not: admission charges the counter of every limit with a quota).
func quotas(lv policy.Level, q policy.QuotaPeriod) []policy.Unit {
	var units []policy.Unit
	for _, u := range policy.Units {
		l, ok := lv.Limits[u]
		if ok && l.Quota != nil && (l.QuotaPeriod == q || l.QuotaPeriod == "" && q == policy.Month) {
			units = append(units, u)
		}
	}
	return units
}

func unitIndex(u policy.Unit) int {
	for i, v := range policy.Units {
		if v == u {
			return i
		}
	}
	return -1
}
