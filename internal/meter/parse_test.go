package meter

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/pkg/event"
)

// goodAdmitted is a valid admission as JSON objects, for cases to change.
func goodAdmitted() map[string]any {
	return map[string]any{
		"specversion": "1.0", "id": "01a20805-4cb6-7888-ab2c-e1f1eb68e89e.12.acme", "source": "node-1",
		"type": event.TypeAdmitted, "subject": "acme/eng/alice/agent-1", "time": "2026-11-23T10:47:20.294404Z",
		"datacontenttype": "application/json",
		"data": map[string]any{
			"org": "acme", "account": "agent-1",
			"path": []any{
				map[string]any{"account": "acme", "kind": "org"}, map[string]any{"account": "eng", "kind": "team"},
				map[string]any{"account": "alice", "kind": "user"}, map[string]any{"account": "agent-1", "kind": "agent"},
			},
			"api_key_id": "key_d08a26640bf29096", "idempotency_key": "req-7f3a",
			"units":  map[string]any{"requests": 1, "tokens": 2500, "credits": 3, "cost_micros": 1200},
			"period": "2026-11", "plan": "pro", "tool": "llm_call",
		},
	}
}

func goodOutcome() map[string]any {
	return map[string]any{
		"specversion": "1.0", "id": "01a20805-4cb6-7888-ab2c-e1f1eb68e89e.12.acme/outcome", "source": "node-1",
		"type": event.TypeOutcome, "subject": "acme", "time": "2026-11-23T10:47:46.851154Z",
		"datacontenttype": "application/json",
		"data":            map[string]any{"event_id": "01a20805-4cb6-7888-ab2c-e1f1eb68e89e.12.acme", "status": 200, "units": map[string]any{"tokens": 1870}},
	}
}

func data(ev map[string]any) map[string]any { return ev["data"].(map[string]any) }

func encode(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	require.NoError(tb, err)
	return b
}

// malformedCase is a message the meter must write to dead_letters, with part of the reason.
type malformedCase struct {
	name  string
	value func(tb testing.TB) []byte
	err   string
}

// admittedWith and outcomeWith return a valid event changed by change.
func admittedWith(change func(ev map[string]any)) func(testing.TB) []byte {
	return func(tb testing.TB) []byte { ev := goodAdmitted(); change(ev); return encode(tb, ev) }
}

func outcomeWith(change func(ev map[string]any)) func(testing.TB) []byte {
	return func(tb testing.TB) []byte { ev := goodOutcome(); change(ev); return encode(tb, ev) }
}

// borrowedWith returns a valid admission in which eng borrowed 300 tokens from acme, then
// extra.
func borrowedWith(extra map[string]any) func(testing.TB) []byte {
	return admittedWith(func(ev map[string]any) {
		data(ev)["borrowed"] = []any{map[string]any{"account": "eng", "from": "acme", "unit": "tokens", "units": 300}, extra}
	})
}

// Grant ids for tests.
const (
	grant1 = "gr_0123456789abcdef0123456789abcdef"
	grant2 = "gr_fedcba9876543210fedcba9876543210"
)

// creditsWith returns a valid admission that drew 1000 tokens from acme's grant1, then
// extra.
func creditsWith(extra map[string]any) func(testing.TB) []byte {
	return admittedWith(func(ev map[string]any) {
		data(ev)["credits"] = []any{map[string]any{"account": "acme", "unit": "tokens", "grant": grant1, "units": 1000}, extra}
	})
}

func raw(s string) func(testing.TB) []byte { return func(testing.TB) []byte { return []byte(s) } }

var malformed = []malformedCase{
	{"not JSON", raw("hello"), "not a CloudEvent in JSON"},
	{"empty value", raw(""), "not a CloudEvent in JSON"},
	{"JSON array", raw(`[1,2]`), "not a CloudEvent in JSON"},
	{"wrong specversion", admittedWith(func(ev map[string]any) { ev["specversion"] = "0.3" }), `specversion "0.3"`},
	{"unknown type", admittedWith(func(ev map[string]any) { ev["type"] = "io.metergate.usage.refunded.v1" }), "type \"io.metergate.usage.refunded.v1\""},
	{"missing id", admittedWith(func(ev map[string]any) { delete(ev, "id") }), "id: missing"},
	{"id with a space", admittedWith(func(ev map[string]any) { ev["id"] = "a b" }), "id \"a b\""},
	{"missing source", admittedWith(func(ev map[string]any) { delete(ev, "source") }), "source: missing"},
	{"bad time", admittedWith(func(ev map[string]any) { ev["time"] = "yesterday" }), "not a CloudEvent in JSON"},
	{"missing time", admittedWith(func(ev map[string]any) { delete(ev, "time") }), "time: missing"},
	{"time in 1970", admittedWith(func(ev map[string]any) { ev["time"] = "1970-01-01T00:00:00Z" }), "want a year in 2000-2199"},
	{"xml content", admittedWith(func(ev map[string]any) { ev["datacontenttype"] = "application/xml" }), "datacontenttype"},
	{"missing data", admittedWith(func(ev map[string]any) { delete(ev, "data") }), "data: missing"},
	{"data not an object", admittedWith(func(ev map[string]any) { ev["data"] = []int{1} }), "data: missing or not a JSON object"},
	{"missing org", admittedWith(func(ev map[string]any) { delete(data(ev), "org") }), "data.org: missing"},
	{"missing path", admittedWith(func(ev map[string]any) { delete(data(ev), "path") }), "data.path: missing"},
	{"org is not path[0]", admittedWith(func(ev map[string]any) { data(ev)["org"] = "other" }), `data.org "other" is not data.path[0] "acme"`},
	{"account is not the last of path", admittedWith(func(ev map[string]any) { data(ev)["account"] = "alice" }), "is not the last of data.path"},
	{"path kinds out of order", admittedWith(func(ev map[string]any) {
		data(ev)["path"].([]any)[1].(map[string]any)["kind"] = "agent"
	}), "data.path[2].kind"},
	{"bad account id", admittedWith(func(ev map[string]any) {
		data(ev)["path"].([]any)[3].(map[string]any)["account"] = "agent 1"
		data(ev)["account"] = "agent 1"
	}), "not an account id"},
	{"negative units", admittedWith(func(ev map[string]any) { data(ev)["units"] = map[string]any{"tokens": -5} }), "data.units.tokens = -5: want at least 0"},
	{"unknown unit", admittedWith(func(ev map[string]any) { data(ev)["units"] = map[string]any{"gpus": 1} }), `unknown unit "gpus"`},
	{"fractional units", admittedWith(func(ev map[string]any) { data(ev)["units"] = map[string]any{"tokens": 1.5} }), "data: json: cannot unmarshal"},
	{"units as a string", admittedWith(func(ev map[string]any) { data(ev)["units"] = map[string]any{"tokens": "5"} }), "data: json: cannot unmarshal"},
	{"bad period", admittedWith(func(ev map[string]any) { data(ev)["period"] = "2026-13" }), `data.period "2026-13"`},
	{"short period", admittedWith(func(ev map[string]any) { data(ev)["period"] = "2026-1" }), `data.period "2026-1"`},
	{"missing period", admittedWith(func(ev map[string]any) { delete(data(ev), "period") }), `data.period ""`},
	{"NUL in the plan", admittedWith(func(ev map[string]any) { data(ev)["plan"] = "pro\x00" }), "data.plan"},
	{"borrower not in the path", borrowedWith(map[string]any{"account": "bob", "from": "alice", "unit": "tokens", "units": 1}),
		`data.borrowed[1].account "bob": not an account of data.path below the org`},
	{"the org borrowing", borrowedWith(map[string]any{"account": "acme", "from": "acme", "unit": "tokens", "units": 1}),
		`data.borrowed[1].account "acme"`},
	{"lender not the parent", borrowedWith(map[string]any{"account": "alice", "from": "acme", "unit": "tokens", "units": 1}),
		`data.borrowed[1].from "acme": want "eng"`},
	{"borrowed unknown unit", borrowedWith(map[string]any{"account": "alice", "from": "eng", "unit": "gpus", "units": 1}),
		`data.borrowed[1].unit "gpus": unknown`},
	{"borrowed nothing", borrowedWith(map[string]any{"account": "alice", "from": "eng", "unit": "tokens", "units": 0}),
		"data.borrowed[1].units = 0: want more than 0"},
	{"borrowed negative", borrowedWith(map[string]any{"account": "alice", "from": "eng", "unit": "tokens", "units": -3}),
		"data.borrowed[1].units = -3"},
	{"borrowed twice", borrowedWith(map[string]any{"account": "eng", "from": "acme", "unit": "tokens", "units": 2}),
		"data.borrowed[1]: eng borrowed tokens twice"},
	{"borrowed fraction", borrowedWith(map[string]any{"account": "alice", "from": "eng", "unit": "tokens", "units": 1.5}),
		"data: json: cannot unmarshal"},
	{"drawn from an account not in the path", creditsWith(map[string]any{"account": "bob", "unit": "tokens", "grant": grant2, "units": 1}),
		`data.credits[1].account "bob": not an account of data.path`},
	{"drawn in an unknown unit", creditsWith(map[string]any{"account": "eng", "unit": "gpus", "grant": grant2, "units": 1}),
		`data.credits[1].unit "gpus": unknown`},
	{"drawn from no grant", creditsWith(map[string]any{"account": "eng", "unit": "tokens", "units": 1}),
		`data.credits[1].grant "": want gr_`},
	{"drawn from a bad grant id", creditsWith(map[string]any{"account": "eng", "unit": "tokens", "grant": "gr_0123456789ABCDEF0123456789abcdef", "units": 1}),
		`data.credits[1].grant "gr_0123456789ABCDEF0123456789abcdef"`},
	{"drew nothing", creditsWith(map[string]any{"account": "eng", "unit": "tokens", "grant": grant2, "units": 0}),
		"data.credits[1].units = 0: want more than 0"},
	{"drew a negative amount", creditsWith(map[string]any{"account": "eng", "unit": "tokens", "grant": grant2, "units": -5}),
		"data.credits[1].units = -5"},
	{"drew a grant twice", creditsWith(map[string]any{"account": "acme", "unit": "tokens", "grant": grant1, "units": 2}),
		"data.credits[1]: grant " + grant1 + " drawn twice"},
	{"one grant of two accounts", creditsWith(map[string]any{"account": "eng", "unit": "tokens", "grant": grant1, "units": 2}),
		"data.credits[1]: grant " + grant1 + " drawn twice"},
	{"drew a fraction", creditsWith(map[string]any{"account": "eng", "unit": "tokens", "grant": grant2, "units": 1.5}),
		"data: json: cannot unmarshal"},
	{"outcome status 600", outcomeWith(func(ev map[string]any) { data(ev)["status"] = 600 }), "data.status 600: want 100-599"},
	{"outcome without status", outcomeWith(func(ev map[string]any) { delete(data(ev), "status") }), "data.status 0"},
	{"outcome id is not event_id/outcome", outcomeWith(func(ev map[string]any) { ev["id"] = "something-else" }), `id "something-else"`},
	{"outcome without event_id", outcomeWith(func(ev map[string]any) { delete(data(ev), "event_id") }), "data.event_id: missing"},
	{"outcome negative units", outcomeWith(func(ev map[string]any) { data(ev)["units"] = map[string]any{"tokens": -1} }), "data.units.tokens = -1"},
}

func TestParseRefusesMalformed(t *testing.T) {
	t.Parallel()
	for _, tc := range malformed {
		t.Run(tc.name, func(t *testing.T) {
			values := [][]byte{tc.value(t)}
			var ce event.CloudEvent
			if json.Unmarshal(values[0], &ce) == nil { // also as admit encodes it (decodeFast)
				values = append(values, encode(t, ce))
			}
			for _, value := range values {
				p := parse(value, 3, 7)
				require.Error(t, p.err)
				require.Nil(t, p.usage)
				require.Nil(t, p.outcome)
				require.Contains(t, p.err.Error(), tc.err)
			}
		})
	}
}

func TestParseAdmitted(t *testing.T) {
	t.Parallel()
	value := encode(t, goodAdmitted())
	p := parse(value, 3, 7)
	require.NoError(t, p.err)
	require.Equal(t, p, parse(asAdmit(t, value), 3, 7), "the same as admit encodes it")
	tokens, requests, credits, cost := int64(2500), int64(1), int64(3), int64(1200)
	require.Equal(t, &usageRow{
		EventID:       "01a20805-4cb6-7888-ab2c-e1f1eb68e89e.12.acme",
		BillingPeriod: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		EventTime:     time.Date(2026, 11, 23, 10, 47, 20, 294404000, time.UTC),
		ChargedPeriod: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		Org:           "acme", Account: "agent-1", AccountKind: "agent", Path: []string{"acme", "eng", "alice", "agent-1"},
		APIKeyID: "key_d08a26640bf29096", IdempotencyKey: "req-7f3a", Plan: "pro", Tool: "llm_call", Source: "node-1",
		Units:     units{Requests: &requests, Tokens: &tokens, Credits: &credits, CostMicros: &cost},
		Partition: 3, Offset: 7,
	}, p.usage)
}

func TestParseBorrowed(t *testing.T) {
	t.Parallel()
	ev := goodAdmitted()
	data(ev)["borrowed"] = []any{
		map[string]any{"account": "eng", "from": "acme", "unit": "tokens", "units": 300},
		map[string]any{"account": "agent-1", "from": "alice", "unit": "requests", "units": 1},
		map[string]any{"account": "eng", "from": "acme", "unit": "requests", "units": 9223372036854775807},
	}
	value := encode(t, ev)
	p := parse(value, 3, 7)
	require.NoError(t, p.err)
	require.Equal(t, p, parse(asAdmit(t, value), 3, 7), "the same as admit encodes it")
	require.Equal(t, []borrowRow{
		{Account: "eng", Lender: "acme", Unit: "tokens", Units: 300},
		{Account: "agent-1", Lender: "alice", Unit: "requests", Units: 1},
		{Account: "eng", Lender: "acme", Unit: "requests", Units: 9223372036854775807},
	}, p.usage.Borrowed)

	for _, none := range []any{[]any{}, nil} {
		data(ev)["borrowed"] = none
		p = parse(encode(t, ev), 3, 7)
		require.NoError(t, p.err)
		require.Nil(t, p.usage.Borrowed)
	}
}

func TestParseCredits(t *testing.T) {
	t.Parallel()
	ev := goodAdmitted()
	data(ev)["credits"] = []any{
		map[string]any{"account": "acme", "unit": "tokens", "grant": grant1, "units": 1000},
		map[string]any{"account": "acme", "unit": "tokens", "grant": grant2, "units": 200},
		map[string]any{"account": "agent-1", "unit": "cost_micros", "grant": "gr_00000000000000000000000000000000", "units": 9223372036854775807},
	}
	data(ev)["borrowed"] = []any{map[string]any{"account": "eng", "from": "acme", "unit": "tokens", "units": 300}}
	value := encode(t, ev)
	p := parse(value, 3, 7)
	require.NoError(t, p.err)
	require.Equal(t, p, parse(asAdmit(t, value), 3, 7), "the same as admit encodes it")
	require.Equal(t, []creditRow{
		{Account: "acme", Unit: "tokens", Grant: grant1, Units: 1000},
		{Account: "acme", Unit: "tokens", Grant: grant2, Units: 200},
		{Account: "agent-1", Unit: "cost_micros", Grant: "gr_00000000000000000000000000000000", Units: 9223372036854775807},
	}, p.usage.Credits)
	require.Len(t, p.usage.Borrowed, 1)

	for _, none := range []any{[]any{}, nil} {
		data(ev)["credits"] = none
		p = parse(encode(t, ev), 3, 7)
		require.NoError(t, p.err)
		require.Nil(t, p.usage.Credits)
	}
}

func TestParseShortPathAndBoundaries(t *testing.T) {
	t.Parallel()
	ev := goodAdmitted()
	data(ev)["path"] = []any{map[string]any{"account": "acme", "kind": "org"}, map[string]any{"account": "bot", "kind": "agent"}}
	data(ev)["account"] = "bot"
	data(ev)["units"] = map[string]any{}
	// Nanoseconds are cut to PostgreSQL's microseconds before the month is taken: the last
	// instant of November stays in November, in Go as in the database.
	ev["time"] = "2026-11-30T23:59:59.9999999Z"
	// Another offset: the billing month is taken in UTC.
	p := parse(encode(t, ev), 0, 0)
	require.NoError(t, p.err)
	require.Equal(t, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), p.usage.BillingPeriod)
	require.Equal(t, time.Date(2026, 11, 30, 23, 59, 59, 999999000, time.UTC), p.usage.EventTime)
	require.Equal(t, units{}, p.usage.Units)
	require.Equal(t, []string{"acme", "bot"}, p.usage.Path)

	ev["time"] = "2026-12-01T00:30:00+01:00"
	p = parse(encode(t, ev), 0, 0)
	require.NoError(t, p.err)
	require.Equal(t, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), p.usage.BillingPeriod)
}

func TestParseOutcome(t *testing.T) {
	t.Parallel()
	value := encode(t, goodOutcome())
	p := parse(value, 1, 2)
	require.NoError(t, p.err)
	require.Equal(t, p, parse(asAdmit(t, value), 1, 2), "the same as admit encodes it")
	tokens := int64(1870)
	require.Equal(t, &outcomeRow{
		EventID: "01a20805-4cb6-7888-ab2c-e1f1eb68e89e.12.acme", Status: 200, Units: units{Tokens: &tokens},
		OutcomeTime: time.Date(2026, 11, 23, 10, 47, 46, 851154000, time.UTC), Source: "node-1", Partition: 1, Offset: 2,
	}, p.outcome)
}

// The meter recognizes the outcome ids admit makes.
func TestOutcomeIDIsAdmissions(t *testing.T) {
	t.Parallel()
	require.Equal(t, admission.OutcomeID("e1.2.acme"), "e1.2.acme"+outcomeSuffix)
}

// FuzzParse: no input makes parse panic, and whatever it accepts holds the invariants the
// tables' constraints check (so that no accepted message can stop the pipeline).
func FuzzParse(f *testing.F) {
	f.Add(encode(f, goodAdmitted()))
	f.Add(encode(f, goodOutcome()))
	f.Add(encode(f, voidedEvent(f, "e1.2.acme", "e1.2.acme", event.VoidUnavailable, time.Now())))
	f.Add(borrowedWith(map[string]any{"account": "alice", "from": "eng", "unit": "requests", "units": 2})(f))
	f.Add(creditsWith(map[string]any{"account": "alice", "unit": "cost_micros", "grant": grant2, "units": 2})(f))
	for _, tc := range malformed {
		f.Add(tc.value(f))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		p := parse(value, 0, 0)
		switch {
		case p.err != nil:
			require.Nil(t, p.usage)
			require.Nil(t, p.outcome)
			require.Nil(t, p.void)
		case p.usage != nil:
			r := p.usage
			require.Equal(t, period.MonthStart(r.EventTime), r.BillingPeriod)
			require.Equal(t, 1, r.ChargedPeriod.Day())
			require.Equal(t, r.Org, r.Path[0])
			require.Equal(t, r.Account, r.Path[len(r.Path)-1])
			for _, u := range []*int64{r.Units.Requests, r.Units.Tokens, r.Units.Credits, r.Units.CostMicros} {
				require.True(t, u == nil || *u >= 0)
			}
			seen := map[[2]string]bool{}
			for _, b := range r.Borrowed {
				require.Positive(t, b.Units)
				i := slices.Index(r.Path, b.Account)
				require.Positive(t, i, "borrower %q below the org", b.Account)
				require.Equal(t, r.Path[i-1], b.Lender)
				require.NotEqual(t, b.Account, b.Lender)
				require.Contains(t, []string{"requests", "tokens", "credits", "cost_micros"}, b.Unit)
				require.False(t, seen[[2]string{b.Account, b.Unit}], "borrowed twice")
				seen[[2]string{b.Account, b.Unit}] = true
			}
			grants := map[string]bool{}
			for _, c := range r.Credits {
				require.Positive(t, c.Units)
				require.Contains(t, r.Path, c.Account)
				require.Contains(t, []string{"requests", "tokens", "credits", "cost_micros"}, c.Unit)
				require.Regexp(t, `^gr_[0-9a-f]{32}$`, c.Grant) // credit_grants.id's check
				require.False(t, grants[c.Grant], "grant drawn twice")
				grants[c.Grant] = true
			}
			for _, s := range append([]string{r.EventID, r.Source, r.Plan, r.Tool, r.IdempotencyKey, r.APIKeyID, r.AccountKind}, r.Path...) {
				require.False(t, strings.ContainsRune(s, 0), "NUL in %q", s)
			}
		case p.outcome != nil:
			require.True(t, p.outcome.Status >= 100 && p.outcome.Status <= 599)
			require.NotEmpty(t, p.outcome.EventID)
		case p.void != nil:
			require.Contains(t, []string{event.VoidUnavailable, event.VoidCallerGone}, p.void.Reason)
			require.NotEmpty(t, p.void.EventID)
			require.NotEmpty(t, p.void.Attempt)
		default:
			t.Fatal("parse returned nothing")
		}
	})
}

// asAdmit re-encodes a message the way admit encodes one (json.Marshal of event.CloudEvent:
// the envelope's members in the struct's order), which encode's maps do not.
func asAdmit(tb testing.TB, value []byte) []byte {
	tb.Helper()
	var ce event.CloudEvent
	require.NoError(tb, json.Unmarshal(value, &ce))
	return encode(tb, ce)
}

// BenchmarkParse is parse of an admission as admit encodes it. One op = one message.
//
//	go test -run '^$' -bench Parse ./internal/meter/
func BenchmarkParse(b *testing.B) {
	value := asAdmit(b, encode(b, goodAdmitted()))
	b.ReportAllocs()
	b.SetBytes(int64(len(value)))
	for b.Loop() {
		if p := parse(value, 3, 7); p.err != nil {
			b.Fatal(p.err)
		}
	}
}
