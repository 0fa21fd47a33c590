package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.MainOrTests(m, main)) }

func TestRunOnceWithMigrate(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.EmptySchema(t)
	p := testenv.StartMain(t, []string{
		"REDIS_URL=" + testenv.RedisURL(t),
		"REDIS_CLUSTER_ADDRS=",
		"DATABASE_URL=" + testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
	}, "-migrate")
	code, err := p.Wait(time.Minute)
	require.NoError(t, err)
	require.Equal(t, 0, code, p.Output())
	var n int
	require.NoError(t, pool.QueryRow(testenv.Context(t, time.Minute), `select count(*) from dead_letters`).Scan(&n))
}

func TestUnreachableRedisFails(t *testing.T) {
	t.Parallel()
	p := testenv.StartMain(t, []string{"REDIS_URL=redis://" + testenv.FreeAddr(t) + "/0", "REDIS_CLUSTER_ADDRS="})
	code, err := p.Wait(time.Minute)
	require.NoError(t, err)
	require.Equal(t, 1, code, p.Output())
	require.True(t, strings.Contains(p.Output(), "redis"), p.Output())
}

func TestBadSetting(t *testing.T) {
	t.Parallel()
	p := testenv.StartMain(t, []string{"DATABASE_MAX_CONNS=0"})
	code, err := p.Wait(time.Minute)
	require.NoError(t, err)
	require.Equal(t, 2, code)
	require.Contains(t, p.Output(), "DATABASE_MAX_CONNS=0")
}

func TestMigrateSubcommand(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.EmptySchema(t)
	// Redis is not needed to migrate: an unreachable one does not matter.
	p := testenv.StartMain(t, []string{
		"REDIS_URL=redis://" + testenv.FreeAddr(t) + "/0", "REDIS_CLUSTER_ADDRS=",
		"DATABASE_URL=" + testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
	}, "migrate")
	code, err := p.Wait(time.Minute)
	require.NoError(t, err)
	require.Equal(t, 0, code, p.Output())
	var n int
	require.NoError(t, pool.QueryRow(testenv.Context(t, time.Minute), `select count(*) from dead_letters`).Scan(&n))
}
