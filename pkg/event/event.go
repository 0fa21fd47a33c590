// Package event defines metergate's usage events as they travel on Kafka: CloudEvents 1.0
// in structured JSON mode, one per admitted request, one per reported outcome, one per
// voided request and one per usage threshold crossed. It is the schema a consumer of the
// topic imports; how the events are written on their way there is internal/wire's.
package event

import (
	"encoding/json"
	"fmt"
	"time"
)

// Event types.
const (
	TypeAdmitted  = "io.metergate.usage.admitted.v1"
	TypeOutcome   = "io.metergate.usage.outcome.v1"
	TypeVoided    = "io.metergate.usage.voided.v1"
	TypeThreshold = "io.metergate.usage.threshold.v1"
)

// VoidSuffix makes a usage.voided event's id from the id of the event it voids.
const VoidSuffix = "/void"

// Reasons a request was voided.
const (
	// VoidUnavailable: admit answered 503 after a script call whose outcome it does not
	// know (timed out after it was sent, or the connection broke).
	VoidUnavailable = "unavailable"
	// VoidCallerGone: the caller hung up before it was answered.
	VoidCallerGone = "caller_gone"
)

// PathNode is one level of the account path an event was charged to.
type PathNode struct {
	Account string `json:"account"`
	Kind    string `json:"kind"`
}

// Admitted is the data of a usage.admitted event.
type Admitted struct {
	Org            string           `json:"org"`
	Account        string           `json:"account"`
	Path           []PathNode       `json:"path"`
	APIKeyID       string           `json:"api_key_id,omitempty"`
	IdempotencyKey string           `json:"idempotency_key,omitempty"`
	Units          map[string]int64 `json:"units"`
	// Period is the billing period whose quota counters were charged ("YYYY-MM").
	Period string `json:"period"`
	Plan   string `json:"plan"`
	Tool   string `json:"tool,omitempty"`
	// Borrowed lists the rate capacity accounts of Path took from their parents beyond
	// their guaranteed rate (a limit's ceiling), in the order the admission script recorded
	// it; empty when nothing was borrowed (always on the fail-open path).
	Borrowed []Borrowing `json:"borrowed,omitempty"`
	// Credits lists what the request drew from the credit grants (prepaid balances) of the
	// accounts of Path, in the order the admission script drew them; empty when it drew
	// nothing (always on the fail-open path).
	Credits []CreditDraw `json:"credits,omitempty"`
	// ShadowRefusal is, for a request admitted in shadow mode that a limit would have
	// refused, the refusal: "rate_limited", "quota_exceeded" or "insufficient_balance".
	ShadowRefusal string `json:"shadow_refusal,omitempty"`
	// FailOpen marks an admission decided without Redis (rate-only accounts while Redis was
	// unavailable); its period comes from the admit node's clock.
	FailOpen bool `json:"fail_open,omitempty"`
}

// Borrowing is one account's borrowing for an admitted request: Units of Unit taken from
// the spare rate capacity of its parent From (the node before Account in the path) beyond
// Account's own guaranteed rate. It is rate capacity at admission: refunds and settlements
// of quota do not change it.
type Borrowing struct {
	Account string `json:"account"`
	From    string `json:"from"`
	Unit    string `json:"unit"`
	Units   int64  `json:"units"`
}

// CreditDraw is what an admitted request drew from one credit grant: Units of Unit from
// the grant Grant of Account (an account of the path, the org included). It is what the
// admission took: refunds and settlements are reconcile's, not the event's.
type CreditDraw struct {
	Account string `json:"account"`
	Unit    string `json:"unit"`
	Grant   string `json:"grant"`
	Units   int64  `json:"units"`
}

// ValidGrantID reports whether s is a credit grant id: "gr_" and 32 lowercase hex digits
// (credit_grants.id's check). The relay and the meter refuse draws from anything else.
func ValidGrantID(s string) bool {
	if len(s) != 3+32 || s[:3] != "gr_" {
		return false
	}
	for i := 3; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Threshold is the data of a usage.threshold event: an alert rule's threshold crossed by an
// admission (docs/alerts.md). The admission script fires it in the call that crosses it,
// once per threshold and period (quotas) or per arming grant (balances); its event id
// names the threshold, so a redelivery is the same event.
type Threshold struct {
	Org     string     `json:"org"`
	Account string     `json:"account"`
	Path    []PathNode `json:"path"` // org first, down to Account
	Unit    string     `json:"unit"`
	// Kind is the rule's: quota_percent, balance_below or balance_percent.
	Kind string `json:"kind"`
	// Threshold is as the rule names it (a percentage, or an amount for balance_below); At
	// is it in units when it fired.
	Threshold int64 `json:"threshold"`
	At        int64 `json:"at"`
	// Value is the quota counter after the request (before it when the quota refused it),
	// or the balance after it.
	Value int64 `json:"value"`
	// Period is the counter's period ("YYYY-MM", or "YYYY-MM-DD" for a daily quota); for
	// balances, the month the request was charged to.
	Period string `json:"period"`
	// Grant is, for balances, the latest grant of the account and unit when it fired: a
	// later grant (a top-up) re-arms the threshold.
	Grant string `json:"grant,omitempty"`
	// EventID is the request that crossed the threshold; Admitted is false when the quota
	// refused it (a 100 % threshold fires with the first refusal).
	EventID  string `json:"event_id"`
	Admitted bool   `json:"admitted"`
}

// Outcome is the data of a usage.outcome event: how the admitted request ended upstream.
type Outcome struct {
	EventID string           `json:"event_id"`
	Status  int              `json:"status"`
	Units   map[string]int64 `json:"units,omitempty"` // actual units, e.g. tokens used
}

// Voided is the data of a usage.voided event: no caller was told the decision of the
// admitted request EventID, so it bills nothing (reconcile refunds what it charged).
// Attempt is the event id of the request that was not answered (EventID itself, or a
// request that replayed it by its idempotency key).
type Voided struct {
	EventID string `json:"event_id"`
	Attempt string `json:"attempt"`
	Reason  string `json:"reason"`
}

// CloudEvent is a CloudEvents 1.0 envelope in structured JSON mode.
type CloudEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            time.Time       `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Data            json.RawMessage `json:"data"`
}

// New wraps data in an envelope.
func New(id, source, typ, subject string, t time.Time, data any) (CloudEvent, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return CloudEvent{}, fmt.Errorf("marshal %s data: %w", typ, err)
	}
	return CloudEvent{
		SpecVersion: "1.0", ID: id, Source: source, Type: typ, Subject: subject,
		Time: t.UTC(), DataContentType: "application/json", Data: raw,
	}, nil
}

// Subject is the account path as a CloudEvents subject: "acme/engineering/alice/agent-1".
func Subject(path []PathNode) string {
	s := ""
	for i, n := range path {
		if i > 0 {
			s += "/"
		}
		s += n.Account
	}
	return s
}

// ThresholdID is the event id of a threshold fired for account and unit in window (a period
// label, or the arming grant): "alert/<account>/<unit>/<spec>/<window>". Firing it again
// gives the same id, which the meter keeps once.
func ThresholdID(account, unit, spec, window string) string {
	return "alert/" + account + "/" + unit + "/" + spec + "/" + window
}
