package invoice_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The SQL twin of the pricing (price_usage, used by the tie-out view) charges what the Go
// pricing does, around every tier boundary of the seeded plans.
func TestPriceUsageMatchesGo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := loadFixture(t)
	for _, up := range f.Plan.Units {
		var qs []int64
		for _, tier := range append(f.Plan.Units[0].Tiers, up.Tiers...) {
			for _, d := range []int64{-1, 0, 1, 99_999, 123_457} {
				qs = append(qs, max(0, tier.From+d), max(0, tier.UpTo+d))
			}
		}
		for _, q := range append(qs, 0, 21_345_679, 110_000_001) {
			want, err := up.Amount(q)
			require.NoError(t, err)
			require.Equal(t, want, b.count(t, `select price_usage('pro', 1, $1, $2)::bigint`, up.Unit, q), "%s %d", up.Unit, q)
		}
	}
}

// Monthly usage keeps refunded (5xx) requests as a column instead of dropping them, and
// settles tokens to the actual tokens of the outcome.
func TestUsageViewsFlagRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro", "acme/eng")
	jan := month(2025, time.January)
	b.event(t, event{path: "acme/eng", at: jan.Add(time.Hour), requests: 1, tokens: 100})
	b.event(t, event{path: "acme/eng", at: jan.Add(2 * time.Hour), requests: 1, tokens: 100, status: 503})
	settled := b.event(t, event{path: "acme", at: jan.Add(3 * time.Hour), requests: 1, tokens: 2500, status: 200})
	_, err := b.pool.Exec(b.ctx, `update usage_outcomes set tokens = 1800 where event_id = $1`, settled)
	require.NoError(t, err)

	type row struct {
		refunded                  bool
		events, requests, billReq int64
		tokens, billTokens        int64
	}
	rows, err := b.pool.Query(b.ctx, `select refunded, events, requests::bigint, billable_requests::bigint, tokens::bigint, billable_tokens::bigint
		from finance_usage_by_org where org = 'acme' and billing_period = $1 order by refunded`, jan)
	require.NoError(t, err)
	var got []row
	for rows.Next() {
		var r row
		require.NoError(t, rows.Scan(&r.refunded, &r.events, &r.requests, &r.billReq, &r.tokens, &r.billTokens))
		got = append(got, r)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []row{
		{refunded: false, events: 2, requests: 2, billReq: 2, tokens: 2600, billTokens: 1900},
		{refunded: true, events: 1, requests: 1, billReq: 0, tokens: 100, billTokens: 0},
	}, got)
	require.Equal(t, int64(1), b.count(t, `select count(*) from finance_usage_by_account where account_path = 'acme/eng' and refunded`))

	_, err = b.pool.Exec(b.ctx, `insert into dead_letters (topic, "partition", "offset", value, error) values ('usage.events', 0, 7, '\xff00', 'bad json')`)
	require.NoError(t, err)
	require.Equal(t, int64(2), b.count(t, `select bytes from finance_dead_letters where error = 'bad json'`))
}
