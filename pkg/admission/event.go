package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/pkg/event"
	"github.com/metergate/metergate/pkg/period"
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
	compact     string // "<org>|<plan>|<path>|", the compact event's policy fields
}

func newEventStatic(pol policy.Resolved) eventStatic {
	a := Request{Policy: pol}.Admitted("")
	path, _ := json.Marshal(a.Path) // account ids and kinds always encode
	return eventStatic{
		typeSubject: `,"type":` + quote(event.TypeAdmitted) + `,"subject":` + quote(event.Subject(a.Path)) + `,"time":"`,
		data:        `{"org":` + quote(a.Org) + `,"account":` + quote(a.Account) + `,"path":` + string(path),
		plan:        `,"plan":` + quote(a.Plan),
		compact:     compactPolicy(pol),
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

// The outbox entry of a usage.admitted event is compact (about 200 bytes against the
// CloudEvent's 600): the admission script appends one field, "e", and the relay renders
// the CloudEvent JSON from it (OutboxMessage), byte for byte what the script used to
// write. Fields are separated by "|"; the free-form ones (event id, source, API key id,
// idempotency key, tool, org, plan) are escaped ("%" → "%25", "|" → "%7C"):
//
//	1|<event id>|<source>|<api key id>|<idempotency key>|<tool>|<units>|<org>|<plan>|<path>|<sec>|<usec>|<period>
//
//	1|…|<period>|<borrowed>
//	1|…|<period>|<borrowed>|<credits>
//
// units: "<unit>=<n>,…" sorted; path: "<account>:<kind>/…" org first; sec and usec: Redis
// TIME; period: the month charged. Go writes up to the path and its "|"; the script
// appends the last three, and a fourteenth field when accounts borrowed capacity from
// their parents beyond their guaranteed rate (a limit's ceiling): borrowed is
// "<account>:<unit>=<n>,…", an account of the path other than the org (its lender is the
// node before it), a unit's full name and n > 0, each account and unit at most once. An
// entry of 13 fields, or an empty fourteenth, borrowed nothing. A fifteenth field lists
// what the request drew from credit grants (the fourteenth then may be empty): credits is
// "<account>:<unit>:<grant id>=<n>,…" in the order drawn, an account of the path (the org
// included), a unit's full name, a grant id ("gr_" and 32 lowercase hex digits) and n > 0,
// each grant at most once. An entry of 13 or 14 fields, or an empty fifteenth, drew
// nothing. A sixteenth field, when there is one, is the refusal shadow mode let pass
// ("rate_limited", "quota_exceeded" or "insufficient_balance"). Entries of other shapes (void.lua's, and admitted events written by earlier
// versions) carry the Kafka key in "k" and the CloudEvent JSON in "v".
const compactVersion = "1"

// compactEvent returns r's usage event up to its time, for the script to complete.
func compactEvent(r Request, st *eventStatic) string {
	b := make([]byte, 0, 128+len(st.compact))
	b = append(b, compactVersion+"|"...)
	for _, f := range [...]string{r.EventID, r.Source, r.APIKeyID, r.IdempotencyKey, r.Tool} {
		b = appendEscaped(b, f)
		b = append(b, '|')
	}
	names := make([]string, 0, len(r.Units))
	for u := range r.Units {
		names = append(names, string(u))
	}
	sort.Strings(names)
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, name...)
		b = strconv.AppendInt(append(b, '='), r.Units[policy.Unit(name)], 10)
	}
	b = append(b, '|')
	b = append(b, st.compact...)
	return string(b)
}

func compactPolicy(pol policy.Resolved) string {
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

// ErrMalformedEntry is returned by OutboxMessage for an entry it cannot read.
var ErrMalformedEntry = errors.New("malformed outbox entry")

// OutboxMessage returns the Kafka key and value of an outbox stream entry: a compact
// usage event rendered as its CloudEvent JSON, an alert entry (alert.go) as its
// usage.threshold CloudEvent, or an entry's "k" and "v" as they are (the
// events of void.lua and outcome.lua, and usage events written before the compact form).
// A malformed compact entry returns its raw text as the value with ErrMalformedEntry.
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

// compactFields is the number of fields of a compact entry without borrowings or credit
// draws; one with borrowings has one more, one with credit draws two more, one with a
// shadow refusal three more.
const compactFields = 13

// shadowRefusals are the refusals a sixteenth field may name.
var shadowRefusals = map[string]bool{"rate_limited": true, "quota_exceeded": true, "insufficient_balance": true}

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
	units := map[policy.Unit]int64{}
	if f[6] != "" {
		for _, kv := range strings.Split(f[6], ",") {
			name, n, ok := strings.Cut(kv, "=")
			v, err := strconv.ParseInt(n, 10, 64)
			if !ok || err != nil {
				return "", nil, fmt.Errorf("units %q", f[6])
			}
			units[policy.Unit(name)] = v
		}
	}
	pol := policy.Resolved{Org: unescape(f[7]), Plan: unescape(f[8])}
	path, sec, usec, err := compactStamp(f[9:13])
	if err != nil {
		return "", nil, err
	}
	pol.Path = path
	borrowed, err := appendBorrowed(nil, f[13], pol.Path)
	if err != nil {
		return "", nil, err
	}
	borrowed, err = appendCredits(borrowed, f[14], pol.Path)
	if err != nil {
		return "", nil, err
	}
	if n == compactFields+3 {
		if !shadowRefusals[f[15]] {
			return "", nil, fmt.Errorf("shadow refusal %q", f[15])
		}
		borrowed = append(append(append(borrowed, `,"shadow_refusal":"`...), f[15]...), '"')
	}
	r := Request{EventID: unescape(f[1]), Source: unescape(f[2]), APIKeyID: unescape(f[3]),
		IdempotencyKey: unescape(f[4]), Tool: unescape(f[5]), Units: units, Policy: pol}
	st := newEventStatic(pol)
	head, middle, tail := admittedEvent(r, &st)
	b := make([]byte, 0, len(head)+len(middle)+len(tail)+len(borrowed)+40)
	b = append(b, head...)
	b = time.Unix(sec, usec*1000).UTC().AppendFormat(b, rfc3339Micro)
	b = append(b, middle...)
	b = append(b, f[12]...)
	// "borrowed", "credits" and "shadow_refusal" are the last members of the data (no
	// fail_open after them: the script never fails open), before the data's and the
	// envelope's closing braces.
	b = append(b, tail[:len(tail)-2]...)
	b = append(b, borrowed...)
	b = append(b, "}}"...)
	return pol.Org, b, nil
}

// compactStamp reads the path, sec, usec and period fields of a compact entry.
func compactStamp(f []string) (path []policy.Level, sec, usec int64, err error) {
	for _, node := range strings.Split(f[0], "/") {
		account, kind, ok := strings.Cut(node, ":")
		if !ok || account == "" {
			return nil, 0, 0, fmt.Errorf("path %q", f[0])
		}
		path = append(path, policy.Level{Account: account, Kind: policy.Kind(kind)})
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
// writes event.Admitted.Borrowed, for the borrowed field of a compact entry (see
// compactVersion) of an event charged to path: nothing if the field is empty.
func appendBorrowed(b []byte, field string, path []policy.Level) ([]byte, error) {
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
		lender := slices.IndexFunc(path, func(l policy.Level) bool { return l.Account == account }) - 1
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
// writes event.Admitted.Credits, for the credits field of a compact entry (see
// compactVersion) of an event charged to path: nothing if the field is empty.
func appendCredits(b []byte, field string, path []policy.Level) ([]byte, error) {
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
		if !slices.ContainsFunc(path, func(l policy.Level) bool { return l.Account == account }) {
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
