package admission

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/metergate/metergate/pkg/event"
	"github.com/metergate/metergate/pkg/policy"
)

// The script stamps each event with Redis TIME and the period it charged, so Go sends the
// CloudEvent JSON in pieces around those two values: head + time + middle + period + tail.
// periodMark stands for the period while the data is encoded; it holds a NUL, which no
// field may hold (identifiers, idempotency keys and tools are validated printable ASCII),
// so it cannot be confused with data.
const periodMark = "\x00"

var periodNeedle = []byte(`"period":"\u0000"`)

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

// admittedEvent returns the usage.admitted event of r in three pieces.
func admittedEvent(r Request) (head, middle, tail string) {
	admitted := r.Admitted(periodMark)
	data, err := json.Marshal(admitted)
	i := bytes.Index(data, periodNeedle)
	if err != nil || i < 0 {
		// Only a change to event.Admitted can get here; every test would catch it.
		panic(fmt.Sprintf("admission: cannot place the period in %s: %v", data, err))
	}
	head = envelopeHead(r.EventID, r.Source, event.TypeAdmitted, event.Subject(admitted.Path))
	middle = envelopeData + string(data[:i]) + `"period":"`
	tail = string(data[i+len(periodNeedle)-1:]) + "}"
	return head, middle, tail
}
