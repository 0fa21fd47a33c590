package admission

import (
	"encoding/json"
	"sort"
	"strconv"

	"github.com/metergate/metergate/pkg/event"
	"github.com/metergate/metergate/pkg/policy"
)

// The script stamps each event with Redis TIME and the period it charged, so Go sends the
// CloudEvent JSON in pieces around those two values: head + time + middle + period + tail.

func quote(s string) string {
	b, _ := json.Marshal(s) // a string always encodes
	return string(b)
}

// envelopeHead is a CloudEvent's JSON up to the opening quote of its time.
func envelopeHead(id, source, typ, subject string) string {
	return `{"specversion":"1.0","id":` + quote(id) + `,"source":` + quote(source) + `,"type":` + quote(typ) +
		`,"subject":` + quote(subject) + `,"time":"`
}

const envelopeData = `","datacontenttype":"application/json","data":`

// Admitted is the data of r's usage.admitted event, charged to period ("YYYY-MM"). The
// admission script and the fail-open path (pkg/api) both record it.
func (r Request) Admitted(period string) event.Admitted {
	pol := r.Policy
	path := make([]event.PathNode, len(pol.Path))
	for i, lv := range pol.Path {
		path[i] = event.PathNode{Account: lv.Account, Kind: string(lv.Kind)}
	}
	return event.Admitted{
		Org: pol.Org, Account: pol.Account(), Path: path, APIKeyID: r.APIKeyID,
		IdempotencyKey: r.IdempotencyKey, Units: unitMap(r.Units), Period: period, Plan: pol.Plan, Tool: r.Tool,
	}
}

// unitMap is units keyed by their names, as events carry them.
func unitMap(units map[policy.Unit]int64) map[string]int64 {
	out := make(map[string]int64, len(units))
	for u, v := range units {
		out[string(u)] = v
	}
	return out
}

// admittedEvent returns the usage.admitted event of r in three pieces, built by hand from
// the pieces of r's policy derived once (eventStatic): this runs for every decision. The
// bytes are those of encoding/json for Request.Admitted (TestAdmittedEventIsJSON).
func admittedEvent(r Request, st *eventStatic) (head, middle, tail string) {
	b := make([]byte, 0, 256+len(st.data))
	b = append(b, `{"specversion":"1.0","id":`...)
	b = appendQuoted(b, r.EventID)
	b = append(b, `,"source":`...)
	b = appendQuoted(b, r.Source)
	b = append(b, st.typeSubject...)
	head = string(b)

	b = append(b[:0], envelopeData...)
	b = append(b, st.data...)
	if r.APIKeyID != "" {
		b = appendQuoted(append(b, `,"api_key_id":`...), r.APIKeyID)
	}
	if r.IdempotencyKey != "" {
		b = appendQuoted(append(b, `,"idempotency_key":`...), r.IdempotencyKey)
	}
	b = append(b, `,"units":{`...)
	names := make([]string, 0, len(r.Units))
	for u := range r.Units {
		names = append(names, string(u))
	}
	sort.Strings(names) // as encoding/json orders a map's keys
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendQuoted(b, name)
		b = strconv.AppendInt(append(b, ':'), r.Units[policy.Unit(name)], 10)
	}
	b = append(b, `},"period":"`...)
	middle = string(b)

	b = append(b[:0], '"')
	b = append(b, st.plan...)
	if r.Tool != "" {
		b = appendQuoted(append(b, `,"tool":`...), r.Tool)
	}
	b = append(b, "}}"...)
	tail = string(b)
	return head, middle, tail
}

// eventStatic is what a policy's usage.admitted events share.
type eventStatic struct {
	typeSubject string // `,"type":…,"subject":…,"time":"`
	data        string // `{"org":…,"account":…,"path":[…]`
	plan        string // `,"plan":…`
}

func newEventStatic(pol policy.Resolved) eventStatic {
	a := Request{Policy: pol}.Admitted("")
	path, _ := json.Marshal(a.Path) // account ids and kinds always encode
	return eventStatic{
		typeSubject: `,"type":` + quote(event.TypeAdmitted) + `,"subject":` + quote(event.Subject(a.Path)) + `,"time":"`,
		data:        `{"org":` + quote(a.Org) + `,"account":` + quote(a.Account) + `,"path":` + string(path),
		plan:        `,"plan":` + quote(a.Plan),
	}
}

// appendQuoted appends s as encoding/json writes a string: the identifiers, keys and tool
// names of an event are printable ASCII, which needs no escape but for " and \ and, as
// encoding/json does by default, <, > and &; anything else goes through encoding/json.
func appendQuoted(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return append(b, quote(s)...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
