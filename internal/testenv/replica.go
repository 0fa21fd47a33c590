package testenv

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartRedisReplicated starts a private Redis primary and a replica of it (neither with
// persistence) and returns them once the replica is in sync.
func StartRedisReplicated(tb testing.TB) (primary, replica *RedisServer) {
	tb.Helper()
	primary, replica = StartRedis(tb), StartRedis(tb)
	c := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	defer func() { _ = c.Close() }()
	ctx := Context(tb, time.Minute)
	host, port, err := net.SplitHostPort(primary.Addr())
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		tb.Fatalf("REPLICAOF %s: %v", primary.Addr(), err)
	}
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return primary, replica
		}
		if ctx.Err() != nil {
			tb.Fatalf("replica %s not in sync with %s within a minute: %v", replica.Addr(), primary.Addr(), err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}
