package admission

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/metergate/metergate/pkg/event"
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

// admittedEvent returns the usage.admitted event of r in three pieces.
func admittedEvent(r Request) (head, middle, tail string) {
	pol := r.Policy
	path := make([]event.PathNode, len(pol.Path))
	for i, lv := range pol.Path {
		path[i] = event.PathNode{Account: lv.Account, Kind: string(lv.Kind)}
	}
	units := make(map[string]int64, len(r.Units))
	for u, v := range r.Units {
		units[string(u)] = v
	}
	data, err := json.Marshal(event.Admitted{
		Org: pol.Org, Account: pol.Account(), Path: path, APIKeyID: r.APIKeyID,
		IdempotencyKey: r.IdempotencyKey, Units: units, Period: periodMark, Plan: pol.Plan, Tool: r.Tool,
	})
	i := bytes.Index(data, periodNeedle)
	if err != nil || i < 0 {
		// Only a change to event.Admitted can get here; every test would catch it.
		panic(fmt.Sprintf("admission: cannot place the period in %s: %v", data, err))
	}
	head = envelopeHead(r.EventID, r.Source, event.TypeAdmitted, event.Subject(path))
	middle = envelopeData + string(data[:i]) + `"period":"`
	tail = string(data[i+len(periodNeedle)-1:]) + "}"
	return head, middle, tail
}
