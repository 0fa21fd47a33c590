package invoice_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/invoice"
)

// BenchmarkClose closes January for 3,000 orgs on the pro plan, one event of 6,000,000
// requests each (a base fee and an overage tier), in a schema of its own per iteration
// (made with the timer stopped). Compare two commits by copying this file to the other.
func BenchmarkClose(b *testing.B) {
	const orgs = 3000
	jan := month(2025, time.January)
	for range b.N {
		b.StopTimer()
		tb := setup(b)
		_, err := tb.pool.Exec(tb.ctx, `insert into accounts (id, kind, org, plan, created_at)
			select 'org-' || g, 'org', 'org-' || g, 'pro', '2020-01-01' from generate_series(1, $1) g`, orgs)
		require.NoError(b, err)
		_, err = tb.pool.Exec(tb.ctx, `select usage_events_partition($1)`, jan)
		require.NoError(b, err)
		_, err = tb.pool.Exec(tb.ctx, `
			insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind,
			                          path, source, requests, tokens, late, kafka_partition, kafka_offset)
			select 'ev-' || g, $1, $2, $1, 'org-' || g, 'org-' || g, 'org', array['org-' || g], 'test', 6000000, 0, false, 0, g
			from generate_series(1, $3) g`, jan, jan.Add(time.Hour), orgs)
		require.NoError(b, err)
		b.StartTimer()
		res, err := invoice.Close(tb.ctx, tb.pool, jan, invoice.Options{Force: true})
		require.NoError(b, err)
		require.Len(b, res.Invoices, orgs)
	}
}
