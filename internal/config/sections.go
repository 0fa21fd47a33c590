package config

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"time"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/ops"
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

// Keyspace names admit's Redis keys (internal/keyspace). Reconcile corrects the counters
// admit keeps, so it reads the same two variables, and they must be admit's values.
type Keyspace struct {
	KeyPrefix string
	Shards    int
}

// keyPrefix keeps the Redis keys free of hash-tag braces and spaces.
var keyPrefix = regexp.MustCompile(`^[A-Za-z0-9:._-]{1,64}$`)

// registerKeyspace adds ADMIT_KEY_PREFIX and ADMIT_SHARDS.
func (c *Keyspace) registerKeyspace(l *Loader) {
	l.String(&c.KeyPrefix, "ADMIT_KEY_PREFIX", keyspace.DefaultKeyPrefix, "start of every Redis key (several deployments, or tests, on one Redis); reconcile's must be admit's")
	l.Int(&c.Shards, "ADMIT_SHARDS", keyspace.DefaultShards, "Redis hash-tag shards; fixed for the life of a deployment, and reconcile's must be admit's")
}

// validateKeyspace reports a bad prefix or shard count, unprefixed: the section holding
// the keyspace names them.
func (c Keyspace) validateKeyspace() []error {
	var errs []error
	if !keyPrefix.MatchString(c.KeyPrefix) {
		errs = append(errs, fmt.Errorf("ADMIT_KEY_PREFIX=%q: want 1-64 of [A-Za-z0-9:._-]", c.KeyPrefix))
	}
	if c.Shards < 1 || c.Shards > 1024 {
		errs = append(errs, fmt.Errorf("ADMIT_SHARDS=%d: want 1-1024", c.Shards))
	}
	return errs
}

// Keys names the keys.
func (c Keyspace) Keys() keyspace.Keys { return keyspace.Keys{Prefix: c.KeyPrefix, Shards: c.Shards} }
