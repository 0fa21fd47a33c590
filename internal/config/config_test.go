package config_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/config"
)

// envMap serves m, with valid admit tokens unless m sets them.
func envMap(m map[string]string) func(string) (string, bool) {
	base := map[string]string{"ADMIT_SERVICE_TOKEN": "service-token-0123456789", "ADMIT_ADMIN_TOKEN": "admin-token-0123456789"}
	return func(k string) (string, bool) {
		if v, ok := m[k]; ok {
			return v, true
		}
		v, ok := base[k]
		return v, ok
	}
}

func TestDefaults(t *testing.T) {
	var c config.Admit
	validateOnly, err := config.Load(&c, "admit", nil, envMap(nil), io.Discard)
	require.NoError(t, err)
	require.False(t, validateOnly)
	require.Equal(t, "127.0.0.1:8080", c.Server.Addr)
	require.Equal(t, "usage.events", c.Kafka.Topic)
	require.Equal(t, 12, c.Kafka.Partitions)
	require.Equal(t, []string{"127.0.0.1:9092"}, c.Kafka.Brokers)
	require.Equal(t, 15*time.Second, c.Server.ShutdownTimeout)

	var m config.Meter
	_, err = config.Load(&m, "meter", nil, envMap(nil), io.Discard)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8081", m.Server.Addr)
}

func TestEnvironmentAndFlags(t *testing.T) {
	env := envMap(map[string]string{
		"KAFKA_BROKERS":    " a:1, b:2 ,,",
		"KAFKA_TOPIC":      "from-env",
		"MIGRATE":          "true",
		"SHUTDOWN_TIMEOUT": "3s",
	})
	var c config.Admit
	validateOnly, err := config.Load(&c, "admit", []string{"-kafka-topic", "from-flag", "-validate"}, env, io.Discard)
	require.NoError(t, err)
	require.True(t, validateOnly)
	require.Equal(t, []string{"a:1", "b:2"}, c.Kafka.Brokers)
	require.Equal(t, "from-flag", c.Kafka.Topic, "a flag wins over its variable")
	require.True(t, c.Migrate)
	require.Equal(t, 3*time.Second, c.Server.ShutdownTimeout)
}

func TestEveryBadSettingIsNamed(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"unparsable values", map[string]string{"KAFKA_TOPIC_PARTITIONS": "twelve", "SHUTDOWN_TIMEOUT": "soon", "MIGRATE": "perhaps"},
			nil, []string{"KAFKA_TOPIC_PARTITIONS", "SHUTDOWN_TIMEOUT", "MIGRATE"}},
		{"invalid values", map[string]string{"ADMIT_ADDR": "nonsense", "LOG_LEVEL": "loud", "LOG_FORMAT": "xml",
			"REDIS_URL": "http://x", "DATABASE_URL": "::::", "KAFKA_BROKERS": "nohostport", "KAFKA_TOPIC": "bad topic!"},
			nil, []string{"ADMIT_ADDR", "LOG_LEVEL", "LOG_FORMAT", "REDIS_URL", "DATABASE_URL", "KAFKA_BROKERS", "KAFKA_TOPIC"}},
		{"bad flag", nil, []string{"-kafka-topic-partitions", "0"}, []string{"KAFKA_TOPIC_PARTITIONS=0"}},
		{"unknown flag", nil, []string{"-no-such-thing"}, []string{"no-such-thing"}},
		{"stray argument", nil, []string{"extra"}, []string{"unexpected arguments"}},
		{"cluster seeds", map[string]string{"REDIS_CLUSTER_ADDRS": "127.0.0.1:7000,bad"}, nil, []string{`REDIS_CLUSTER_ADDRS: "bad"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c config.Admit
			_, err := config.Load(&c, "admit", tt.args, envMap(tt.env), io.Discard)
			require.Error(t, err)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestSectionPrefixes(t *testing.T) {
	var c config.Meter
	_, err := config.Load(&c, "meter", nil, envMap(map[string]string{"METER_GROUP": "", "KAFKA_TOPIC": ""}), io.Discard)
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	require.Contains(t, lines, "meter: METER_GROUP: must not be empty")
	require.Contains(t, lines, `kafka: KAFKA_TOPIC="": want 1-249 of [a-zA-Z0-9._-]`)
}

func TestHelp(t *testing.T) {
	var c config.Reconcile
	var out strings.Builder
	_, err := config.Load(&c, "reconcile", []string{"-h"}, envMap(nil), &out)
	require.ErrorIs(t, err, flag.ErrHelp)
	require.Contains(t, out.String(), "-database-url")
	require.Contains(t, out.String(), "(env DATABASE_URL)")
}

func TestAdmission(t *testing.T) {
	var c config.Admit
	_, err := config.Load(&c, "admit", nil, envMap(map[string]string{"ADMIT_TOOL_CREDITS": "web_search=2, deep_think=40"}), io.Discard)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"web_search": 2, "deep_think": 40}, c.Admission.ToolCredits)
	require.Equal(t, 16, c.Admission.Shards)

	_, err = config.Load(&c, "admit", nil, envMap(map[string]string{
		"ADMIT_SERVICE_TOKEN": "short", "ADMIT_ADMIN_TOKEN": "short", "ADMIT_SHARDS": "0",
		"ADMIT_IDEMPOTENCY_TTL": "59s", "ADMIT_REDIS_DOWN_QUOTA": "maybe", "ADMIT_TOOL_CREDITS": "x=-1,y",
		"ADMIT_MAX_ESTIMATES": "-1",
	}), io.Discard)
	require.Error(t, err)
	for _, want := range []string{"ADMIT_SERVICE_TOKEN", "ADMIT_ADMIN_TOKEN: must be set", "must differ", "ADMIT_SHARDS=0",
		"ADMIT_IDEMPOTENCY_TTL=59s: want at least 1m0s", "ADMIT_REDIS_DOWN_QUOTA", `"x=-1"`, `"y"`, "ADMIT_MAX_ESTIMATES=-1"} {
		require.Contains(t, err.Error(), want)
	}
}

// The idempotency window defaults to 24h (as before the bucket layout), may be set as low
// as a minute and no lower; the legacy record lookup is on unless turned off.
func TestIdempotencyWindow(t *testing.T) {
	tokens := map[string]string{"ADMIT_SERVICE_TOKEN": "service-token-0123", "ADMIT_ADMIN_TOKEN": "admin-token-012345"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range tokens {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	var c config.Admit
	_, err := config.Load(&c, "admit", nil, envMap(with()), io.Discard)
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, c.Admission.IdempotencyTTL)
	require.True(t, c.Admission.IdempotencyLegacy)

	c = config.Admit{}
	_, err = config.Load(&c, "admit", nil, envMap(with("ADMIT_IDEMPOTENCY_TTL", "1m", "ADMIT_IDEMPOTENCY_LEGACY", "false")), io.Discard)
	require.NoError(t, err)
	require.Equal(t, time.Minute, c.Admission.IdempotencyTTL)
	require.False(t, c.Admission.IdempotencyLegacy)

	c = config.Admit{}
	_, err = config.Load(&c, "admit", nil, envMap(with("ADMIT_IDEMPOTENCY_TTL", "59s")), io.Discard)
	require.ErrorContains(t, err, "ADMIT_IDEMPOTENCY_TTL=59s: want at least 1m0s")

	// The billing log: on by default, off with a hot window of 0.
	c = config.Admit{}
	_, err = config.Load(&c, "admit", nil, envMap(with()), io.Discard)
	require.NoError(t, err)
	require.Equal(t, [2]time.Duration{10 * time.Minute, 10 * time.Second}, [2]time.Duration{c.Admission.IdempotencyHot, c.Admission.IdempotencyMarkEvery})
	require.Equal(t, 1<<23, c.Admission.IdempotencyFilterBits)
	require.Equal(t, "metergate-meter", c.Admission.MeterGroup, "the meter's default group")
	c = config.Admit{}
	_, err = config.Load(&c, "admit", nil, envMap(with("ADMIT_IDEMPOTENCY_HOT", "0", "ADMIT_IDEMPOTENCY_FILTER_BITS", "259200000", "METER_GROUP", "billing")), io.Discard)
	require.NoError(t, err)
	require.Zero(t, c.Admission.IdempotencyHot)
	require.Equal(t, [2]any{259_200_000, "billing"}, [2]any{c.Admission.IdempotencyFilterBits, c.Admission.MeterGroup})
	for _, bad := range [][2]string{{"ADMIT_IDEMPOTENCY_HOT", "500ms"}, {"ADMIT_IDEMPOTENCY_HOT", "1500us"},
		{"ADMIT_IDEMPOTENCY_FILTER_BITS", "8191"}, {"ADMIT_IDEMPOTENCY_FILTER_BITS", "4294967297"},
		{"ADMIT_IDEMPOTENCY_MARK_EVERY", "0s"}, {"METER_GROUP", ""}} {
		c = config.Admit{}
		_, err = config.Load(&c, "admit", nil, envMap(with(bad[0], bad[1])), io.Discard)
		require.ErrorContains(t, err, bad[0], "%s=%s", bad[0], bad[1])
	}
}

func TestNames(t *testing.T) {
	l := config.NewLoader("meter", envMap(nil), io.Discard)
	(&config.Meter{}).Register(l)
	names := l.Names()
	for _, want := range []string{"METER_ADDR", "DATABASE_URL", "KAFKA_BROKERS", "KAFKA_TOPIC", "METER_GROUP", "MIGRATE", "LOG_LEVEL"} {
		require.Contains(t, names, want)
	}
	require.NotContains(t, names, "REDIS_URL", "meter does not use Redis")
	require.Equal(t, "kafka-topic-partitions", config.FlagName("KAFKA_TOPIC_PARTITIONS"))
}

// A Redis Cluster takes its credentials and TLS from REDIS_URL, which names no server; a
// database other than 0 is refused there (a cluster has only database 0).
func TestRedisClusterCredentials(t *testing.T) {
	c := config.Redis{URL: "rediss://app:s3cret@/0", ClusterAddrs: []string{"10.0.0.1:6379", "10.0.0.2:6379"}, Timeout: time.Second}
	require.NoError(t, c.Validate())
	rdb, err := c.Open()
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	cc, ok := rdb.(*redis.ClusterClient)
	require.True(t, ok, "a cluster client, got %T", rdb)
	o := cc.Options()
	require.Equal(t, []string{"10.0.0.1:6379", "10.0.0.2:6379"}, o.Addrs)
	require.Equal(t, "app", o.Username)
	require.Equal(t, "s3cret", o.Password)
	require.NotNil(t, o.TLSConfig, "rediss:// means TLS")
	require.Empty(t, o.TLSConfig.ServerName, "each node is verified under its own name")
	require.Equal(t, config.ClusterStateReload, o.ClusterStateReloadInterval, "a failover is noticed within about a second")

	c.URL = "redis:///3"
	require.ErrorContains(t, c.Validate(), "only database 0")
	c.URL, c.ClusterAddrs = "redis://127.0.0.1:6379/3", nil
	require.NoError(t, c.Validate(), "one server may use any database")
}

// Sentinel takes the primary's credentials, database and TLS from REDIS_URL, which names
// no server; the two Sentinel settings come together, and not with a Cluster.
func TestRedisSentinel(t *testing.T) {
	c := config.Redis{URL: "rediss://app:s3cret@/2", SentinelAddrs: []string{"10.0.0.1:26379", "10.0.0.2:26379"},
		SentinelMaster: "mymaster", Timeout: time.Second}
	require.NoError(t, c.Validate())
	rdb, err := c.Open()
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	fc, ok := rdb.(*redis.Client)
	require.True(t, ok, "a failover client, got %T", rdb)
	o := fc.Options()
	require.Equal(t, "FailoverClient", o.Addr, "go-redis names the address of a failover client so")
	require.Equal(t, "app", o.Username)
	require.Equal(t, "s3cret", o.Password)
	require.Equal(t, 2, o.DB)
	require.NotNil(t, o.TLSConfig, "rediss:// means TLS")
	require.Empty(t, o.TLSConfig.ServerName, "each server is verified under its own name")
	require.Zero(t, o.MaxRetries, "no retries (-1 becomes 0): a script call that timed out is not run again")

	for _, tc := range []struct {
		name    string
		edit    func(c *config.Redis)
		wantErr string
	}{
		{"no master", func(c *config.Redis) { c.SentinelMaster = "" }, "REDIS_SENTINEL_MASTER must name the primary"},
		{"no sentinels", func(c *config.Redis) { c.SentinelAddrs = nil }, "REDIS_SENTINEL_ADDRS must list the sentinels"},
		{"bad address", func(c *config.Redis) { c.SentinelAddrs = []string{"10.0.0.1"} }, `"10.0.0.1" is not host:port`},
		{"and a cluster", func(c *config.Redis) { c.ClusterAddrs = []string{"10.0.0.3:6379"} }, "pick one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := c
			tc.edit(&c)
			require.ErrorContains(t, c.Validate(), tc.wantErr)
		})
	}
}

// A REDIS_URL naming a server beside REDIS_SENTINEL_ADDRS or REDIS_CLUSTER_ADDRS is
// refused at start, as is one naming none without them: no setting is silently ignored.
// The refusal names the server, never the password.
func TestRedisAmbiguousServer(t *testing.T) {
	t.Parallel()
	sentinels := map[string]string{"REDIS_SENTINEL_ADDRS": "10.0.0.1:26379", "REDIS_SENTINEL_MASTER": "mymaster"}
	cluster := map[string]string{"REDIS_CLUSTER_ADDRS": "10.0.0.1:7000"}
	with := func(m map[string]string, url string) map[string]string {
		out := map[string]string{"REDIS_URL": url}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		err  string // "" when valid
		addr string // the server a valid single-server setting dials
	}{
		{"sentinel and a host", with(sentinels, "redis://:s3cret@redis.internal:6379/0"),
			`REDIS_URL names the server "redis.internal:6379" and REDIS_SENTINEL_ADDRS is set: which one?`, ""},
		{"cluster and a host", with(cluster, "rediss://app:s3cret@10.0.0.9:6380"),
			`REDIS_URL names the server "10.0.0.9:6380" and REDIS_CLUSTER_ADDRS is set: which one?`, ""},
		{"sentinel and a socket", with(sentinels, "unix:///run/redis.sock"), `REDIS_URL names the server "/run/redis.sock"`, ""},
		{"sentinel and a port only", with(sentinels, "redis://:6380/0"), `REDIS_URL names the server ":6380"`, ""},
		{"no host, no sentinel, no cluster", map[string]string{"REDIS_URL": "redis://:s3cret@/0"}, "REDIS_URL names no server", ""},
		{"sentinel, credentials only", with(sentinels, "redis://:s3cret@/1"), "", ""},
		{"sentinel, no REDIS_URL", with(sentinels, ""), "", ""},
		{"cluster, TLS and credentials only", with(cluster, "rediss://app:s3cret@"), "", ""},
		{"cluster, no REDIS_URL", with(cluster, ""), "", ""},
		{"one server", map[string]string{"REDIS_URL": "redis://redis.internal:6379/2"}, "", "redis.internal:6379"},
		{"no REDIS_URL at all", map[string]string{}, "", "127.0.0.1:6379"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c config.Admit
			_, err := config.Load(&c, "admit", nil, envMap(tc.env), io.Discard)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.NotContains(t, err.Error(), "s3cret", "a refusal never shows the password")
				return
			}
			require.NoError(t, err)
			rdb, err := c.Redis.Open()
			require.NoError(t, err)
			t.Cleanup(func() { _ = rdb.Close() })
			if tc.addr != "" {
				require.Equal(t, tc.addr, rdb.(*redis.Client).Options().Addr)
			}
		})
	}
}

// Every HTTP listener has header, body, write and idle deadlines and a header size
// limit, with defaults; the write deadline leaves room for admit's longest wait.
func TestHTTPLimits(t *testing.T) {
	t.Parallel()
	var c config.Admit
	_, err := config.Load(&c, "admit", nil, envMap(nil), io.Discard)
	require.NoError(t, err)
	h := c.Server.HTTP()
	require.Equal(t, 5*time.Second, h.ReadHeaderTimeout)
	require.Equal(t, 15*time.Second, h.ReadTimeout)
	require.Equal(t, 2*time.Minute, h.WriteTimeout)
	require.Equal(t, time.Minute, h.IdleTimeout)
	require.Equal(t, 64<<10, h.MaxHeaderBytes)
	require.Equal(t, "127.0.0.1:8080", h.Addr)
	require.Equal(t, 15*time.Second, h.ShutdownTimeout)

	var m config.Meter
	_, err = config.Load(&m, "meter", nil, envMap(map[string]string{"HTTP_READ_TIMEOUT": "6s"}), io.Discard)
	require.NoError(t, err)
	require.Equal(t, 6*time.Second, m.Server.HTTP().ReadTimeout, "meter's listener takes the same settings")

	for _, tc := range []struct {
		env map[string]string
		err string
	}{
		{map[string]string{"HTTP_READ_TIMEOUT": "0s"}, "HTTP_READ_TIMEOUT=0s: want more than 0"},
		{map[string]string{"HTTP_IDLE_TIMEOUT": "-1s"}, "HTTP_IDLE_TIMEOUT=-1s: want more than 0"},
		{map[string]string{"HTTP_READ_HEADER_TIMEOUT": "0s"}, "HTTP_READ_HEADER_TIMEOUT=0s: want more than 0"},
		{map[string]string{"HTTP_READ_HEADER_TIMEOUT": "20s"}, "HTTP_READ_HEADER_TIMEOUT=20s: want at most HTTP_READ_TIMEOUT (15s)"},
		{map[string]string{"HTTP_MAX_HEADER_BYTES": "1000"}, "HTTP_MAX_HEADER_BYTES=1000: want 4096-1048576"},
		{map[string]string{"HTTP_MAX_HEADER_BYTES": "2000000"}, "HTTP_MAX_HEADER_BYTES=2000000"},
		// 15s for the body + 30s of wait + 30s for the decision.
		{map[string]string{"HTTP_WRITE_TIMEOUT": "74s"}, "HTTP_WRITE_TIMEOUT=1m14s: want at least HTTP_READ_TIMEOUT + ADMIT_MAX_WAIT + 30s = 1m15s"},
		{map[string]string{"ADMIT_MAX_WAIT": "10m"}, "HTTP_WRITE_TIMEOUT=2m0s: want at least HTTP_READ_TIMEOUT + ADMIT_MAX_WAIT + 30s = 10m45s"},
		{map[string]string{"ADMIT_MAX_WAIT": "10m", "HTTP_WRITE_TIMEOUT": "10m45s"}, ""},
		{map[string]string{"HTTP_WRITE_TIMEOUT": "75s"}, ""},
	} {
		var c config.Admit
		_, err := config.Load(&c, "admit", nil, envMap(tc.env), io.Discard)
		if tc.err == "" {
			require.NoError(t, err, tc.env)
			continue
		}
		require.ErrorContains(t, err, tc.err, tc.env)
	}
}

// The gRPC listener's limits have defaults, take their metadata bound from
// HTTP_MAX_HEADER_BYTES and refuse zero.
func TestGRPCLimits(t *testing.T) {
	t.Parallel()
	var c config.Admit
	_, err := config.Load(&c, "admit", nil, envMap(map[string]string{"HTTP_MAX_HEADER_BYTES": "8192"}), io.Discard)
	require.NoError(t, err)
	g := c.GRPC()
	require.Equal(t, 1024, g.MaxConns)
	require.Equal(t, 256, g.MaxStreams)
	require.Equal(t, 64<<10, g.MaxRecvBytes)
	require.Equal(t, 8192, g.MaxHeaderBytes)
	require.Equal(t, 5*time.Second, g.HandshakeTimeout)
	require.Equal(t, 5*time.Minute, g.IdleTimeout)
	require.Equal(t, 30*time.Minute, g.MaxAge)
	require.Equal(t, 30*time.Second, g.MaxAgeGrace)
	require.Equal(t, time.Minute, g.KeepaliveTime)
	require.Equal(t, 20*time.Second, g.KeepaliveTimeout)
	require.Equal(t, 10*time.Second, g.KeepaliveMinTime)
	require.Equal(t, 16, c.RLS.MaxHeldStreams)
	require.Len(t, g.ServerOptions(), 6)

	_, err = config.Load(&c, "admit", nil, envMap(map[string]string{"ADMIT_GRPC_MAX_CONNS": "0", "ADMIT_GRPC_MAX_STREAMS": "0",
		"ADMIT_GRPC_MAX_RECV_BYTES": "0", "ADMIT_GRPC_MAX_HELD_STREAMS": "0", "ADMIT_GRPC_HANDSHAKE_TIMEOUT": "0s",
		"ADMIT_GRPC_MAX_CONN_AGE": "0s", "ADMIT_GRPC_KEEPALIVE_MIN_TIME": "0s"}), io.Discard)
	require.Error(t, err)
	for _, want := range []string{"ADMIT_GRPC_MAX_CONNS=0: want 1-", "ADMIT_GRPC_MAX_STREAMS=0", "ADMIT_GRPC_MAX_RECV_BYTES=0",
		"ADMIT_GRPC_MAX_HELD_STREAMS=0", "ADMIT_GRPC_HANDSHAKE_TIMEOUT=0s: want more than 0", "ADMIT_GRPC_MAX_CONN_AGE=0s",
		"ADMIT_GRPC_KEEPALIVE_MIN_TIME=0s"} {
		require.Contains(t, err.Error(), want)
	}
}

// ADMIT_MAX_WAIT defaults to 30s, may be 0 (no waiting) and no more than 10m.
func TestMaxWait(t *testing.T) {
	env := func(v string) map[string]string {
		// A request may wait 10m: its answer may take that long (TestHTTPLimits).
		m := map[string]string{"ADMIT_SERVICE_TOKEN": "service-token-0123", "ADMIT_ADMIN_TOKEN": "admin-token-012345",
			"HTTP_WRITE_TIMEOUT": "11m"}
		if v != "" {
			m["ADMIT_MAX_WAIT"] = v
		}
		return m
	}
	for _, tc := range []struct {
		env  string
		want time.Duration
		err  string
	}{
		{"", 30 * time.Second, ""},
		{"0", 0, ""},
		{"10m", 10 * time.Minute, ""},
		{"10m1ms", 0, "ADMIT_MAX_WAIT=10m0.001s: want 0-10m0s"},
		{"-1s", 0, "ADMIT_MAX_WAIT=-1s"},
		{"1500us", 0, "whole milliseconds"},
	} {
		var c config.Admit
		_, err := config.Load(&c, "admit", nil, envMap(env(tc.env)), io.Discard)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.env)
			continue
		}
		require.NoError(t, err, tc.env)
		require.Equal(t, tc.want, c.Admission.MaxWait, tc.env)
	}
}

// go-redis' own messages (here: a sentinel that cannot be reached) reach the service's
// logger as structured records, not plain text on stderr.
func TestRedisLogsTo(t *testing.T) {
	var buf syncBuffer
	config.RedisLogsTo(slog.New(slog.NewJSONHandler(&buf, nil)))
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"},
		DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer rdb.Close()
	require.Error(t, rdb.Ping(context.Background()).Err())
	var rec map[string]any
	line, _, _ := strings.Cut(buf.String(), "\n")
	require.NoError(t, json.Unmarshal([]byte(line), &rec), "a JSON record: %q", buf.String())
	require.Equal(t, "go-redis", rec["component"])
	require.Contains(t, rec["msg"], "sentinel")
}

// syncBuffer is a bytes.Buffer safe for the writes of go-redis' goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
