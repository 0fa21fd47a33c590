package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis locates Redis: one server by URL, a Redis Cluster by its seed addresses, or a
// primary that Redis Sentinel watches, by the sentinels' addresses and the master's name.
// With a Cluster or Sentinel, URL names no server (redis://:password@/0): it gives only the
// credentials, the database and TLS, so that no setting is silently ignored.
type Redis struct {
	// URL is the server's URL; empty means defaultRedisURL, or with a Cluster or Sentinel
	// no credentials, database 0 and no TLS.
	URL          string
	ClusterAddrs []string
	// SentinelAddrs and SentinelMaster are set together: the client asks the sentinels
	// for the current primary and follows it when they promote a replica.
	SentinelAddrs  []string
	SentinelMaster string
	// Timeout bounds dialing, reading and writing: past it a decision follows the
	// Redis-down policy instead of hanging its caller.
	Timeout time.Duration
}

// defaultRedisURL is the server of an empty REDIS_URL without a Cluster or Sentinel.
const defaultRedisURL = "redis://127.0.0.1:6379/0"

// Register adds REDIS_URL, REDIS_CLUSTER_ADDRS, REDIS_SENTINEL_ADDRS, REDIS_SENTINEL_MASTER
// and REDIS_TIMEOUT.
func (c *Redis) Register(l *Loader) {
	l.String(&c.URL, "REDIS_URL", "", "Redis server URL (empty: "+defaultRedisURL+"); with REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS a URL without host giving only user, password, database and TLS (rediss://), e.g. redis://:password@/0")
	l.List(&c.ClusterAddrs, "REDIS_CLUSTER_ADDRS", nil, "comma-separated host:port seeds of a Redis Cluster; when set, Redis Cluster is used")
	l.List(&c.SentinelAddrs, "REDIS_SENTINEL_ADDRS", nil, "comma-separated host:port of Redis Sentinels; with REDIS_SENTINEL_MASTER, the primary they name is used")
	l.String(&c.SentinelMaster, "REDIS_SENTINEL_MASTER", "", "name of the primary the sentinels of REDIS_SENTINEL_ADDRS watch")
	l.Duration(&c.Timeout, "REDIS_TIMEOUT", 500*time.Millisecond, "dial, read and write timeout of Redis calls")
}

// url is the URL the client options are parsed from.
func (c Redis) url() string {
	switch {
	case c.URL != "":
		return c.URL
	case len(c.ClusterAddrs) > 0 || len(c.SentinelAddrs) > 0:
		return "redis://" // no credentials, database 0, no TLS
	default:
		return defaultRedisURL
	}
}

// urlServer returns the server REDIS_URL names: its host:port, or its socket path for
// unix://; "" when it names none.
func urlServer(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return ""
	case u.Scheme == "unix":
		return u.Path
	default:
		return u.Host
	}
}

// Validate reports an unparsable URL or address, a Sentinel setting without the other,
// Cluster and Sentinel both set, and an ambiguous server: a URL naming one beside a
// Cluster or Sentinel, or a URL naming none without them.
func (c Redis) Validate() error {
	var errs []error
	opts, err := redis.ParseURL(c.url())
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("REDIS_URL: %w", err))
	case len(c.ClusterAddrs) > 0 && opts.DB != 0:
		errs = append(errs, fmt.Errorf("REDIS_URL: database %d: a Redis Cluster has only database 0", opts.DB))
	}
	if err == nil {
		server := urlServer(c.URL)
		switch {
		case server != "" && len(c.SentinelAddrs) > 0:
			errs = append(errs, fmt.Errorf("REDIS_URL names the server %q and REDIS_SENTINEL_ADDRS is set: which one? With Sentinel, REDIS_URL names no server and gives only user, password, database and TLS (e.g. redis://:password@/0, rediss://user:password@/0), or is empty", server))
		case server != "" && len(c.ClusterAddrs) > 0:
			errs = append(errs, fmt.Errorf("REDIS_URL names the server %q and REDIS_CLUSTER_ADDRS is set: which one? With a Cluster, REDIS_URL names no server and gives only user, password and TLS (e.g. redis://:password@, rediss://user:password@), or is empty", server))
		case server == "" && c.URL != "" && len(c.SentinelAddrs) == 0 && len(c.ClusterAddrs) == 0:
			errs = append(errs, errors.New("REDIS_URL names no server (host:port): name one, e.g. redis://redis.internal:6379/0, or set REDIS_SENTINEL_ADDRS or REDIS_CLUSTER_ADDRS"))
		}
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("REDIS_TIMEOUT=%s: want more than 0", c.Timeout))
	}
	for _, a := range c.ClusterAddrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("REDIS_CLUSTER_ADDRS: %q is not host:port", a))
		}
	}
	for _, a := range c.SentinelAddrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("REDIS_SENTINEL_ADDRS: %q is not host:port", a))
		}
	}
	switch {
	case len(c.SentinelAddrs) > 0 && c.SentinelMaster == "":
		errs = append(errs, errors.New("REDIS_SENTINEL_ADDRS is set: REDIS_SENTINEL_MASTER must name the primary"))
	case len(c.SentinelAddrs) == 0 && c.SentinelMaster != "":
		errs = append(errs, errors.New("REDIS_SENTINEL_MASTER is set: REDIS_SENTINEL_ADDRS must list the sentinels"))
	}
	if len(c.SentinelAddrs) > 0 && len(c.ClusterAddrs) > 0 {
		errs = append(errs, errors.New("REDIS_SENTINEL_ADDRS and REDIS_CLUSTER_ADDRS are both set: pick one"))
	}
	return prefix("redis", errs)
}

// RedisLogsTo sends go-redis' own messages (a failover seen by the sentinels, a pool
// problem), which it otherwise prints as plain text to stderr, to log, at info level.
// go-redis has one logger for the process: call it once, at start.
func RedisLogsTo(log *slog.Logger) { redis.SetLogger(redisLog{log.With("component", "go-redis")}) }

type redisLog struct{ log *slog.Logger }

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	r.log.InfoContext(ctx, fmt.Sprintf(format, v...))
}

// ClusterStateReload is how often a Redis Cluster client reloads the slot map. go-redis
// reloads it on MOVED, but not when the master it routes a slot to refuses connections
// (go-redis issue #3979): after a failover it keeps dialing the dead master until the
// next periodic reload, 60 s by default since v9.22. Measured (chaos scenario 14): the
// shard's first admission after the promotion came 56 s late with the default, about
// a second late with this. One CLUSTER SLOTS a second per client is cheap.
const ClusterStateReload = time.Second

// Open returns a client for the configured server, cluster or Sentinel-watched primary.
// It does not dial.
func (c Redis) Open() (redis.UniversalClient, error) { return c.OpenPool(0) }

// OpenPool is Open with a connection pool of size connections per server (go-redis'
// default when 0): for a user that blocks connections, such as the relay.
func (c Redis) OpenPool(size int) (redis.UniversalClient, error) {
	opts, err := redis.ParseURL(c.url())
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	tlsConfig := opts.TLSConfig
	if tlsConfig != nil && (len(c.ClusterAddrs) > 0 || len(c.SentinelAddrs) > 0) {
		// ParseURL names REDIS_URL's host (none: "localhost") as the server; each node or
		// sentinel has its own name, taken from the address dialed when ServerName is empty.
		tlsConfig = tlsConfig.Clone()
		tlsConfig.ServerName = ""
	}
	if len(c.ClusterAddrs) > 0 {
		// The cluster's credentials and TLS come from REDIS_URL, which names no server.
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.ClusterAddrs, PoolSize: size,
			Username: opts.Username, Password: opts.Password, TLSConfig: tlsConfig,
			DialTimeout: c.Timeout, ReadTimeout: c.Timeout, WriteTimeout: c.Timeout, MaxRetries: -1,
			ClusterStateReloadInterval: ClusterStateReload}), nil
	}
	if len(c.SentinelAddrs) > 0 {
		// The primary's credentials, database and TLS come from REDIS_URL, which names no
		// server. The sentinels are asked without credentials, over TLS when rediss://.
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: c.SentinelMaster,
			SentinelAddrs: c.SentinelAddrs, PoolSize: size, DB: opts.DB,
			Username: opts.Username, Password: opts.Password, TLSConfig: tlsConfig,
			DialTimeout: c.Timeout, ReadTimeout: c.Timeout, WriteTimeout: c.Timeout, MaxRetries: -1}), nil
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = c.Timeout, c.Timeout, c.Timeout
	// No retries: a script call that timed out may have run, and running it again could
	// charge a decision twice. The caller decides (the Redis-down policy) within one
	// timeout instead of several.
	opts.MaxRetries = -1
	opts.PoolSize = size
	return redis.NewClient(opts), nil
}
