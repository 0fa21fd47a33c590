package private_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
)

// A private cluster's master killed: its replica is promoted with what was written (and
// replicated) before, and the killed node comes back as a replica.
func TestPrivateRedisCluster(t *testing.T) {
	t.Parallel()
	c := private.StartRedisCluster(t, 3, 1)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer rdb.Close()
	ctx := testenv.Context(t, 2*time.Minute)
	// SET, then WAIT on the same connection to the key's master: the replica has the write
	// before its master dies. (WAIT through the cluster client goes to any node, on any
	// connection, and counts replicas of nothing.)
	owner, err := rdb.MasterForKey(ctx, "{k}")
	if err != nil {
		t.Fatalf("the master of {k}: %v", err)
	}
	conn := owner.Conn()
	if err := conn.Set(ctx, "{k}", "v", 0).Err(); err != nil {
		t.Fatalf("set on the private cluster: %v", err)
	}
	if n, err := conn.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d replicas, %v", n, err)
	}
	_ = conn.Close()
	master := c.MasterOf("{k}")
	c.KillMaster(master)
	killed := time.Now()
	promoted, err := c.WaitPromotion(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s promoted %s after %s was killed", promoted, time.Since(killed).Round(time.Millisecond), master)
	if got := c.MasterOf("{k}"); got != promoted {
		t.Fatalf("MasterOf after the promotion = %s, want %s", got, promoted)
	}
	// go-redis keeps dialing the dead master until its next periodic state reload
	// (go-redis issue #3979): reload now.
	rdb.ReloadState(ctx)
	got, err := rdb.Get(ctx, "{k}").Result()
	if err != nil || got != "v" {
		t.Fatalf("GET on the promoted replica = %q, %v; want v", got, err)
	}
	c.Restart(master)
	if got := c.MasterOf("{k}"); got != promoted {
		t.Fatalf("after the old master's restart MasterOf = %s, want %s still", got, promoted)
	}
}
