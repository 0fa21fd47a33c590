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

// Both `reconcile -migrate` and `reconcile migrate` leave a migrated schema; the second
// does not need Redis.
func TestMigrate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		redisURL string
		args     []string
	}{
		"run with -migrate":  {testenv.RedisURL(t), []string{"-migrate"}},
		"migrate subcommand": {"redis://" + testenv.FreeAddr(t) + "/0", []string{"migrate"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, schema := testenv.EmptySchema(t)
			p := testenv.StartMain(t, []string{
				"REDIS_URL=" + tc.redisURL, "REDIS_CLUSTER_ADDRS=",
				"DATABASE_URL=" + testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
			}, tc.args...)
			code, err := p.Wait(time.Minute)
			require.NoError(t, err)
			require.Equal(t, 0, code, p.Output())
			var n int
			require.NoError(t, pool.QueryRow(testenv.Context(t, time.Minute), `select count(*) from dead_letters`).Scan(&n))
		})
	}
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
