package lua_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/lua"
)

// grant.lua, grant_void.lua and grant_balance.lua on one grant's keys (one hash tag), on a
// single Redis and on the Cluster. internal/credit tests them through the store.
func TestGrantScripts(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := testenv.Context(t, 30*time.Second)
		p := testenv.Prefix(t) + "{7}:"
		rem, terms, marker := p+"g:acme:credits", p+"g:acme:credits|terms", p+"g:acme:credits|void:gr_1"
		keys := []string{rem, terms, marker}
		t.Cleanup(func() { rdb.Del(ctx, rem, terms, marker) })

		code, err := lua.GrantMirror.Run(ctx, rdb, keys, "gr_1", 100, "5|1000|0").Text()
		require.NoError(t, err)
		require.Equal(t, "mirrored", code)
		require.NoError(t, rdb.HIncrBy(ctx, rem, "gr_1", -30).Err()) // a draw
		code, err = lua.GrantMirror.Run(ctx, rdb, keys, "gr_1", 100, "5|1000|0").Text()
		require.NoError(t, err)
		require.Equal(t, "present", code)
		require.Equal(t, "70", rdb.HGet(ctx, rem, "gr_1").Val(), "a second mirror adds nothing")
		require.Equal(t, "5|1000|0", rdb.HGet(ctx, terms, "gr_1").Val())
		for _, bad := range []any{0, -1, "1.5", "x"} {
			require.Error(t, lua.GrantMirror.Run(ctx, rdb, []string{p + "g:x", p + "g:x|terms", p + "g:x|void:gr_2"}, "gr_2", bad, "0|0|0").Err(), "amount %v", bad)
		}

		got, err := lua.GrantBalance.Run(ctx, rdb, []string{rem, terms}).Slice()
		require.NoError(t, err)
		require.Len(t, got, 4)
		require.Equal(t, []any{"gr_1", "70"}, got[2])
		require.Equal(t, []any{"gr_1", "5|1000|0"}, got[3])

		voided, err := lua.GrantVoid.Run(ctx, rdb, keys, "gr_1", 60_000).Int64Slice()
		require.NoError(t, err)
		require.Equal(t, []int64{1, 70}, voided)
		require.False(t, rdb.HExists(ctx, terms, "gr_1").Val(), "a voided grant leaves no terms")
		require.NoError(t, rdb.HSet(ctx, rem, "gr_1", 5).Err()) // whatever Redis holds later
		voided, err = lua.GrantVoid.Run(ctx, rdb, keys, "gr_1", 60_000).Int64Slice()
		require.NoError(t, err)
		require.Equal(t, []int64{0, 70}, voided, "a retry answers what the void took")
		require.Greater(t, rdb.PTTL(ctx, marker).Val(), 50*time.Second)
		require.NoError(t, rdb.HDel(ctx, rem, "gr_1").Err())
		code, err = lua.GrantMirror.Run(ctx, rdb, keys, "gr_1", 100, "5|1000|0").Text()
		require.NoError(t, err)
		require.Equal(t, "voided", code)
		require.Zero(t, rdb.HLen(ctx, rem).Val(), "a voided grant is not mirrored back")
		require.Error(t, lua.GrantVoid.Run(ctx, rdb, []string{rem, terms, p + "g:acme:credits|void:gr_3"}, "gr_3", 0).Err())
	})
}
