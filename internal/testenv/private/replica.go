package private

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/testenv"
)

// StartRedisReplicated starts a private Redis primary and a replica of it (neither with
// persistence) and returns them once the replica is in sync.
func StartRedisReplicated(tb testing.TB) (primary, replica *RedisServer) {
	tb.Helper()
	primary, replica = StartRedis(tb), StartRedis(tb)
	c := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	defer func() { _ = c.Close() }()
	ctx := testenv.Context(tb, time.Minute)
	host, port, err := net.SplitHostPort(primary.Addr())
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		tb.Fatalf("REPLICAOF %s: %v", primary.Addr(), err)
	}
	if err := WaitReplicaInSync(ctx, replica.Addr()); err != nil {
		tb.Fatalf("replica of %s: %v", primary.Addr(), err)
	}
	return primary, replica
}

// replicaInSync reports what keeps the Redis at addr from being a replica in sync with its
// primary: a replication link not up, or a sync in progress.
func replicaInSync(ctx context.Context, addr string) error {
	repl, err := info(ctx, addr, "replication")
	if err != nil {
		return err
	}
	if infoField(repl, "master_link_status") != "up" || infoField(repl, "master_sync_in_progress") != "0" {
		return fmt.Errorf("%s: replication link %s, sync in progress %s", addr,
			infoField(repl, "master_link_status"), infoField(repl, "master_sync_in_progress"))
	}
	return nil
}

// WaitReplicaInSync polls replicaInSync until it passes or ctx ends.
func WaitReplicaInSync(ctx context.Context, addr string) error {
	for {
		err := replicaInSync(ctx, addr)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not in sync: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
