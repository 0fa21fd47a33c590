// Package wire is the usage event on its way from a decision to the billing log: the
// compact form admission writes and the script completes in the Redis outbox (compact.go),
// the relay's rendering of an outbox entry as the CloudEvent JSON of pkg/event (render.go,
// batch.go) and the meter's fast decoder of that JSON (decode.go). The three are kept in
// step by FuzzRoundTrip.
package wire

import (
	"sort"
	"strconv"
	"strings"

	"github.com/metergate/metergate/internal/policy"
)

// The outbox entry of a usage.admitted event is compact (about 200 bytes against the
// CloudEvent's 600): the admission script appends one field, "e", and the relay renders
// the CloudEvent JSON from it (OutboxMessage), byte for byte what encoding/json writes of
// the event. Fields are separated by "|"; the free-form ones (event id, source, API key id,
// idempotency key, tool, org, plan) are escaped ("%" → "%25", "|" → "%7C"):
//
//	1|<event id>|<source>|<api key id>|<idempotency key>|<tool>|<units>|<org>|<plan>|<path>|<sec>|<usec>|<period>
//
//	1|…|<period>|<borrowed>
//	1|…|<period>|<borrowed>|<credits>
//	1|…|<period>|<borrowed>|<credits>|<refusal>
//
// units: "<unit>=<n>,…" sorted; path: "<account>:<kind>/…" org first; sec and usec: Redis
// TIME; period: the month charged. Go writes up to the path and its "|" (Compact); the
// script appends the last three, and a fourteenth field when accounts borrowed capacity
// from their parents beyond their guaranteed rate (a limit's ceiling): borrowed is
// "<account>:<unit>=<n>,…", an account of the path other than the org (its lender is the
// node before it), a unit's full name and n > 0, each account and unit at most once. An
// entry of 13 fields, or an empty fourteenth, borrowed nothing. A fifteenth field lists
// what the request drew from credit grants (the fourteenth then may be empty): credits is
// "<account>:<unit>:<grant id>=<n>,…" in the order drawn, an account of the path (the org
// included), a unit's full name, a grant id ("gr_" and 32 lowercase hex digits) and n > 0,
// each grant at most once. An entry of 13 or 14 fields, or an empty fifteenth, drew
// nothing. A sixteenth field, when there is one, is the refusal shadow mode let pass
// ("rate_limited", "quota_exceeded" or "insufficient_balance"). Entries of other shapes
// (void.lua's, and admitted events written by earlier versions) carry the Kafka key in "k"
// and the CloudEvent JSON in "v"; alert entries carry theirs in "a" (render.go).
const compactVersion = "1"

// compactFields is the number of fields of a compact entry without borrowings or credit
// draws; one with borrowings has one more, one with credit draws two more, one with a
// shadow refusal three more.
const compactFields = 13

// Compact is a request as its compact usage event records it.
type Compact struct {
	EventID, Source, APIKeyID, IdempotencyKey, Tool string
	Units                                           map[policy.Unit]int64
}

// Append appends c's compact usage event up to its time: the request's fields, then
// policyFields (CompactPolicy's, or "" when the script holds them). The admission script
// appends "<sec>|<usec>|<period>" and what the request borrowed and drew.
func (c Compact) Append(b []byte, policyFields string) []byte {
	b = append(b, compactVersion+"|"...)
	for _, f := range [...]string{c.EventID, c.Source, c.APIKeyID, c.IdempotencyKey, c.Tool} {
		b = appendEscaped(b, f)
		b = append(b, '|')
	}
	b = appendUnits(b, c.Units)
	b = append(b, '|')
	return append(b, policyFields...)
}

// appendUnits appends "<unit>=<n>,…" sorted by name.
func appendUnits(b []byte, units map[policy.Unit]int64) []byte {
	names := make([]string, 0, len(units))
	for u := range units {
		names = append(names, string(u))
	}
	sort.Strings(names)
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, name...)
		b = strconv.AppendInt(append(b, '='), units[policy.Unit(name)], 10)
	}
	return b
}

// CompactPolicy returns the fields of pol that its compact usage events share:
// "<org>|<plan>|<path>|".
func CompactPolicy(pol policy.Resolved) string {
	b := appendEscaped(nil, pol.Org)
	b = appendEscaped(append(b, '|'), pol.Plan)
	b = append(b, '|')
	for i, lv := range pol.Path {
		if i > 0 {
			b = append(b, '/')
		}
		b = append(b, lv.Account...)
		b = append(b, ':')
		b = append(b, lv.Kind...)
	}
	return string(append(b, '|'))
}

func appendEscaped(b []byte, s string) []byte {
	if !strings.ContainsAny(s, "%|") {
		return append(b, s...)
	}
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '%':
			b = append(b, "%25"...)
		case '|':
			b = append(b, "%7C"...)
		default:
			b = append(b, s[i])
		}
	}
	return b
}

func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	return strings.NewReplacer("%7C", "|", "%25", "%").Replace(s)
}
