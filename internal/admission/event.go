package admission

import (
	"encoding/json"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/pkg/event"
)

// The events Go writes for the scripts (voids, outcomes) are sent as CloudEvent JSON in
// pieces around Redis TIME, which the script stamps: head + time + rest. A usage.admitted
// event travels in its compact form (internal/wire: Compact, rendered by OutboxMessage).

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
// admission script and the fail-open path (internal/api) both record it.
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

// compactEvent returns r's compact usage event (internal/wire) up to the policy's fields,
// which the account's program holds (wire.CompactPolicy), for the script to complete.
func compactEvent(r Request) string {
	c := wire.Compact{EventID: r.EventID, Source: r.Source, APIKeyID: r.APIKeyID,
		IdempotencyKey: r.IdempotencyKey, Tool: r.Tool, Units: r.Units}
	return string(c.Append(make([]byte, 0, 128), ""))
}
