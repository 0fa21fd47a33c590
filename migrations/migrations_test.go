package migrations_test

import (
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.EmptySchema(t)
	ctx := testenv.Context(t, time.Minute)
	exists := func(table string) bool {
		var ok bool
		require.NoError(t, pool.QueryRow(ctx,
			`select exists (select 1 from information_schema.tables where table_schema = $1 and table_name = $2)`,
			schema, table).Scan(&ok))
		return ok
	}

	applied, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.NotEmpty(t, applied)
	require.True(t, exists("dead_letters"))

	again, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, again, "a second run applies nothing")

	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	down, err := p.DownTo(ctx, 0)
	require.NoError(t, err)
	require.Len(t, down, len(applied), "every migration rolls back")
	require.False(t, exists("dead_letters"))

	reapplied, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, applied, reapplied)
	require.True(t, exists("dead_letters"))
}

func TestPackageSchemaIsMigrated(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := testenv.Context(t, time.Minute)
	topic := "t." + testenv.Name(t) // the package schema outlives one run of the test (-count)
	_, err := pool.Exec(ctx, `insert into dead_letters (topic, "partition", "offset", value, error) values ($1, 0, 1, '\x00', 'e')`, topic)
	require.NoError(t, err)
	// The same Kafka position twice is kept once.
	_, err = pool.Exec(ctx, `insert into dead_letters (topic, "partition", "offset", value, error) values ($1, 0, 1, '\x00', 'e')`, topic)
	require.Error(t, err)
}
