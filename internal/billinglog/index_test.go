package billinglog_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

// The lookup's index (migration 00021) is on every partition of usage_events: those that
// existed when it was created, and those the meter adds later (usage_events_partition).
func TestIndexReachesEveryPartition(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.EmptySchema(t)
	ctx := testenv.Context(t, time.Minute)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 20)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `select usage_events_partition('2031-01-01')`)
	require.NoError(t, err)
	_, err = p.Up(ctx)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `select usage_events_partition('2031-02-01')`)
	require.NoError(t, err)

	for _, part := range []string{"usage_events_2031_01", "usage_events_2031_02"} {
		var def string
		require.NoError(t, pool.QueryRow(ctx, `
select pg_get_indexdef(i.indexrelid)
from pg_index i
join pg_inherits h on h.inhrelid = i.indexrelid
where i.indrelid = to_regclass($1) and h.inhparent = 'usage_events_idempotency_idx'::regclass`, part).Scan(&def), part)
		require.Contains(t, def, "(account, idempotency_key) WHERE (idempotency_key IS NOT NULL)", part)
	}
}
