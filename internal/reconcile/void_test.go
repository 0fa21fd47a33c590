package reconcile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/reconcile"
	"github.com/metergate/metergate/internal/testenv"
)

func (b *testBundle) void(t *testing.T, id, reason string) {
	t.Helper()
	b.offset++
	_, err := b.pool.Exec(testenv.Context(t, 30*time.Second), `insert into usage_voids (event_id, attempt, reason, void_time, source, kafka_partition, kafka_offset)
values ($1, $1, $2, now(), 'test', 0, $3)`, id, reason, b.offset)
	require.NoError(t, err)
}

// Ten requests of 100 tokens, three of them voided (nobody was told 200; one of those even
// reported a 200 outcome, which a void overrides): every quota level gives back exactly three
// requests and 300 tokens as refund_void, once; the finance view bills the seven others.
func TestRefundVoid(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	at := b.cur.Add(time.Hour)
	for i := range 10 {
		id := fmt.Sprintf("ev-%d", i)
		b.event(t, id, at, at, 1, 100)
		switch i {
		case 0:
			b.void(t, id, "unavailable")
		case 1:
			b.void(t, id, "caller_gone")
		case 2:
			b.void(t, id, "caller_gone")
			b.outcome(t, id, 200, nil)
		case 3:
			b.outcome(t, id, 200, ptr(40)) // settled, not voided
		}
	}
	b.void(t, "ev-never-admitted", "unavailable") // its script call never ran: nothing to refund

	s := run(t, b.opts())
	require.Equal(t, map[reconcile.Kind]int{reconcile.RefundVoid: 12, reconcile.SettleTokens: 2}, s.ByKind,
		"3 voided events × 2 quota levels × 2 units; one settlement × 2 levels")
	for _, acc := range []string{org, team} {
		require.Equal(t, int64(7), b.counter(t, acc, policy.Requests, at), acc)
		require.Equal(t, int64(700-60), b.counter(t, acc, policy.Tokens, at), acc)
	}
	require.Empty(t, verify(t, b))
	again := run(t, b.opts())
	require.Zero(t, again.AdjustmentsPlanned, "a void is refunded once")

	var requests, tokens, voided int64
	require.NoError(t, b.pool.QueryRow(context.Background(), `select sum(billable_requests), sum(billable_tokens),
  count(*) filter (where voided and refunded) from finance_billable_events`).Scan(&requests, &tokens, &voided))
	require.Equal(t, []int64{7, 640, 3}, []int64{requests, tokens, voided})
}
