package wire

import (
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/pkg/event"
)

// FuzzRoundTrip: a request's fields written in the compact form (Compact, CompactPolicy),
// stamped and completed as lua/admit.lua does ("<sec>|<usec>|<period>", then
// "|<borrowed>", "|<credits>" and "|<refusal>" when there are), rendered by the relay
// (OutboxMessage) and read by the meter's decoder (DecodeFast, else encoding/json as the
// meter falls back) are the same fields. DecodeFast takes every event whose strings are
// printable ASCII without a character JSON escapes.
func FuzzRoundTrip(f *testing.F) {
	f.Add("01a20ad9-148d-78fb-a967-f5cd45a1595b.7.acme", "admit-1", "key-1", "idem-1", "llm_call", "pro", "acme", "eng", "alice",
		int64(1), int64(2500), int64(-1), int64(1795430400), int64(294404), uint8(11), uint8(3), int64(300), int64(1500), uint8(0))
	f.Add("e|%7C", `odd "node" <&>`, "", `a\b"c%|`, "tool\u2028x", "", "solo", "", "",
		int64(0), int64(9_000_000_000), int64(0), int64(0), int64(0), uint8(0), uint8(0), int64(0), int64(0), uint8(1))
	f.Add("e2", "n", "k", "", "", "free", "o", "t-1", "u.2",
		int64(-1), int64(-1), int64(7), int64(253402300799), int64(999999), uint8(12), uint8(2), int64(1), int64(0), uint8(3))
	f.Fuzz(func(t *testing.T, id, source, apiKey, idem, tool, plan, org, team, user string,
		requests, tokens, costMicros, sec, usec int64, month, depth uint8, borrow, draw int64, refusal uint8) {
		for _, s := range []string{id, source, apiKey, idem, tool, plan} {
			if !utf8.ValidString(s) {
				t.Skip("encoding/json writes invalid UTF-8 as U+FFFD: not the same field back")
			}
		}
		// What internal/policy lets an account be (one id, one node), and what Redis TIME can be.
		accounts := []string{org, team, user}
		for i, a := range accounts {
			if !policy.ValidID(a) || slices.Contains(accounts[:i], a) {
				accounts[i] = "acct-" + strconv.Itoa(i)
			}
		}
		sec, usec = max(0, sec)%253402300800, max(0, usec)%1_000_000
		kinds := []policy.Kind{policy.Org, policy.Team, policy.User}
		pol := policy.Resolved{Org: accounts[0], Plan: plan}
		for i := range int(depth)%3 + 1 {
			pol.Path = append(pol.Path, policy.Level{Account: accounts[i], Kind: kinds[i]})
		}
		r := request{Compact{EventID: id, Source: source, APIKeyID: apiKey, IdempotencyKey: idem, Tool: tool,
			Units: map[policy.Unit]int64{}}, pol}
		for u, n := range map[policy.Unit]int64{policy.Requests: requests, policy.Tokens: tokens, policy.CostMicros: costMicros} {
			if n >= 0 { // a negative amount: the request does not carry the unit
				r.Units[u] = n
			}
		}
		at := time.Unix(sec, usec*1000).UTC()
		charged := at.Format("2006-01")
		if m := at.AddDate(0, int(month)%13-6, 0); m.Year() >= 1970 && m.Year() <= 9999 {
			charged = m.Format("2006-01") // a month next to the event's: the script's choice
		}
		want := r.admitted(charged)

		// The script's tail: a borrowing by the account under the org, a draw from the
		// org's grant, a refusal shadow mode let pass.
		var borrowed, credits, shadow string
		if borrow > 0 && len(pol.Path) > 1 {
			borrowed = pol.Path[1].Account + ":tokens=" + strconv.FormatInt(borrow, 10)
			want.Borrowed = []event.Borrowing{{Account: pol.Path[1].Account, From: pol.Org, Unit: "tokens", Units: borrow}}
		}
		if draw > 0 {
			credits = pol.Org + ":cost_micros:" + grant1 + "=" + strconv.FormatInt(draw, 10)
			want.Credits = []event.CreditDraw{{Account: pol.Org, Unit: "cost_micros", Grant: grant1, Units: draw}}
		}
		if refusal%4 > 0 {
			shadow = []string{"rate_limited", "quota_exceeded", "insufficient_balance"}[refusal%4-1]
			want.ShadowRefusal = shadow
		}
		tail := ""
		switch {
		case shadow != "":
			tail = "|" + borrowed + "|" + credits + "|" + shadow
		case credits != "":
			tail = "|" + borrowed + "|" + credits
		case borrowed != "":
			tail = "|" + borrowed
		}

		e := r.entry(at, charged, tail)
		key, value, err := OutboxMessage(map[string]any{"e": e})
		require.NoError(t, err, "entry %q", e)
		require.Equal(t, pol.Org, key)

		got, fast := DecodeFast(value)
		plain := true
		for _, s := range []string{id, source, apiKey, idem, tool, plan} {
			plain = plain && plainString(s)
		}
		require.Equal(t, plain, fast, "DecodeFast takes %q", value)
		if !fast {
			require.NoError(t, json.Unmarshal(value, &got.CloudEvent))
			got.Admitted = new(event.Admitted)
			require.NoError(t, json.Unmarshal(got.CloudEvent.Data, got.Admitted))
		}
		ce := got.CloudEvent
		require.Equal(t, "1.0", ce.SpecVersion)
		require.Equal(t, id, ce.ID)
		require.Equal(t, source, ce.Source)
		require.Equal(t, event.TypeAdmitted, ce.Type)
		require.Equal(t, event.Subject(want.Path), ce.Subject)
		require.True(t, at.Equal(ce.Time), "time %s, want %s", ce.Time, at)
		require.Equal(t, "application/json", ce.DataContentType)
		require.NotNil(t, got.Admitted)
		require.Equal(t, want, *got.Admitted)
	})
}
