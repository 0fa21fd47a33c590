package keyspace

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated says writes reached the primary but fewer replicas than asked for
// acknowledged them within the timeout (or the WAIT failed). The writes may still be lost
// in a failover: the admission engine answers such a decision as an outcome unknown (503,
// and the decision voided), the relay produces nothing it read.
var ErrNotReplicated = errors.New("redis: writes not acknowledged by enough replicas")

// DefaultWaitTimeout is the longest WaitReplicated of the admission engine and the relay
// (ADMIT_REDIS_WAIT_TIMEOUT).
const DefaultWaitTimeout = 100 * time.Millisecond

// WaitReplicated returns once n replicas hold every write the primary holding key took
// before the call, waiting at most timeout: it writes a key of key's slot (key + ":fence")
// and sends WAIT in the same pipeline. Short of n it returns ErrNotReplicated. The relay
// calls it before it produces what it read, so that Kafka never receives an entry (a
// usage event, a void) that a failover could take back from Redis.
func WaitReplicated(ctx context.Context, rdb redis.UniversalClient, key string, n int, timeout time.Duration) error {
	c, cc, err := MasterFor(ctx, rdb, key)
	if err != nil {
		return err
	}
	var fence *redis.StatusCmd
	var wait *redis.Cmd
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error { // each command's own error is read below
		fence = p.Set(ctx, key+":fence", "1", time.Hour)
		wait = p.Do(ctx, "WAIT", n, timeout.Milliseconds())
		return nil
	})
	if err := fence.Err(); err != nil {
		ReloadIfMoved(ctx, cc, err)
		return err
	}
	return Replicated(wait, n, timeout)
}

// Replicated reads the reply of a WAIT sent with n and timeout: ErrNotReplicated unless n
// replicas acknowledged in time.
func Replicated(wait *redis.Cmd, n int, timeout time.Duration) error {
	got, err := wait.Int64()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotReplicated, err)
	}
	if got < int64(n) {
		return fmt.Errorf("%w: %d of %d within %s", ErrNotReplicated, got, n, timeout)
	}
	return nil
}

// ReloadIfMoved reloads a Cluster's slot map (cc; nil off a Cluster) when err says the
// slot is no longer where the call went (a failover): the next call finds its new master.
func ReloadIfMoved(ctx context.Context, cc *redis.ClusterClient, err error) {
	if cc != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "CLUSTERDOWN")) {
		cc.ReloadState(ctx)
	}
}

// MasterFor returns what sends commands to the primary holding key: rdb itself, or on a
// Cluster the client of key's master (then also the cluster client, to reload its slots
// with ReloadIfMoved). A WAIT counts the writes of the connection it is sent on, so it
// must go where the writes went; and the master's own client does not retry a command
// whose connection died after it was sent, as the cluster client does.
func MasterFor(ctx context.Context, rdb redis.UniversalClient, key string) (redis.Cmdable, *redis.ClusterClient, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return rdb, nil, nil
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	return node, cc, nil
}
