package config

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/topic"
)

// Log chooses the level and format of a binary's slog output.
type Log struct {
	Level  string
	Format string
}

// Register adds LOG_LEVEL and LOG_FORMAT.
func (c *Log) Register(l *Loader) {
	l.String(&c.Level, "LOG_LEVEL", "info", "log level: debug, info, warn or error")
	l.String(&c.Format, "LOG_FORMAT", "json", "log format: json or text")
}

// Validate reports a bad level or format.
func (c Log) Validate() error {
	var errs []error
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.Level)); err != nil {
		errs = append(errs, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", c.Level))
	}
	if c.Format != "json" && c.Format != "text" {
		errs = append(errs, fmt.Errorf("LOG_FORMAT=%q: want json or text", c.Format))
	}
	return prefix("log", errs)
}

// Logger returns a logger writing to w as configured. Call it after Validate.
func (c Log) Logger(w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level)) // validated; the zero value is info
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

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

// Postgres locates the billing database.
type Postgres struct {
	URL string
	// MigrateURL is the schema owner's URL, for migrations; empty means URL. The services
	// connect through URL as a role that owns nothing (docs/deploy.md#database-roles).
	MigrateURL string
	MaxConns   int
}

// Register adds DATABASE_URL, DATABASE_MIGRATE_URL and DATABASE_MAX_CONNS.
func (c *Postgres) Register(l *Loader) {
	l.String(&c.URL, "DATABASE_URL", "postgres://metergate:metergate@127.0.0.1:5432/metergate?sslmode=disable", "PostgreSQL connection URL")
	l.String(&c.MigrateURL, "DATABASE_MIGRATE_URL", "", "PostgreSQL URL of the schema's owner, used by -migrate (empty: DATABASE_URL)")
	l.Int(&c.MaxConns, "DATABASE_MAX_CONNS", 10, "largest number of pooled PostgreSQL connections")
}

// MigrationURL is the URL migrations run through: MigrateURL, or URL when it is empty.
func (c Postgres) MigrationURL() string {
	if c.MigrateURL != "" {
		return c.MigrateURL
	}
	return c.URL
}

// Validate reports an unparsable URL or a pool size below 1.
func (c Postgres) Validate() error {
	var errs []error
	if _, err := pgxpool.ParseConfig(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("DATABASE_URL: %w", err))
	}
	if c.MigrateURL != "" {
		if _, err := pgxpool.ParseConfig(c.MigrateURL); err != nil {
			errs = append(errs, fmt.Errorf("DATABASE_MIGRATE_URL: %w", err))
		}
	}
	if c.MaxConns < 1 {
		errs = append(errs, fmt.Errorf("DATABASE_MAX_CONNS=%d: want at least 1", c.MaxConns))
	}
	return prefix("postgres", errs)
}

// Open returns a connection pool. Connections are made lazily: it does not wait for the server.
func (c Postgres) Open(ctx context.Context) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = int32(c.MaxConns) //nolint:gosec // validated ≥ 1, and a pool of 2^31 is not a thing
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open postgres pool: %w", err)
	}
	return pool, nil
}

// Kafka locates the brokers and names the usage topic.
type Kafka struct {
	Brokers           []string
	Topic             string
	Partitions        int
	ReplicationFactor int
}

// Register adds KAFKA_BROKERS, KAFKA_TOPIC, KAFKA_TOPIC_PARTITIONS and KAFKA_TOPIC_REPLICATION.
func (c *Kafka) Register(l *Loader) {
	l.List(&c.Brokers, "KAFKA_BROKERS", []string{"127.0.0.1:9092"}, "comma-separated host:port of Kafka brokers")
	l.String(&c.Topic, "KAFKA_TOPIC", "usage.events", "topic of usage events")
	l.Int(&c.Partitions, "KAFKA_TOPIC_PARTITIONS", 12, "partitions of the topic when it is created")
	l.Int(&c.ReplicationFactor, "KAFKA_TOPIC_REPLICATION", 1, "replication factor of the topic when it is created")
}

var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// Validate reports missing brokers, a bad topic name or a bad topic shape.
func (c Kafka) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("KAFKA_BROKERS: at least one broker is needed"))
	}
	for _, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			errs = append(errs, fmt.Errorf("KAFKA_BROKERS: %q is not host:port", b))
		}
	}
	if !topicName.MatchString(c.Topic) || c.Topic == "." || c.Topic == ".." {
		errs = append(errs, fmt.Errorf("KAFKA_TOPIC=%q: want 1-249 of [a-zA-Z0-9._-]", c.Topic))
	}
	if c.Partitions < 1 {
		errs = append(errs, fmt.Errorf("KAFKA_TOPIC_PARTITIONS=%d: want at least 1", c.Partitions))
	}
	if c.ReplicationFactor < 1 {
		errs = append(errs, fmt.Errorf("KAFKA_TOPIC_REPLICATION=%d: want at least 1", c.ReplicationFactor))
	}
	return prefix("kafka", errs)
}

// Spec is the shape the topic is created with.
func (c Kafka) Spec() topic.Spec {
	return topic.Spec{Name: c.Topic, Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor}
}

// Server is a binary's HTTP listener (API and/or /healthz, /readyz, /metrics) and the
// limits every client of it meets (ops.HTTP).
type Server struct {
	Addr            string
	ShutdownTimeout time.Duration
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout and MaxHeaderBytes are
	// ops.HTTP's.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int

	addrEnv string
}

// Bounds of HTTP_MAX_HEADER_BYTES: net/http's own default is 1 MiB.
const (
	minHeaderBytes = 4 << 10
	maxHeaderBytes = 1 << 20
)

// register adds <ENV>_ADDR-style settings under the given variable names, SHUTDOWN_TIMEOUT
// and the HTTP_* limits.
func (c *Server) register(l *Loader, addrEnv, defAddr string) {
	l.String(&c.Addr, addrEnv, defAddr, "HTTP listen address")
	l.Duration(&c.ShutdownTimeout, "SHUTDOWN_TIMEOUT", 15*time.Second, "how long a graceful shutdown may take")
	l.Duration(&c.ReadHeaderTimeout, "HTTP_READ_HEADER_TIMEOUT", 5*time.Second, "longest time a client may take to send a request's line and headers")
	l.Duration(&c.ReadTimeout, "HTTP_READ_TIMEOUT", 15*time.Second, "longest time a client may take to send a whole request, headers and body")
	l.Duration(&c.WriteTimeout, "HTTP_WRITE_TIMEOUT", 2*time.Minute, "longest time from a request's headers to the end of its answer (admit: more than HTTP_READ_TIMEOUT + ADMIT_MAX_WAIT + 30s)")
	l.Duration(&c.IdleTimeout, "HTTP_IDLE_TIMEOUT", time.Minute, "longest time a kept-alive connection may wait for its next request")
	l.Int(&c.MaxHeaderBytes, "HTTP_MAX_HEADER_BYTES", 64<<10, "largest request line and headers, in bytes (past it: 431)")
	c.addrEnv = addrEnv
}

// Validate reports a bad listen address, a shutdown timeout or limit that is not set, and
// a header deadline past the whole request's.
func (c Server) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("%s=%q: not host:port", c.addrEnv, c.Addr))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"SHUTDOWN_TIMEOUT", c.ShutdownTimeout}, {"HTTP_READ_HEADER_TIMEOUT", c.ReadHeaderTimeout},
		{"HTTP_READ_TIMEOUT", c.ReadTimeout}, {"HTTP_WRITE_TIMEOUT", c.WriteTimeout}, {"HTTP_IDLE_TIMEOUT", c.IdleTimeout}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s=%s: want more than 0", d.name, d.v))
		}
	}
	if c.ReadHeaderTimeout > c.ReadTimeout {
		errs = append(errs, fmt.Errorf("HTTP_READ_HEADER_TIMEOUT=%s: want at most HTTP_READ_TIMEOUT (%s), which covers the headers too", c.ReadHeaderTimeout, c.ReadTimeout))
	}
	if c.MaxHeaderBytes < minHeaderBytes || c.MaxHeaderBytes > maxHeaderBytes {
		errs = append(errs, fmt.Errorf("HTTP_MAX_HEADER_BYTES=%d: want %d-%d", c.MaxHeaderBytes, minHeaderBytes, maxHeaderBytes))
	}
	return prefix("server", errs)
}

// HTTP is the listener as internal/ops serves it.
func (c Server) HTTP() ops.HTTP {
	return ops.HTTP{Addr: c.Addr, ReadHeaderTimeout: c.ReadHeaderTimeout, ReadTimeout: c.ReadTimeout,
		WriteTimeout: c.WriteTimeout, IdleTimeout: c.IdleTimeout, MaxHeaderBytes: c.MaxHeaderBytes,
		ShutdownTimeout: c.ShutdownTimeout}
}

func prefix(section string, errs []error) error {
	for i, err := range errs {
		errs[i] = fmt.Errorf("%s: %w", section, err)
	}
	return errors.Join(errs...)
}
