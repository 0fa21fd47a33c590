package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/staff"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

// admit staff adds a member (its token authenticates), lists it, revokes it (its token is
// refused), and each change is an audit row; a bad invocation is refused before anything.
func TestAdmitStaff(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.EmptySchema(t)
	ctx := testenv.Context(t, time.Minute)
	_, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	pg := config.Postgres{URL: testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema), MaxConns: 2}

	require.NoError(t, runStaff(ctx, config.Staff{Postgres: pg, Create: "Fiona", Role: "finance"}))
	s := staff.NewStore(pool)
	all, err := s.List(ctx)
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Equal(t, staff.Finance, all[0].Role)
	require.Equal(t, "admit staff", all[0].CreatedBy)

	require.NoError(t, runStaff(ctx, config.Staff{Postgres: pg, Revoke: all[0].ID}))
	require.Error(t, runStaff(ctx, config.Staff{Postgres: pg, Revoke: all[0].ID}), "revoked already")
	entries, err := s.Entries(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.Equal(t, "admit staff -revoke", entries[0].Route)
	require.NotContains(t, string(entries[1].After), "mgs_", "the token is not kept")

	log := config.Log{Level: "info", Format: "text"}
	for _, bad := range []config.Staff{
		{Log: log, Postgres: pg},
		{Log: log, Postgres: pg, Create: "x", Role: "root"},
		{Log: log, Postgres: pg, Create: "x", Role: "viewer", List: true},
		{Log: log, Postgres: pg, Revoke: "st_x", Role: "viewer"},
	} {
		require.Error(t, bad.Validate(), "%+v", bad)
	}
	require.NoError(t, config.Staff{Log: log, Postgres: pg, List: true}.Validate())
	require.NoError(t, config.Staff{Log: log, Postgres: pg, Create: "x", Role: "viewer"}.Validate())
}
