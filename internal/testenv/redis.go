package testenv

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

// redisImage is the image testcontainers-go starts when REDIS_URL is unset.
const redisImage = "redis:7"

var redisContainer container[string]

// RedisURL returns the URL of the test Redis.
func RedisURL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	if !dockerAvailable() {
		Unavailable(tb, "Redis", "REDIS_URL", "REDIS_URL unset and no Docker daemon")
	}
	u, err := redisContainer.get(func(ctx context.Context) (string, testcontainers.Container, error) {
		c, err := tcredis.Run(ctx, redisImage)
		if err != nil {
			return "", c, err
		}
		u, err := c.ConnectionString(ctx)
		return u, c, err
	})
	if err != nil {
		Unavailable(tb, "Redis", "REDIS_URL", "testcontainers: "+err.Error())
	}
	return u
}

// Redis returns a client of the test Redis that answers PING; it is closed when the test
// ends. Share the server with other tests through Prefix.
func Redis(tb testing.TB) *redis.Client {
	tb.Helper()
	opts, err := redis.ParseURL(RedisURL(tb))
	if err != nil {
		tb.Fatalf("REDIS_URL: %v", err)
	}
	c := redis.NewClient(opts)
	tb.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(Context(tb, 10*time.Second)).Err(); err != nil {
		Unavailable(tb, "Redis", "REDIS_URL", err.Error())
	}
	return c
}

// EachRedis runs f as two parallel subtests, "redis" against the single test server and
// "cluster" against the 3-master Redis Cluster: code that must behave the same on both.
func EachRedis(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient)) {
	t.Helper()
	for _, name := range []string{"redis", "cluster"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if name == "redis" {
				f(t, Redis(t))
			} else {
				f(t, RedisCluster(t))
			}
		})
	}
}

// clusterAddrsEnv names the seeds of the test Redis Cluster in .run/env. It is not the
// binaries' REDIS_CLUSTER_ADDRS: a shell that sourced .run/env has REDIS_URL too, which the
// binaries refuse beside a Cluster.
const clusterAddrsEnv = "METERGATE_TEST_REDIS_CLUSTER_ADDRS"

// RedisCluster returns a client of the test Redis Cluster (METERGATE_TEST_REDIS_CLUSTER_ADDRS)
// once the cluster reports state ok. There is no container fallback: `make up-cluster`
// starts one.
func RedisCluster(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	env := os.Getenv(clusterAddrsEnv)
	if env == "" {
		Unavailable(tb, "Redis Cluster", clusterAddrsEnv, clusterAddrsEnv+" unset")
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(env, ",")})
	tb.Cleanup(func() { _ = c.Close() })
	info, err := c.ClusterInfo(Context(tb, 10*time.Second)).Result()
	if err != nil {
		Unavailable(tb, "Redis Cluster", clusterAddrsEnv, err.Error())
	}
	if !strings.Contains(info, "cluster_state:ok") {
		Unavailable(tb, "Redis Cluster", clusterAddrsEnv, "cluster_state is not ok")
	}
	return c
}

// Prefix returns a Redis key prefix unique to this test, "t:<name>:". Put a hash tag after
// it ("t:x:{3}:...") where keys must share a Redis Cluster slot.
func Prefix(tb testing.TB) string { return "t:" + Name(tb) + ":" }
