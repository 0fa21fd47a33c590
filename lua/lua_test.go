package lua_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/lua"
)

// The suite runs on a single Redis and on the 3-master Redis Cluster: every call's keys
// share one hash tag, so each call touches one slot.
func TestAdjust(t *testing.T) {
	t.Parallel()
	targets := map[string]func(*testing.T) redis.UniversalClient{
		"redis":   func(t *testing.T) redis.UniversalClient { return testenv.Redis(t) },
		"cluster": func(t *testing.T) redis.UniversalClient { return testenv.RedisCluster(t) },
	}
	for name, open := range targets {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rdb := open(t)
			for i := range 8 { // several hash tags, so on the cluster several masters run it
				testAdjust(t, rdb, testenv.Prefix(t)+"{"+string(rune('a'+i))+"}:")
			}
		})
	}
}

func testAdjust(t *testing.T, rdb redis.UniversalClient, p string) {
	ctx := testenv.Context(t, 30*time.Second)
	marker, quota, hash := p+"adj:1", p+"quota:requests:2026-11", p+"org"
	t.Cleanup(func() { rdb.Del(ctx, marker, quota, hash) })
	require.NoError(t, rdb.Set(ctx, quota, 10, 0).Err())
	require.NoError(t, rdb.HSet(ctx, hash, "q:tokens", 2500).Err())

	keys := []string{marker, quota, hash}
	args := []any{-3, 60_000, "", "q:tokens"}
	got, err := lua.Adjust.Run(ctx, rdb, keys, args...).Int64Slice()
	require.NoError(t, err)
	require.Equal(t, []int64{1, 10, 7, 2500, 2497}, got)

	// A replay (a crashed caller running the same correction again) changes nothing and
	// reports what the first call did.
	for range 3 {
		got, err = lua.Adjust.Run(ctx, rdb, keys, args...).Int64Slice()
		require.NoError(t, err)
		require.Equal(t, []int64{0, 10, 7, 2500, 2497}, got)
	}
	require.Equal(t, "7", rdb.Get(ctx, quota).Val())
	require.Equal(t, "2497", rdb.HGet(ctx, hash, "q:tokens").Val())
	require.Greater(t, rdb.PTTL(ctx, marker).Val(), 50*time.Second)

	// A counter that does not exist yet starts at 0.
	got, err = lua.Adjust.Run(ctx, rdb, []string{p + "adj:2", p + "fresh"}, 5, 60_000, "").Int64Slice()
	require.NoError(t, err)
	require.Equal(t, []int64{1, 0, 5}, got)
	t.Cleanup(func() { rdb.Del(ctx, p+"adj:2", p+"fresh") })

	for _, bad := range [][]any{{"1.5", 1000, ""}, {"x", 1000, ""}, {1, 0, ""}} {
		err = lua.Adjust.Run(ctx, rdb, []string{p + "adj:bad", p + "fresh"}, bad...).Err()
		require.Error(t, err, "args %v", bad)
	}
	require.Equal(t, "5", rdb.Get(ctx, p+"fresh").Val(), "a refused call changes nothing")
}
