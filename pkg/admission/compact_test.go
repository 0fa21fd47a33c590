package admission

import (
	"bufio"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
	"github.com/metergate/metergate/pkg/policy"
)

// goldenRequests are the requests whose usage events testdata/admitted_events.golden holds,
// one a line, as the admission script wrote them before the compact outbox entry (commit
// c762fb7: head .. rfc3339(TIME) .. middle .. period .. tail, in Redis).
func goldenRequests() []Request {
	pol := policy.Resolved{Org: "acme", Plan: "pro", Path: []policy.Level{
		{Account: "acme", Kind: policy.Org}, {Account: "eng", Kind: policy.Team},
		{Account: "alice", Kind: policy.User}, {Account: "agent-1", Kind: policy.Agent}}}
	return []Request{
		{EventID: "01a20ad9-148d-78fb-a967-f5cd45a1595b.7.acme", Source: "admit-1", Policy: pol, APIKeyID: "key-1",
			IdempotencyKey: `idem|"q"%7C{x}\`, Tool: "llm_call",
			Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500, policy.CostMicros: 0}},
		{EventID: "01a20ad9-148d-78fb-a967-f5cd45a1595c.7.acme", Source: `odd "node" <&>|`, Policy: pol,
			Units: map[policy.Unit]int64{policy.Requests: 1}},
		{EventID: "e3", Source: "n", Policy: policy.Resolved{Org: "solo", Path: []policy.Level{{Account: "solo", Kind: policy.Org}}},
			Units: map[policy.Unit]int64{}},
	}
}

// The relay renders a compact outbox entry to the very bytes the admission script wrote
// before the entry was compact: the meter and every consumer of the topic see no change.
func TestCompactEventRendersTheOldBytes(t *testing.T) {
	f, err := os.Open("testdata/admitted_events.golden")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i, r := range goldenRequests() {
		require.True(t, sc.Scan(), "golden line %d", i+1)
		want := sc.Text()
		var ev struct{ Time time.Time }
		require.NoError(t, json.Unmarshal([]byte(want), &ev))
		st := newEventStatic(r.Policy)
		e := compactEvent(r, &st) + strconv.FormatInt(ev.Time.Unix(), 10) + "|" +
			strconv.Itoa(ev.Time.Nanosecond()/1000) + "|2026-11"
		key, got, err := OutboxMessage(map[string]any{"e": e})
		require.NoError(t, err)
		require.Equal(t, want, string(got), "compact entry %q", e)
		require.Equal(t, r.Policy.Org, key, "keyed by org")
		require.Less(t, len(e), len(want)/2, "the compact entry is less than half the JSON")
	}
}

// Entries that are not compact (void.lua's and outcome.lua's events, and usage events
// written before the compact entry, still in the streams during an upgrade) are relayed as
// written; a malformed compact entry is relayed as it is, with an error.
func TestOutboxMessageOtherEntries(t *testing.T) {
	key, v, err := OutboxMessage(map[string]any{"k": "acme", "v": `{"specversion":"1.0"}`})
	require.NoError(t, err)
	require.Equal(t, "acme", key)
	require.Equal(t, `{"specversion":"1.0"}`, string(v))

	key, v, err = OutboxMessage(map[string]any{"junk": "1"})
	require.NoError(t, err)
	require.Empty(t, key)
	require.Empty(t, v)

	for _, e := range []string{"", "2|a", "1|e|s|||||acme|pro|acme:org|x|1|2026-11", "1|e|s||||r=x|acme|pro|acme:org|1|1|2026-11",
		"1|e|s|||||acme|pro||1|1|2026-11", "1|e|s|||||acme|pro|acme:org|1|1000000|2026-11",
		"1|e|s|||||acme|pro|acme:org|1|1|", "1|e|s|||||acme|pro|acme:org|1|1|2026-11\"", "1|e|s|||||acme|pro|acme:org|1|1|2026-11-03",
		"1|e|s|||||acme|pro|acme:org|253402300800|0|2026-11", "1|e|s|||||acme|pro|acme:org|-1|0|2026-11"} {
		_, v, err = OutboxMessage(map[string]any{"e": e})
		require.ErrorIs(t, err, ErrMalformedEntry, e)
		require.Equal(t, e, string(v))
	}
}

// A borrowed field the script should not have written is refused, never relayed as an
// event that charges a lender the path does not hold or an amount it did not lend.
func TestOutboxMessageMalformedBorrowings(t *testing.T) {
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

// Grant ids for tests.
const (
	grant1 = "gr_0123456789abcdef0123456789abcdef"
	grant2 = "gr_fedcba9876543210fedcba9876543210"
)

// A credits field the script should not have written is refused, never relayed as an
// event that draws from a grant of an account the path does not hold, or draws nothing,
// or draws a grant twice.
func TestOutboxMessageMalformedCredits(t *testing.T) {
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
// entries, writes again to the same bytes, so the meter's fast decoder and encoding/json see one event.
func FuzzOutboxMessage(f *testing.F) {
	for _, r := range goldenRequests() {
		st := newEventStatic(r.Policy)
		e := compactEvent(r, &st) + "1795430400|1|2026-11"
		f.Add(e)
		f.Add(e + "|")
		if len(r.Policy.Path) > 1 {
			f.Add(e + "|" + r.Policy.Path[1].Account + ":tokens=300," + r.Policy.Path[len(r.Policy.Path)-1].Account + ":requests=1")
			f.Add(e + "|" + r.Policy.Path[1].Account + ":tokens=300|" + r.Policy.Path[len(r.Policy.Path)-1].Account + ":tokens:" + grant1 + "=1000")
		}
		f.Add(e + "||" + r.Policy.Org + ":cost_micros:" + grant1 + "=1500," + r.Policy.Org + ":cost_micros:" + grant2 + "=7")
		f.Add(e + "||")
		f.Add(e + "|||rate_limited")
		f.Add(e + "||" + r.Policy.Org + ":cost_micros:" + grant1 + "=1500|insufficient_balance")
	}
	f.Add("1|e1|n|||||acme|pro|acme:org/team-a:team|1|2|2026-11|team-a:tokens=1,team-a:tokens=2")
	f.Add("1|e1|n|||||acme|pro|acme:org/team-a:team|1|2|2026-11||acme:tokens:" + grant1 + "=1,team-a:tokens:" + grant1 + "=2")
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

// Go's rendering of Redis TIME is clock.lua's rfc3339, at the edges of days, months, leap
// years and centuries.
func TestEventTimeMatchesClockLua(t *testing.T) {
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
