package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/pkg/event"
)

// ErrMalformedEntry is returned by OutboxMessage for an entry it cannot read.
var ErrMalformedEntry = errors.New("malformed outbox entry")

// OutboxMessage returns the Kafka key and value of an outbox stream entry: a compact
// usage event ("e", compact.go) rendered as its CloudEvent JSON, an alert entry ("a") as
// its usage.threshold CloudEvent, or an entry's "k" and "v" as they are (the events of
// void.lua and outcome.lua, and usage events written before the compact form). A
// malformed entry returns its raw text as the value with ErrMalformedEntry.
func OutboxMessage(values map[string]any) (key string, value []byte, err error) {
	if a, ok := values["a"].(string); ok {
		org, v, err := renderAlert(a)
		if err != nil {
			return "", []byte(a), fmt.Errorf("%w: %w", ErrMalformedEntry, err)
		}
		return org, v, nil
	}
	e, ok := values["e"].(string)
	if !ok {
		key, _ = values["k"].(string)
		v, _ := values["v"].(string)
		return key, []byte(v), nil
	}
	org, v, err := renderCompact(e)
	if err != nil {
		return "", []byte(e), fmt.Errorf("%w: %w", ErrMalformedEntry, err)
	}
	return org, v, nil
}

// shadowRefusals are the refusals a sixteenth field may name.
var shadowRefusals = map[string]bool{"rate_limited": true, "quota_exceeded": true, "insufficient_balance": true}

// unitAmount is one member of a compact entry's units field.
type unitAmount struct {
	name string
	n    int64
}

// renderCompact renders a compact usage event as its CloudEvent JSON, byte for byte what
// encoding/json writes of the CloudEvent of the Admitted it records (but for the time,
// written with microseconds as clock.lua writes Redis TIME), in one pass. It returns the
// org, the Kafka key.
func renderCompact(e string) (org string, value []byte, err error) {
	var f [compactFields + 3]string
	n := 0 // fields
	for rest := e; ; {
		if n == len(f) {
			return "", nil, fmt.Errorf("more than %d fields", len(f))
		}
		var more bool
		f[n], rest, more = strings.Cut(rest, "|")
		n++
		if !more {
			break
		}
	}
	if n < compactFields {
		return "", nil, fmt.Errorf("%d fields, want %d to %d", n, compactFields, compactFields+3)
	}
	if f[0] != compactVersion {
		return "", nil, fmt.Errorf("version %q", f[0])
	}
	var unitBuf [8]unitAmount
	units, err := parseUnits(unitBuf[:0], f[6])
	if err != nil {
		return "", nil, err
	}
	var pathBuf [8]event.PathNode
	path, sec, usec, err := compactStamp(pathBuf[:0], f[9:13])
	if err != nil {
		return "", nil, err
	}
	if n == compactFields+3 && !shadowRefusals[f[15]] {
		return "", nil, fmt.Errorf("shadow refusal %q", f[15])
	}

	org = unescape(f[7])
	b := make([]byte, 0, 2*len(e)+320)
	b = append(b, `{"specversion":"1.0","id":`...)
	b = appendQuoted(b, unescape(f[1]))
	b = appendQuoted(append(b, `,"source":`...), unescape(f[2]))
	b = append(b, `,"type":"`+event.TypeAdmitted+`","subject":`...)
	b = appendSubject(b, path)
	b = append(b, `,"time":"`...)
	b = time.Unix(sec, usec*1000).UTC().AppendFormat(b, rfc3339Micro)
	b = append(b, `","datacontenttype":"application/json","data":{"org":`...)
	b = appendQuoted(b, org)
	b = appendQuoted(append(b, `,"account":`...), path[len(path)-1].Account)
	b = append(b, `,"path":[`...)
	for i, node := range path {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendQuoted(append(b, `{"account":`...), node.Account)
		b = appendQuoted(append(b, `,"kind":`...), node.Kind)
		b = append(b, '}')
	}
	b = append(b, ']')
	if f[3] != "" {
		b = appendQuoted(append(b, `,"api_key_id":`...), unescape(f[3]))
	}
	if f[4] != "" {
		b = appendQuoted(append(b, `,"idempotency_key":`...), unescape(f[4]))
	}
	b = append(b, `,"units":{`...)
	for i, u := range units {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(append(appendQuoted(b, u.name), ':'), u.n, 10)
	}
	b = append(b, `},"period":"`...)
	b = append(b, f[12]...)
	b = appendQuoted(append(b, `","plan":`...), unescape(f[8]))
	if f[5] != "" {
		b = appendQuoted(append(b, `,"tool":`...), unescape(f[5]))
	}
	// "borrowed", "credits" and "shadow_refusal" are the last members of the data (no
	// fail_open after them: the script never fails open).
	if b, err = appendBorrowed(b, f[13], path); err != nil {
		return "", nil, err
	}
	if b, err = appendCredits(b, f[14], path); err != nil {
		return "", nil, err
	}
	if n == compactFields+3 {
		b = append(append(append(b, `,"shadow_refusal":"`...), f[15]...), '"')
	}
	return org, append(b, "}}"...), nil
}

// parseUnits appends the units of a units field to out sorted by name, a name repeated
// counting once with its last amount: as encoding/json writes the map the field was made
// from.
func parseUnits(out []unitAmount, field string) ([]unitAmount, error) {
	if field == "" {
		return out, nil
	}
	sorted := true
	for rest, more := field, true; more; {
		var kv string
		kv, rest, more = strings.Cut(rest, ",")
		name, num, ok := strings.Cut(kv, "=")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("units %q", field)
		}
		if len(out) > 0 && out[len(out)-1].name >= name {
			sorted = false
		}
		out = append(out, unitAmount{name, v})
	}
	if sorted {
		return out, nil
	}
	slices.SortStableFunc(out, func(a, b unitAmount) int { return strings.Compare(a.name, b.name) })
	dedup := out[:0]
	for i, u := range out {
		if i+1 < len(out) && out[i+1].name == u.name {
			continue // the last of equal names wins, as in a map
		}
		dedup = append(dedup, u)
	}
	return dedup, nil
}

// appendSubject appends the CloudEvents subject of path (Subject) as a JSON string.
func appendSubject(b []byte, path []event.PathNode) []byte {
	plain := true
	for _, n := range path {
		if !plainString(n.Account) {
			plain = false
		}
	}
	if !plain {
		return append(b, quote(event.Subject(path))...)
	}
	b = append(b, '"')
	for i, n := range path {
		if i > 0 {
			b = append(b, '/')
		}
		b = append(b, n.Account...)
	}
	return append(b, '"')
}

// compactStamp reads the path, sec, usec and period fields of a compact entry, appending
// the path's nodes to path.
func compactStamp(path []event.PathNode, f []string) (_ []event.PathNode, sec, usec int64, err error) {
	for rest, more := f[0], true; more; {
		var node string
		node, rest, more = strings.Cut(rest, "/")
		account, kind, ok := strings.Cut(node, ":")
		if !ok || account == "" {
			return nil, 0, 0, fmt.Errorf("path %q", f[0])
		}
		path = append(path, event.PathNode{Account: account, Kind: kind})
	}
	sec, err1 := strconv.ParseInt(f[1], 10, 64)
	usec, err2 := strconv.ParseInt(f[2], 10, 64)
	// Redis TIME; RFC 3339 ends with the year 9999.
	if err1 != nil || err2 != nil || sec < 0 || sec >= 253402300800 || usec < 0 || usec >= 1e6 {
		return nil, 0, 0, fmt.Errorf("time %q.%q", f[1], f[2])
	}
	// Written into the JSON as it is: only a month label may be.
	if _, err := period.ParseMonth(f[3]); err != nil {
		return nil, 0, 0, fmt.Errorf("period %q", f[3])
	}
	return path, sec, usec, nil
}

// appendBorrowed appends the "borrowed" member of an admitted event's data, as encoding/json
// writes Admitted.Borrowed, for the borrowed field of a compact entry (see compactVersion)
// of an event charged to path: nothing if the field is empty.
func appendBorrowed(b []byte, field string, path []event.PathNode) ([]byte, error) {
	if field == "" {
		return b, nil
	}
	b = append(b, `,"borrowed":[`...)
	seen := make(map[string]bool, 2)
	for i, entry := range strings.Split(field, ",") {
		account, rest, ok1 := strings.Cut(entry, ":")
		unit, n, ok2 := strings.Cut(rest, "=")
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("borrowed %q: want <account>:<unit>=<n>", entry)
		}
		// The first node of that id, as the meter finds it: the org has no lender.
		lender := slices.IndexFunc(path, func(n event.PathNode) bool { return n.Account == account }) - 1
		if lender < 0 {
			return nil, fmt.Errorf("borrowed %q: account not below the org in the path", entry)
		}
		if !policy.Unit(unit).Valid() {
			return nil, fmt.Errorf("borrowed %q: unknown unit", entry)
		}
		if !positiveInt(n) {
			return nil, fmt.Errorf("borrowed %q: want a positive integer", entry)
		}
		key := account + ":" + unit
		if seen[key] {
			return nil, fmt.Errorf("borrowed %q: repeated", entry)
		}
		seen[key] = true
		if i > 0 {
			b = append(b, ',')
		}
		b = appendQuoted(append(b, `{"account":`...), account)
		b = appendQuoted(append(b, `,"from":`...), path[lender].Account)
		b = appendQuoted(append(b, `,"unit":`...), unit)
		b = append(append(b, `,"units":`...), n...)
		b = append(b, '}')
	}
	return append(b, ']'), nil
}

// appendCredits appends the "credits" member of an admitted event's data, as encoding/json
// writes Admitted.Credits, for the credits field of a compact entry (see compactVersion)
// of an event charged to path: nothing if the field is empty.
func appendCredits(b []byte, field string, path []event.PathNode) ([]byte, error) {
	if field == "" {
		return b, nil
	}
	b = append(b, `,"credits":[`...)
	entries := strings.Split(field, ",")
	seen := make(map[string]bool, len(entries))
	for i, entry := range entries {
		draw, n, ok1 := strings.Cut(entry, "=")
		account, rest, ok2 := strings.Cut(draw, ":")
		unit, grant, ok3 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("credits %q: want <account>:<unit>:<grant id>=<n>", entry)
		}
		if !slices.ContainsFunc(path, func(n event.PathNode) bool { return n.Account == account }) {
			return nil, fmt.Errorf("credits %q: account not in the path", entry)
		}
		if !policy.Unit(unit).Valid() {
			return nil, fmt.Errorf("credits %q: unknown unit", entry)
		}
		if !event.ValidGrantID(grant) {
			return nil, fmt.Errorf("credits %q: not a grant id", entry)
		}
		if !positiveInt(n) {
			return nil, fmt.Errorf("credits %q: want a positive integer", entry)
		}
		if seen[grant] {
			return nil, fmt.Errorf("credits %q: grant repeated", entry)
		}
		seen[grant] = true
		if i > 0 {
			b = append(b, ',')
		}
		b = appendQuoted(append(b, `{"account":`...), account)
		b = appendQuoted(append(b, `,"unit":`...), unit)
		b = appendQuoted(append(b, `,"grant":`...), grant)
		b = append(append(b, `,"units":`...), n...)
		b = append(b, '}')
	}
	return append(b, ']'), nil
}

// positiveInt reports whether s is an integer from 1 to MaxInt64 written as encoding/json
// writes one: digits only, no sign, no leading zero.
func positiveInt(s string) bool {
	if s == "" || s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

// rfc3339Micro is clock.lua's rfc3339: RFC 3339 UTC with microseconds.
const rfc3339Micro = "2006-01-02T15:04:05.000000Z"

// plainString reports whether encoding/json writes s between quotes as it is: printable
// ASCII but for " and \ and, as encoding/json escapes them by default, <, > and &.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// appendQuoted appends s as encoding/json writes a string: the identifiers, keys and tool
// names of an event are plain (plainString), the rest goes through encoding/json.
func appendQuoted(b []byte, s string) []byte {
	if !plainString(s) {
		return append(b, quote(s)...)
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func quote(s string) string {
	b, _ := json.Marshal(s) // a string always encodes
	return string(b)
}

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
	path, sec, usec, err := compactStamp(nil, f[9:13])
	if err != nil {
		return "", nil, err
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
	ce, err := event.New(event.ThresholdID(account, unit, spec, window), unescape(f[2]), event.TypeThreshold,
		event.Subject(d.Path), time.Unix(sec, usec*1000), d)
	if err != nil {
		return "", nil, err
	}
	out, err := json.Marshal(ce)
	return org, out, err
}
