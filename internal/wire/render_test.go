package wire

import (
	"bufio"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

// Grant ids for tests.
const (
	grant1 = "gr_0123456789abcdef0123456789abcdef"
	grant2 = "gr_fedcba9876543210fedcba9876543210"
)

// request is a request as the admission records it: what it says, charged to pol.
type request struct {
	Compact
	pol policy.Resolved
}

// entry is r's compact outbox entry as the admission script writes it, stamped at and
// charged to period, with tail ("|<borrowed>…", or "") after the period.
func (r request) entry(at time.Time, period, tail string) string {
	return string(r.Append(nil, CompactPolicy(r.pol))) + strconv.FormatInt(at.Unix(), 10) + "|" +
		strconv.Itoa(at.Nanosecond()/1000) + "|" + period + tail
}

// admitted is the data of r's usage.admitted event charged to period, as admit's
// fail-open path (admission.Request.Admitted) makes it.
func (r request) admitted(period string) event.Admitted {
	path := make([]event.PathNode, len(r.pol.Path))
	for i, lv := range r.pol.Path {
		path[i] = event.PathNode{Account: lv.Account, Kind: string(lv.Kind)}
	}
	units := make(map[string]int64, len(r.Units))
	for u, n := range r.Units {
		units[string(u)] = n
	}
	return event.Admitted{Org: r.pol.Org, Account: r.pol.Account(), Path: path, APIKeyID: r.APIKeyID,
		IdempotencyKey: r.IdempotencyKey, Units: units, Period: period, Plan: r.pol.Plan, Tool: r.Tool}
}

// envelope is what encoding/json makes of the CloudEvent of a, with the time written as the
// relay writes Redis TIME (microseconds).
func envelope(t testing.TB, id, source string, at time.Time, a event.Admitted) string {
	data, err := json.Marshal(a)
	require.NoError(t, err)
	return `{"specversion":"1.0","id":` + quote(id) + `,"source":` + quote(source) + `,"type":` + quote(event.TypeAdmitted) +
		`,"subject":` + quote(event.Subject(a.Path)) + `,"time":"` + at.UTC().Format(rfc3339Micro) +
		`","datacontenttype":"application/json","data":` + string(data) + `}`
}

var (
	fourLevels = policy.Resolved{Org: "acme", Plan: "pro", Path: []policy.Level{
		{Account: "acme", Kind: policy.Org}, {Account: "eng", Kind: policy.Team},
		{Account: "alice", Kind: policy.User}, {Account: "agent-1", Kind: policy.Agent}}}
	solo = policy.Resolved{Org: "solo", Path: []policy.Level{{Account: "solo", Kind: policy.Org}}}
)

// The relay renders, byte for byte, what encoding/json makes of the same event: the meter's
// fast decoder and every consumer see one layout.
func TestCompactRendersAsJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for _, r := range []request{
		{Compact{EventID: "e1", Source: "node-1", Units: map[policy.Unit]int64{policy.Requests: 1}}, fourLevels},
		{Compact{EventID: "e2", Source: "node-1", APIKeyID: "k1", IdempotencyKey: "idem-1", Tool: "web_search",
			Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500, policy.Credits: 3, policy.CostMicros: 0}}, fourLevels},
		{Compact{EventID: "e3", Source: `odd "node" <&>|%`, IdempotencyKey: `a\b"c<d>&é|%7C`, Tool: "tool\u2028x",
			Units: map[policy.Unit]int64{policy.Tokens: 9_000_000_000}}, fourLevels},
		{Compact{EventID: "e4", Source: "n", Units: map[policy.Unit]int64{}}, solo},
		{Compact{EventID: "e5", Source: "n", Units: map[policy.Unit]int64{policy.Tokens: -3}},
			policy.Resolved{Org: "o<1>", Plan: `p|"%`, Path: []policy.Level{{Account: "o<1>", Kind: policy.Org}}}},
	} {
		key, got, err := OutboxMessage(map[string]any{"e": r.entry(at, "2026-11", "")})
		require.NoError(t, err)
		require.Equal(t, r.pol.Org, key, "keyed by org")
		require.Equal(t, envelope(t, r.EventID, r.Source, at, r.admitted("2026-11")), string(got))
	}
}

// A compact entry whose units are not sorted, or name one twice (the script never writes
// one), renders as encoding/json writes the map it would make: sorted, the last amount.
func TestCompactUnitsAsAMap(t *testing.T) {
	t.Parallel()
	_, got, err := OutboxMessage(map[string]any{"e": "1|e1|n|||||acme|pro|acme:org|1|2|2026-11"})
	require.NoError(t, err)
	require.Contains(t, string(got), `"units":{}`)
	_, got, err = OutboxMessage(map[string]any{"e": "1|e1|n||||tokens=5,requests=1,tokens=7,credits=2|acme|pro|acme:org|1|2|2026-11"})
	require.NoError(t, err)
	require.Contains(t, string(got), `"units":{"credits":2,"requests":1,"tokens":7}`)
}

// The relay renders a compact outbox entry to the very bytes the admission script wrote
// before the entry was compact (commit c762fb7: head .. rfc3339(TIME) .. middle .. period
// .. tail, in Redis): the meter and every consumer of the topic see no change.
func TestCompactRendersTheOldBytes(t *testing.T) {
	t.Parallel()
	f, err := os.Open("testdata/admitted_events.golden")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i, r := range []request{
		{Compact{EventID: "01a20ad9-148d-78fb-a967-f5cd45a1595b.7.acme", Source: "admit-1", APIKeyID: "key-1",
			IdempotencyKey: `idem|"q"%7C{x}\`, Tool: "llm_call",
			Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500, policy.CostMicros: 0}}, fourLevels},
		{Compact{EventID: "01a20ad9-148d-78fb-a967-f5cd45a1595c.7.acme", Source: `odd "node" <&>|`,
			Units: map[policy.Unit]int64{policy.Requests: 1}}, fourLevels},
		{Compact{EventID: "e3", Source: "n", Units: map[policy.Unit]int64{}}, solo},
	} {
		require.True(t, sc.Scan(), "golden line %d", i+1)
		want := sc.Text()
		var ev struct{ Time time.Time }
		require.NoError(t, json.Unmarshal([]byte(want), &ev))
		e := r.entry(ev.Time, "2026-11", "")
		key, got, err := OutboxMessage(map[string]any{"e": e})
		require.NoError(t, err)
		require.Equal(t, want, string(got), "compact entry %q", e)
		require.Equal(t, r.pol.Org, key, "keyed by org")
		require.Less(t, len(e), len(want)/2, "the compact entry is less than half the JSON")
	}
}

// A compact entry with borrowings renders, byte for byte, what encoding/json makes of the
// event with Admitted.Borrowed, in the order the script recorded them, each lent by the
// account's parent in the path.
func TestBorrowedEventIsJSON(t *testing.T) {
	t.Parallel()
	pol := policy.Resolved{Org: "acme", Plan: "pro", Path: []policy.Level{
		{Account: "acme", Kind: policy.Org}, {Account: "team-a", Kind: policy.Team},
		{Account: "user-1", Kind: policy.User}, {Account: "agent.x_1", Kind: policy.Agent}}}
	r := request{Compact{EventID: "e1.3.acme", Source: "node-1", APIKeyID: "k1", Tool: "llm_call",
		Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500}}, pol}
	at := time.Date(2026, 11, 23, 10, 47, 20, 294404000, time.UTC)
	for _, tc := range []struct {
		field string // the fourteenth field, after the period ("-": none)
		want  []event.Borrowing
	}{
		{"-", nil},
		{"", nil},
		{"team-a:tokens=300", []event.Borrowing{{Account: "team-a", From: "acme", Unit: "tokens", Units: 300}}},
		{"team-a:tokens=300,user-1:requests=1,agent.x_1:tokens=9223372036854775807,team-a:requests=2", []event.Borrowing{
			{Account: "team-a", From: "acme", Unit: "tokens", Units: 300},
			{Account: "user-1", From: "team-a", Unit: "requests", Units: 1},
			{Account: "agent.x_1", From: "user-1", Unit: "tokens", Units: 9223372036854775807},
			{Account: "team-a", From: "acme", Unit: "requests", Units: 2}}},
		{"user-1:credits=5,user-1:cost_micros=7", []event.Borrowing{
			{Account: "user-1", From: "team-a", Unit: "credits", Units: 5},
			{Account: "user-1", From: "team-a", Unit: "cost_micros", Units: 7}}},
	} {
		tail := ""
		if tc.field != "-" {
			tail = "|" + tc.field
		}
		e := r.entry(at, "2026-11", tail)
		key, got, err := OutboxMessage(map[string]any{"e": e})
		require.NoError(t, err, e)
		require.Equal(t, "acme", key)

		a := r.admitted("2026-11")
		a.Borrowed = tc.want
		require.Equal(t, envelope(t, "e1.3.acme", "node-1", at, a), string(got), e)
	}
}

// A compact entry with credit draws renders, byte for byte, what encoding/json makes of the
// event with Admitted.Credits, in the order the script drew them, after the borrowings if
// any.
func TestCreditsEventIsJSON(t *testing.T) {
	t.Parallel()
	pol := policy.Resolved{Org: "acme", Plan: "pro", Path: []policy.Level{
		{Account: "acme", Kind: policy.Org}, {Account: "team-a", Kind: policy.Team},
		{Account: "user-1", Kind: policy.User}}}
	r := request{Compact{EventID: "e1.3.acme", Source: "node-1", IdempotencyKey: "i-1", Tool: "llm_call",
		Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 1200, policy.CostMicros: 1500}}, pol}
	at := time.Date(2026, 11, 30, 23, 59, 59, 999999000, time.UTC)
	borrowed := []event.Borrowing{{Account: "team-a", From: "acme", Unit: "tokens", Units: 300}}
	for _, tc := range []struct {
		fields   string // the fields after the period
		borrowed []event.Borrowing
		want     []event.CreditDraw
	}{
		{"|", nil, nil},
		{"team-a:tokens=300|", borrowed, nil},
		{"|acme:cost_micros:" + grant1 + "=1500", nil, []event.CreditDraw{{Account: "acme", Unit: "cost_micros", Grant: grant1, Units: 1500}}},
		{"team-a:tokens=300|acme:tokens:" + grant1 + "=1000,acme:tokens:" + grant2 + "=200", borrowed, []event.CreditDraw{
			{Account: "acme", Unit: "tokens", Grant: grant1, Units: 1000},
			{Account: "acme", Unit: "tokens", Grant: grant2, Units: 200}}},
		{"|user-1:requests:" + grant2 + "=1,team-a:tokens:" + grant1 + "=9223372036854775807", nil, []event.CreditDraw{
			{Account: "user-1", Unit: "requests", Grant: grant2, Units: 1},
			{Account: "team-a", Unit: "tokens", Grant: grant1, Units: 9223372036854775807}}},
	} {
		e := r.entry(at, "2026-11", "|"+tc.fields)
		key, got, err := OutboxMessage(map[string]any{"e": e})
		require.NoError(t, err, e)
		require.Equal(t, "acme", key)

		a := r.admitted("2026-11")
		a.Borrowed, a.Credits = tc.borrowed, tc.want
		require.Equal(t, envelope(t, "e1.3.acme", "node-1", at, a), string(got), e)
	}
}

// Entries that are not compact (void.lua's and outcome.lua's events, and usage events
// written before the compact entry, still in the streams during an upgrade) are relayed as
// written; a malformed compact entry is relayed as it is, with an error.
func TestOutboxMessageOtherEntries(t *testing.T) {
	t.Parallel()
	key, v, err := OutboxMessage(map[string]any{"k": "acme", "v": `{"specversion":"1.0"}`})
	require.NoError(t, err)
	require.Equal(t, "acme", key)
	require.Equal(t, `{"specversion":"1.0"}`, string(v))

	key, v, err = OutboxMessage(map[string]any{"junk": "1"})
	require.NoError(t, err)
	require.Empty(t, key)
	require.Empty(t, v)

	for _, e := range []string{"", "2|a", "1|e|s|||||acme|pro|acme:org|x|1|2026-11", "1|e|s||||r=x|acme|pro|acme:org|1|1|2026-11",
		"1|e|s||||requests=1,|acme|pro|acme:org|1|1|2026-11", "1|e|s||||,requests=1|acme|pro|acme:org|1|1|2026-11",
		"1|e|s|||||acme|pro||1|1|2026-11", "1|e|s|||||acme|pro|acme:org/|1|1|2026-11", "1|e|s|||||acme|pro|acme:org|1|1000000|2026-11",
		"1|e|s|||||acme|pro|acme:org|1|1|", "1|e|s|||||acme|pro|acme:org|1|1|2026-11\"", "1|e|s|||||acme|pro|acme:org|1|1|2026-11-03",
		"1|e|s|||||acme|pro|acme:org|253402300800|0|2026-11", "1|e|s|||||acme|pro|acme:org|-1|0|2026-11",
		"1|e|s|||||acme|pro|acme:org|1|1|2026-11|||quota", "1|e|s|||||acme|pro|acme:org|1|1|2026-11||||"} {
		_, v, err = OutboxMessage(map[string]any{"e": e})
		require.ErrorIs(t, err, ErrMalformedEntry, e)
		require.Equal(t, e, string(v))
	}
}

// A borrowed field the script should not have written is refused, never relayed as an
// event that charges a lender the path does not hold or an amount it did not lend.
func TestOutboxMessageMalformedBorrowings(t *testing.T) {
	t.Parallel()
	const entry = "1|e1|n|||||acme|pro|acme:org/team-a:team/user-1:user|1|2|2026-11"
	_, _, err := OutboxMessage(map[string]any{"e": entry + "|team-a:tokens=1,user-1:requests=2"})
	require.NoError(t, err)
	// An id both the org's and a team's: the first node of the id is the one that counts,
	// as in the meter.
	_, _, err = OutboxMessage(map[string]any{"e": "1|e1|n|||||acme|pro|acme:org/acme:team|1|2|2026-11|acme:tokens=1"})
	require.ErrorIs(t, err, ErrMalformedEntry)
	for name, field := range map[string]string{
		"account not in the path":  "bob:tokens=1",
		"the org (no lender)":      "acme:tokens=1",
		"account a prefix":         "team:tokens=1",
		"no unit":                  "team-a=1",
		"no number":                "team-a:tokens",
		"empty number":             "team-a:tokens=",
		"zero":                     "team-a:tokens=0",
		"negative":                 "team-a:tokens=-1",
		"plus sign":                "team-a:tokens=+1",
		"leading zero":             "team-a:tokens=01",
		"fraction":                 "team-a:tokens=1.5",
		"too large":                "team-a:tokens=9223372036854775808",
		"unknown unit":             "team-a:token=1",
		"unit in capitals":         "team-a:Tokens=1",
		"duplicate":                "team-a:tokens=1,user-1:tokens=1,team-a:tokens=2",
		"empty entry":              "team-a:tokens=1,",
		"space":                    "team-a:tokens=1, user-1:tokens=1",
		"a sixteenth field":        "team-a:tokens=1|acme:tokens:" + grant1 + "=1|x",
		"an empty sixteenth field": "team-a:tokens=1||",
		"escaped":                  "team-a%7C:tokens=1",
	} {
		e := entry + "|" + field
		_, v, err := OutboxMessage(map[string]any{"e": e})
		require.ErrorIs(t, err, ErrMalformedEntry, name)
		require.Equal(t, e, string(v), name)
	}
}

// A credits field the script should not have written is refused, never relayed as an
// event that draws from a grant of an account the path does not hold, or draws nothing,
// or draws a grant twice.
func TestOutboxMessageMalformedCredits(t *testing.T) {
	t.Parallel()
	const entry = "1|e1|n|||||acme|pro|acme:org/team-a:team/user-1:user|1|2|2026-11"
	for _, field := range []string{"|acme:tokens:" + grant1 + "=1", "team-a:tokens=3|user-1:requests:" + grant1 + "=1,acme:tokens:" + grant2 + "=7", "|", ""} {
		_, _, err := OutboxMessage(map[string]any{"e": entry + "|" + field})
		require.NoError(t, err, field)
	}
	for name, field := range map[string]string{
		"account not in the path":  "bob:tokens:" + grant1 + "=1",
		"account a prefix":         "team:tokens:" + grant1 + "=1",
		"empty account":            ":tokens:" + grant1 + "=1",
		"no unit":                  "acme:" + grant1 + "=1",
		"no grant":                 "acme:tokens=1",
		"unknown unit":             "acme:token:" + grant1 + "=1",
		"grant in capitals":        "acme:tokens:gr_0123456789ABCDEF0123456789abcdef=1",
		"grant too short":          "acme:tokens:gr_0123456789abcdef0123456789abcde=1",
		"grant too long":           "acme:tokens:" + grant1 + "0=1",
		"grant without its prefix": "acme:tokens:0123456789abcdef0123456789abcdef=1",
		"grant not hex":            "acme:tokens:gr_0123456789abcdef0123456789abcdeg=1",
		"grant with a colon":       "acme:tokens:gr_:123456789abcdef0123456789abcdef=1",
		"no number":                "acme:tokens:" + grant1,
		"empty number":             "acme:tokens:" + grant1 + "=",
		"zero":                     "acme:tokens:" + grant1 + "=0",
		"negative":                 "acme:tokens:" + grant1 + "=-1",
		"plus sign":                "acme:tokens:" + grant1 + "=+1",
		"leading zero":             "acme:tokens:" + grant1 + "=01",
		"fraction":                 "acme:tokens:" + grant1 + "=1.5",
		"too large":                "acme:tokens:" + grant1 + "=9223372036854775808",
		"two numbers":              "acme:tokens:" + grant1 + "=1=2",
		"duplicate grant":          "acme:tokens:" + grant1 + "=1,acme:tokens:" + grant2 + "=1,acme:tokens:" + grant1 + "=2",
		"a grant of two accounts":  "acme:tokens:" + grant1 + "=1,team-a:tokens:" + grant1 + "=2",
		"empty entry":              "acme:tokens:" + grant1 + "=1,",
		"space":                    "acme:tokens:" + grant1 + "=1, team-a:tokens:" + grant2 + "=1",
		"a sixteenth field":        "acme:tokens:" + grant1 + "=1|x",
		"an empty sixteenth field": "acme:tokens:" + grant1 + "=1|",
		"in the borrowed field":    "acme:tokens:" + grant1 + "=1",
	} {
		e := entry + "||" + field
		if name == "in the borrowed field" {
			e = entry + "|" + field
		}
		_, v, err := OutboxMessage(map[string]any{"e": e})
		require.ErrorIs(t, err, ErrMalformedEntry, name)
		require.Equal(t, e, string(v), name)
	}
}

// FuzzOutboxMessage: no entry makes OutboxMessage panic, and whatever compact entry it
// renders is a usage.admitted CloudEvent that encoding/json reads back and, for UTF-8
// entries, writes again to the same bytes, so the meter's fast decoder and encoding/json
// see one event.
func FuzzOutboxMessage(f *testing.F) {
	at := time.Unix(1795430400, 1000)
	for _, r := range []request{
		{Compact{EventID: "e1", Source: "admit-1", APIKeyID: "key-1", IdempotencyKey: `idem|"q"%7C{x}\`, Tool: "llm_call",
			Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500}}, fourLevels},
		{Compact{EventID: "e3", Source: "n", Units: map[policy.Unit]int64{}}, solo},
	} {
		e := r.entry(at, "2026-11", "")
		f.Add(e)
		f.Add(e + "|")
		if len(r.pol.Path) > 1 {
			f.Add(e + "|" + r.pol.Path[1].Account + ":tokens=300," + r.pol.Path[len(r.pol.Path)-1].Account + ":requests=1")
			f.Add(e + "|" + r.pol.Path[1].Account + ":tokens=300|" + r.pol.Path[len(r.pol.Path)-1].Account + ":tokens:" + grant1 + "=1000")
		}
		f.Add(e + "||" + r.pol.Org + ":cost_micros:" + grant1 + "=1500," + r.pol.Org + ":cost_micros:" + grant2 + "=7")
		f.Add(e + "||")
		f.Add(e + "|||rate_limited")
		f.Add(e + "||" + r.pol.Org + ":cost_micros:" + grant1 + "=1500|insufficient_balance")
	}
	f.Add("1|e1|n|||||acme|pro|acme:org/team-a:team|1|2|2026-11|team-a:tokens=1,team-a:tokens=2")
	f.Add("1|e1|n|||||acme|pro|acme:org/team-a:team|1|2|2026-11||acme:tokens:" + grant1 + "=1,team-a:tokens:" + grant1 + "=2")
	f.Add("1|e1|n||||tokens=2,requests=1,tokens=3|acme|pro|acme:org|1|2|2026-11")
	f.Fuzz(func(t *testing.T, e string) {
		_, v, err := OutboxMessage(map[string]any{"e": e})
		if err != nil {
			require.ErrorIs(t, err, ErrMalformedEntry)
			require.Equal(t, e, string(v))
			return
		}
		var ce event.CloudEvent
		require.NoError(t, json.Unmarshal(v, &ce), "%q renders %q", e, v)
		require.Equal(t, event.TypeAdmitted, ce.Type)
		var a event.Admitted
		require.NoError(t, json.Unmarshal(ce.Data, &a), "%q renders %q", e, v)
		if utf8.ValidString(e) { // else encoding/json replaced the invalid bytes
			data, err := json.Marshal(a)
			require.NoError(t, err)
			require.Equal(t, string(data), string(ce.Data), "%q", e)
			require.Equal(t, event.Subject(a.Path), ce.Subject)
		}
		for _, b := range a.Borrowed {
			require.Positive(t, b.Units)
			require.True(t, policy.Unit(b.Unit).Valid(), b.Unit)
			i := slices.IndexFunc(a.Path, func(n event.PathNode) bool { return n.Account == b.Account })
			require.Positive(t, i, "borrower %q below the org", b.Account)
			require.Equal(t, a.Path[i-1].Account, b.From)
		}
		grants := map[string]bool{}
		for _, c := range a.Credits {
			require.Positive(t, c.Units)
			require.True(t, policy.Unit(c.Unit).Valid(), c.Unit)
			require.True(t, event.ValidGrantID(c.Grant), c.Grant)
			require.True(t, slices.ContainsFunc(a.Path, func(n event.PathNode) bool { return n.Account == c.Account }),
				"account %q of the path", c.Account)
			require.False(t, grants[c.Grant], "grant %q drawn twice", c.Grant)
			grants[c.Grant] = true
		}
	})
}

// An alert entry renders as a usage.threshold event whose id names its threshold and whose
// data says what the entry says, or is refused as malformed; never anything else.
func FuzzAlertEntry(f *testing.F) {
	head := "1|e1|node-1|||llm_call|tokens=10|acme|pro|acme:org/team-a:team|1795430400|1|2026-11|"
	f.Add(head + "acme:tokens|p80|800|805|2026-11|1")
	f.Add(head + "team-a:tokens|p100|100|95|2026-11-24|0")
	f.Add(head + "team-a:credits|b30|30|23|" + grant1 + "|1")
	f.Add(head + "acme:cost_micros|bp20|200|199|" + grant2 + "|1")
	f.Add(head + "acme:tokens|p80|800|805|" + grant1 + "|1")
	f.Add(head + "other:tokens|p80|800|805|2026-11|1")
	f.Fuzz(func(t *testing.T, e string) {
		key, v, err := OutboxMessage(map[string]any{"a": e})
		if err != nil {
			require.ErrorIs(t, err, ErrMalformedEntry)
			require.Equal(t, e, string(v))
			return
		}
		var ce event.CloudEvent
		require.NoError(t, json.Unmarshal(v, &ce), "%q renders %q", e, v)
		require.Equal(t, event.TypeThreshold, ce.Type)
		var d event.Threshold
		require.NoError(t, json.Unmarshal(ce.Data, &d))
		f := strings.Split(e, "|")
		if utf8.ValidString(key) { // else encoding/json replaced the invalid bytes
			require.Equal(t, d.Org, key)
		}
		require.Equal(t, f[13], d.Account+":"+d.Unit)
		window := d.Period
		if d.Grant != "" {
			window = d.Grant
		}
		require.Equal(t, event.ThresholdID(d.Account, d.Unit, f[14], window), ce.ID)
		require.Equal(t, d.Account, d.Path[len(d.Path)-1].Account)
		require.Equal(t, d.Kind == "quota_percent", d.Grant == "")
	})
}

// Go's rendering of Redis TIME is clock.lua's rfc3339, at the edges of days, months, leap
// years and centuries.
func TestEventTimeMatchesClockLua(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	src, err := os.ReadFile("../../lua/clock.lua")
	require.NoError(t, err)
	script := string(src) + "\nreturn rfc3339(tonumber(ARGV[1]), tonumber(ARGV[2]))"
	ctx := testenv.Context(t, 30*time.Second)
	for _, at := range []string{"2026-11-24T00:33:51.398639Z", "2026-12-31T23:59:59.999999Z", "2027-01-01T00:00:00.000000Z",
		"2028-02-29T12:00:00.000001Z", "2100-03-01T00:00:00.000000Z", "2000-02-29T23:59:59.500000Z", "1970-01-01T00:00:00.000000Z"} {
		tm, err := time.Parse(rfc3339Micro, at)
		require.NoError(t, err)
		got, err := rdb.Eval(ctx, script, nil, tm.Unix(), tm.Nanosecond()/1000).Text()
		require.NoError(t, err)
		require.Equal(t, at, got)
		require.Equal(t, at, tm.UTC().Format(rfc3339Micro))
	}
}

// BenchmarkOutboxMessage is the relay's rendering of one compact usage event.
//
//	go test -run '^$' -bench OutboxMessage -benchmem ./internal/wire/
func BenchmarkOutboxMessage(b *testing.B) {
	r := request{Compact{EventID: "01a20ad9-148d-78fb-a967-f5cd45a1595b.7.acme", Source: "admit-1", APIKeyID: "key-1",
		IdempotencyKey: "idem-1", Tool: "llm_call", Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500}}, fourLevels}
	values := map[string]any{"e": r.entry(time.Unix(1795430400, 294404000), "2026-11", "")}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := OutboxMessage(values); err != nil {
			b.Fatal(err)
		}
	}
}
