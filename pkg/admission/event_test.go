package admission

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/pkg/event"
	"github.com/metergate/metergate/pkg/policy"
)

// The event pieces built by hand are, byte for byte, what encoding/json makes of the same
// event: the meter's fast decoder and every consumer see one layout.
func TestAdmittedEventIsJSON(t *testing.T) {
	pol := policy.Resolved{Org: "acme", Plan: "pro", Memo: new(policy.Memo), Path: []policy.Level{
		{Account: "acme", Kind: policy.Org}, {Account: "eng", Kind: policy.Team},
		{Account: "alice", Kind: policy.User}, {Account: "agent-1", Kind: policy.Agent}}}
	requests := []Request{
		{EventID: "e1", Source: "node-1", Policy: pol, Units: map[policy.Unit]int64{policy.Requests: 1}},
		{EventID: "e2", Source: "node-1", Policy: pol, APIKeyID: "k1", IdempotencyKey: "idem-1", Tool: "web_search",
			Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500, policy.Credits: 3, policy.CostMicros: 0}},
		{EventID: "e3", Source: `odd "node" <&>`, Policy: pol, IdempotencyKey: `a\b"c<d>&é`, Tool: "tool\u2028x",
			Units: map[policy.Unit]int64{policy.Tokens: 9_000_000_000}},
		{EventID: "e4", Source: "n", Policy: policy.Resolved{Org: "solo", Path: []policy.Level{{Account: "solo", Kind: policy.Org}}},
			Units: map[policy.Unit]int64{}},
	}
	for _, r := range requests {
		st := newEventStatic(r.Policy)
		head, middle, tail := admittedEvent(r, &st)
		got := head + "2026-11-23T10:00:00.000000Z" + middle + "2026-11" + tail

		data, err := json.Marshal(r.Admitted("2026-11"))
		require.NoError(t, err)
		want := `{"specversion":"1.0","id":` + quote(r.EventID) + `,"source":` + quote(r.Source) +
			`,"type":` + quote(event.TypeAdmitted) + `,"subject":` + quote(event.Subject(r.Admitted("").Path)) +
			`,"time":"2026-11-23T10:00:00.000000Z","datacontenttype":"application/json","data":` + string(data) + `}`
		require.Equal(t, want, got)
		require.True(t, json.Valid([]byte(got)), got)
	}
}

// A compact entry with borrowings renders, byte for byte, what encoding/json makes of the
// event with event.Admitted.Borrowed, in the order the script recorded them, each lent by
// the account's parent in the path.
func TestBorrowedEventIsJSON(t *testing.T) {
	pol := policy.Resolved{Org: "acme", Plan: "pro", Path: []policy.Level{
		{Account: "acme", Kind: policy.Org}, {Account: "team-a", Kind: policy.Team},
		{Account: "user-1", Kind: policy.User}, {Account: "agent.x_1", Kind: policy.Agent}}}
	r := Request{EventID: "e1.3.acme", Source: "node-1", Policy: pol, APIKeyID: "k1", Tool: "llm_call",
		Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500}}
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
		st := newEventStatic(pol)
		e := compactEvent(r, &st) + strconv.FormatInt(at.Unix(), 10) + "|294404|2026-11"
		if tc.field != "-" {
			e += "|" + tc.field
		}
		key, got, err := OutboxMessage(map[string]any{"e": e})
		require.NoError(t, err, e)
		require.Equal(t, "acme", key)

		a := r.Admitted("2026-11")
		a.Borrowed = tc.want
		data, err := json.Marshal(a)
		require.NoError(t, err)
		want := `{"specversion":"1.0","id":"e1.3.acme","source":"node-1","type":` + quote(event.TypeAdmitted) +
			`,"subject":"acme/team-a/user-1/agent.x_1","time":"2026-11-23T10:47:20.294404Z","datacontenttype":"application/json","data":` +
			string(data) + `}`
		require.Equal(t, want, string(got), e)

		var ce event.CloudEvent
		require.NoError(t, json.Unmarshal(got, &ce))
		var back event.Admitted
		require.NoError(t, json.Unmarshal(ce.Data, &back))
		require.Equal(t, tc.want, back.Borrowed)
	}
}

// A compact entry with credit draws renders, byte for byte, what encoding/json makes of the
// event with event.Admitted.Credits, in the order the script drew them, after the
// borrowings if any.
func TestCreditsEventIsJSON(t *testing.T) {
	pol := policy.Resolved{Org: "acme", Plan: "pro", Path: []policy.Level{
		{Account: "acme", Kind: policy.Org}, {Account: "team-a", Kind: policy.Team},
		{Account: "user-1", Kind: policy.User}}}
	r := Request{EventID: "e1.3.acme", Source: "node-1", Policy: pol, IdempotencyKey: "i-1", Tool: "llm_call",
		Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 1200, policy.CostMicros: 1500}}
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
		st := newEventStatic(pol)
		e := compactEvent(r, &st) + strconv.FormatInt(at.Unix(), 10) + "|999999|2026-11|" + tc.fields
		key, got, err := OutboxMessage(map[string]any{"e": e})
		require.NoError(t, err, e)
		require.Equal(t, "acme", key)

		a := r.Admitted("2026-11")
		a.Borrowed, a.Credits = tc.borrowed, tc.want
		data, err := json.Marshal(a)
		require.NoError(t, err)
		want := `{"specversion":"1.0","id":"e1.3.acme","source":"node-1","type":` + quote(event.TypeAdmitted) +
			`,"subject":"acme/team-a/user-1","time":"2026-11-30T23:59:59.999999Z","datacontenttype":"application/json","data":` +
			string(data) + `}`
		require.Equal(t, want, string(got), e)

		var ce event.CloudEvent
		require.NoError(t, json.Unmarshal(got, &ce))
		var back event.Admitted
		require.NoError(t, json.Unmarshal(ce.Data, &back))
		require.Equal(t, tc.want, back.Credits)
		require.Equal(t, tc.borrowed, back.Borrowed)
	}
}

// What an Admitter derives from a policy stays its own: another Admitter (another key
// prefix) deciding with the same policy gets its own keys.
func TestLimitsArePerAdmitter(t *testing.T) {
	limit := policy.Limit{Algorithm: policy.TokenBucket, RatePerS: 10, Burst: 20}
	pol := policy.Resolved{Org: "acme", Memo: new(policy.Memo), Path: []policy.Level{
		{Account: "acme", Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: limit}}}}
	r := Request{EventID: "e1", Policy: pol, Units: map[policy.Unit]int64{policy.Requests: 1}}
	for _, prefix := range []string{"one", "two", "one"} {
		keys, _, err := New(nil, Options{KeyPrefix: prefix}).ScriptCall(r)
		require.NoError(t, err)
		require.Len(t, keys, 2)
		require.Regexp(t, `^`+prefix+`\{\d+\}:s:acme$`, keys[1], "the org's state hash")
	}
}
