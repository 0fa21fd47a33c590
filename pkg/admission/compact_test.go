package admission

import (
	"bufio"
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
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
		"1|e|s|||||acme|pro||1|1|2026-11", "1|e|s|||||acme|pro|acme:org|1|1000000|2026-11"} {
		_, v, err = OutboxMessage(map[string]any{"e": e})
		require.ErrorIs(t, err, ErrMalformedEntry, e)
		require.Equal(t, e, string(v))
	}
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
