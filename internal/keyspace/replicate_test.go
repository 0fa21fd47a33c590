package keyspace_test

import (
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// WaitReplicated returns only once the replica holds what the primary took before the
// call, and reports a replica that does not acknowledge in time as ErrNotReplicated.
func TestWaitReplicated(t *testing.T) {
	t.Parallel()
	p, r := private.StartRedisReplicated(t)
	primary := redis.NewClient(&redis.Options{Addr: p.Addr()})
	replicaOpts := &redis.Options{Addr: r.Addr()}
	replica := redis.NewClient(replicaOpts)
	t.Cleanup(func() { _ = primary.Close(); _ = replica.Close() })
	ctx := testenv.Context(t, time.Minute)
	key := keyspace.Keys{Prefix: testenv.Prefix(t) + "mg", Shards: 4}.Outbox(1)

	// The replica is busy when the write is made: the answer waits until it holds it.
	stall := 400 * time.Millisecond
	done, err := private.StallRedis(ctx, replicaOpts, stall)
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, primary.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []string{"e", "1"}}).Err())
	require.NoError(t, keyspace.WaitReplicated(ctx, primary, key, 1, 5*time.Second))
	// The stall had begun before the write; WaitReplicated waited for most of it.
	require.GreaterOrEqual(t, time.Since(start), stall/2, "returned before the busy replica acknowledged")
	require.NoError(t, <-done)
	n, err := replica.XLen(ctx, key).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the entry is on the replica when WaitReplicated returns")

	done, err = private.StallRedis(ctx, replicaOpts, 1500*time.Millisecond)
	require.NoError(t, err)
	err = keyspace.WaitReplicated(ctx, primary, key, 1, 50*time.Millisecond)
	require.ErrorIs(t, err, keyspace.ErrNotReplicated)
	require.Contains(t, err.Error(), "0 of 1")
	require.NoError(t, <-done)
	require.NoError(t, keyspace.WaitReplicated(ctx, primary, key, 1, 5*time.Second), "the replica is back")
}

// On a Cluster the fence and the WAIT go to the master of the key's slot: with the
// replicas of one master cut, the keys it serves are short of a replica and every other
// key is not (a WAIT sent to another node would answer for that node's replicas).
func TestWaitReplicatedOnCluster(t *testing.T) {
	t.Parallel()
	cluster := private.StartRedisCluster(t, 3, 1)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := testenv.Context(t, time.Minute)
	keys := keyspace.Keys{Prefix: testenv.Prefix(t) + "mg", Shards: keyspace.DefaultShards}
	cut := cluster.MasterOf(keys.Outbox(0))
	defer cluster.CutReplicas(cut)()
	var short, acked int
	for shard := range keys.Shards {
		key := keys.Outbox(shard)
		if cluster.MasterOf(key) == cut {
			err := keyspace.WaitReplicated(ctx, rdb, key, 1, 100*time.Millisecond)
			require.ErrorIs(t, err, keyspace.ErrNotReplicated, "shard %d", shard)
			require.Contains(t, err.Error(), "0 of 1")
			short++
		} else {
			// A healthy replica acknowledges at once; the timeout only allows for a busy machine.
			require.NoError(t, keyspace.WaitReplicated(ctx, rdb, key, 1, 10*time.Second), "shard %d", shard)
			acked++
		}
		require.NoError(t, keyspace.WaitReplicated(ctx, rdb, key, 0, 100*time.Millisecond), "shard %d", shard)
	}
	require.Positive(t, short)
	require.Positive(t, acked)
}
