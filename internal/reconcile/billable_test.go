package reconcile_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/reconcile"
	"github.com/metergate/metergate/internal/testenv"
)

// billableCase is one admitted request of alice (1 request, 100 tokens estimated) and how it
// ended, with what it must bill.
type billableCase struct {
	name           string
	status         int    // the outcome's status; 0: no outcome
	actualRequests *int64 // reported by the outcome
	actualTokens   *int64
	void           string // the void's reason; "": not voided
	bills          [2]int64
}

// The rule, spelled out once more by hand: a 5xx or a void bills nothing, otherwise each unit
// bills the outcome's actual units when reported, else what was admitted.
var billableCases = []billableCase{
	{name: "no outcome", bills: [2]int64{1, 100}},
	{name: "200", status: 200, bills: [2]int64{1, 100}},
	{name: "200 tokens", status: 200, actualTokens: ptr(40), bills: [2]int64{1, 40}},
	{name: "200 requests and tokens", status: 200, actualRequests: ptr(3), actualTokens: ptr(250), bills: [2]int64{3, 250}},
	{name: "200 zero tokens", status: 200, actualTokens: ptr(0), bills: [2]int64{1, 0}},
	{name: "404 tokens", status: 404, actualTokens: ptr(7), bills: [2]int64{1, 7}},
	{name: "499", status: 499, bills: [2]int64{1, 100}},
	{name: "500", status: 500, bills: [2]int64{0, 0}},
	{name: "503 tokens", status: 503, actualTokens: ptr(40), bills: [2]int64{0, 0}},
	{name: "599", status: 599, bills: [2]int64{0, 0}},
	{name: "void", void: "caller_gone", bills: [2]int64{0, 0}},
	{name: "void 200 tokens", void: "unavailable", status: 200, actualTokens: ptr(40), bills: [2]int64{0, 0}},
	{name: "void 500", void: "caller_gone", status: 500, bills: [2]int64{0, 0}},
}

func (b *testBundle) billableCases(t *testing.T) time.Time {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	at := b.cur.Add(time.Hour)
	for _, c := range billableCases {
		b.event(t, c.name, at, at, 1, 100)
		if c.status != 0 {
			b.offset++
			_, err := b.pool.Exec(ctx, `insert into usage_outcomes (event_id, status, requests, tokens, outcome_time, source, kafka_partition, kafka_offset)
values ($1, $2, $3, $4, now(), 'test', 0, $5)`, c.name, c.status, c.actualRequests, c.actualTokens, b.offset)
			require.NoError(t, err)
		}
		if c.void != "" {
			b.void(t, c.name, c.void)
		}
	}
	return at
}

// billableEvents reads what each event bills from view, by event id.
func (b *testBundle) billableEvents(t *testing.T, view string) map[string][2]int64 {
	t.Helper()
	rows, err := b.pool.Query(testenv.Context(t, 30*time.Second),
		`select event_id, billable_requests, billable_tokens, billable_credits, billable_cost_micros from `+view)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string][2]int64{}
	for rows.Next() {
		var (
			id                   string
			req, tok, cred, cost int64
		)
		require.NoError(t, rows.Scan(&id, &req, &tok, &cred, &cost))
		require.Zero(t, cred+cost, "%s: no credits or cost were admitted or reported", id)
		out[id] = [2]int64{req, tok}
	}
	require.NoError(t, rows.Err())
	return out
}

// "Billable" is defined once, in PostgreSQL (migrations/00009_billable.sql): billable_events
// and the finance view bill each request as the rule says.
func TestBillableEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	b.billableCases(t)
	want := map[string][2]int64{}
	for _, c := range billableCases {
		want[c.name] = c.bills
	}
	require.Equal(t, want, b.billableEvents(t, "billable_events"))
	require.Equal(t, want, b.billableEvents(t, "finance_billable_events"))
}

// The Go side of reconcile follows that definition: its corrections bring each counter, at
// every level, from what each event charged to what it bills, per event and unit, and the
// counters then hold the billable totals.
func TestCorrectionsBringCountersToBillable(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	at := b.billableCases(t)
	run(t, b.opts())
	require.Empty(t, verify(t, b))

	rows, err := b.pool.Query(testenv.Context(t, 30*time.Second), `select source_event, account, unit, kind, sum(amount)::bigint
from adjustments where kind in ('refund_5xx', 'refund_void', 'settle_tokens') group by 1, 2, 3, 4`)
	require.NoError(t, err)
	type key struct{ event, account, unit string }
	got := map[key]string{}
	for rows.Next() {
		var (
			k      key
			kind   string
			amount int64
		)
		require.NoError(t, rows.Scan(&k.event, &k.account, &k.unit, &kind, &amount))
		got[k] = fmt.Sprintf("%s %+d", kind, amount)
	}
	require.NoError(t, rows.Err())

	want := map[key]string{}
	var total [2]int64
	for _, c := range billableCases {
		kind := reconcile.SettleTokens
		switch {
		case c.void != "":
			kind = reconcile.RefundVoid
		case c.status >= 500:
			kind = reconcile.Refund5xx
		}
		for i, u := range []policy.Unit{policy.Requests, policy.Tokens} {
			total[i] += c.bills[i]
			if d := c.bills[i] - []int64{1, 100}[i]; d != 0 {
				for _, acc := range []string{org, team} {
					want[key{c.name, acc, string(u)}] = fmt.Sprintf("%s %+d", kind, d)
				}
			}
		}
	}
	require.Equal(t, want, got, "one correction per event, level and unit: billable − admitted")
	for _, acc := range []string{org, team} {
		require.Equal(t, total[0], b.counter(t, acc, policy.Requests, at), acc)
		require.Equal(t, total[1], b.counter(t, acc, policy.Tokens, at), acc)
	}
}
