// Command redisrate is the baseline peer of `make bench`: the least an HTTP admission
// service backed by Redis can do, one github.com/go-redis/redis_rate GCRA call per request
// against a single fixed key. metergate's admit is measured against it in the same run, so
// the reported figures are ratios that a noisy machine leaves alone.
//
//	redisrate [-addr 127.0.0.1:0] [-redis-url URL] [-rate N] [-key K]
//
// It prints the address it listens on as the first line of stdout, then serves
// POST /v1/admit until SIGINT or SIGTERM. Every flag mirrors an environment variable
// (REDISRATE_ADDR, REDIS_URL, REDISRATE_RATE, REDISRATE_KEY); a flag wins.
//
// It lives in its own module so that metergate never depends on redis_rate.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Config is what the peer needs to run.
type Config struct {
	Addr     string // listen address; port 0 picks a free one
	RedisURL string
	Rate     int    // requests per second the one key allows (burst the same)
	Key      string // the one key every request is charged to
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if _, err := redis.ParseURL(c.RedisURL); err != nil {
		errs = append(errs, fmt.Errorf("REDIS_URL: %w", err))
	}
	if c.Rate < 1 {
		errs = append(errs, fmt.Errorf("REDISRATE_RATE=%d: want at least 1", c.Rate))
	}
	if c.Key == "" {
		errs = append(errs, errors.New("REDISRATE_KEY: empty"))
	}
	return errors.Join(errs...)
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("service", "redisrate")
	cfg, err := loadConfig(os.Args[1:])
	if err != nil {
		log.Error("bad configuration", "err", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("redisrate failed", "err", err)
		os.Exit(1)
	}
}

func loadConfig(args []string) (Config, error) {
	rate, err := strconv.Atoi(envOr("REDISRATE_RATE", "1000000"))
	if err != nil {
		return Config{}, fmt.Errorf("REDISRATE_RATE: %w", err)
	}
	cfg := Config{
		Addr:     envOr("REDISRATE_ADDR", "127.0.0.1:0"),
		RedisURL: envOr("REDIS_URL", "redis://127.0.0.1:6379/0"),
		Rate:     rate,
		Key:      envOr("REDISRATE_KEY", "bench:redisrate"),
	}
	fs := flag.NewFlagSet("redisrate", flag.ContinueOnError)
	fs.StringVar(&cfg.Addr, "addr", cfg.Addr, "listen address (REDISRATE_ADDR); port 0 picks a free port")
	fs.StringVar(&cfg.RedisURL, "redis-url", cfg.RedisURL, "Redis URL (REDIS_URL)")
	fs.IntVar(&cfg.Rate, "rate", cfg.Rate, "requests per second allowed, burst the same (REDISRATE_RATE)")
	fs.StringVar(&cfg.Key, "key", cfg.Key, "the Redis key every request is charged to (REDISRATE_KEY)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	return cfg, cfg.Validate()
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func run(ctx context.Context, cfg Config, log *slog.Logger) error {
	opts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// The first line of stdout is the contract with whoever started us (make bench).
	fmt.Println(ln.Addr().String())

	limit := redis_rate.PerSecond(cfg.Rate)
	srv := &http.Server{
		Handler:           NewHandler(redis_rate.NewLimiter(rdb), cfg.Key, limit, log),
		ReadHeaderTimeout: 5 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String(), "rate_per_s", cfg.Rate, "key", cfg.Key)

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
