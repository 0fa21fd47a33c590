package admission

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/pkg/event"
	"github.com/metergate/metergate/pkg/period"
	"github.com/metergate/metergate/pkg/policy"
)

// An alert entry of the outbox (lua/admit.lua, "Alerts") is the crossing request's compact
// usage event up to its period, then six fields:
//
//	<the 13 fields of a compact usage event>|<account>:<unit>|<spec>|<at>|<value>|<window>|<admitted>
//
// spec names the threshold ("p80", "b5000", "bp20": policy.Alert.Spec), at is it in units,
// value the counter or balance, window the counter's period label (quotas) or the arming
// grant (balances), admitted 1 or 0. The relay renders it as a usage.threshold event.
const alertFields = compactFields + 6

// alertKinds maps a spec's prefix to its rule's kind.
var alertKinds = map[string]policy.AlertKind{"p": policy.QuotaPercent, "b": policy.BalanceBelow, "bp": policy.BalancePercent}

// ThresholdID is the event id of a threshold fired for account and unit in window (a period
// label, or the arming grant): "alert/<account>/<unit>/<spec>/<window>". Firing it again
// gives the same id, which the meter keeps once.
func ThresholdID(account, unit, spec, window string) string {
	return "alert/" + account + "/" + unit + "/" + spec + "/" + window
}

// renderAlert renders an alert entry as its usage.threshold CloudEvent; it returns the org,
// the Kafka key.
func renderAlert(e string) (org string, value []byte, err error) {
	f := strings.Split(e, "|")
	if len(f) != alertFields {
		return "", nil, fmt.Errorf("alert entry of %d fields, want %d", len(f), alertFields)
	}
	if f[0] != compactVersion {
		return "", nil, fmt.Errorf("version %q", f[0])
	}
	org = unescape(f[7])
	levels, sec, usec, err := compactStamp(f[9:13])
	if err != nil {
		return "", nil, err
	}
	path := make([]event.PathNode, len(levels))
	for i, lv := range levels {
		path[i] = event.PathNode{Account: lv.Account, Kind: string(lv.Kind)}
	}
	account, unit, ok := strings.Cut(f[13], ":")
	at := slices.IndexFunc(path, func(n event.PathNode) bool { return n.Account == account })
	if !ok || at < 0 || !policy.ValidID(account) {
		return "", nil, fmt.Errorf("alert account %q not in the path", f[13])
	}
	if !policy.Unit(unit).Valid() {
		return "", nil, fmt.Errorf("alert unit %q", unit)
	}
	spec := f[14]
	digits := strings.TrimLeft(spec, "bp")
	kind, known := alertKinds[spec[:len(spec)-len(digits)]]
	threshold, err := strconv.ParseInt(digits, 10, 64)
	if !known || err != nil || threshold <= 0 {
		return "", nil, fmt.Errorf("alert threshold %q", spec)
	}
	units, err1 := strconv.ParseInt(f[15], 10, 64)
	val, err2 := strconv.ParseInt(f[16], 10, 64)
	if err1 != nil || err2 != nil || units <= 0 || val < 0 {
		return "", nil, fmt.Errorf("alert at %q, value %q", f[15], f[16])
	}
	d := event.Threshold{Org: org, Account: account, Path: path[:at+1], Unit: unit, Kind: string(kind),
		Threshold: threshold, At: units, Value: val, Period: f[12], EventID: unescape(f[1]), Admitted: f[18] == "1"}
	window := f[17]
	if kind == policy.QuotaPercent {
		if _, err := period.Parse(window); err != nil {
			return "", nil, fmt.Errorf("alert period %q", window)
		}
		d.Period = window
	} else {
		if !event.ValidGrantID(window) {
			return "", nil, fmt.Errorf("alert grant %q", window)
		}
		d.Grant = window
	}
	if f[18] != "1" && f[18] != "0" {
		return "", nil, fmt.Errorf("alert admitted %q", f[18])
	}
	ce, err := event.New(ThresholdID(account, unit, spec, window), unescape(f[2]), event.TypeThreshold,
		event.Subject(d.Path), time.Unix(sec, usec*1000), d)
	if err != nil {
		return "", nil, err
	}
	out, err := json.Marshal(ce)
	return org, out, err
}
