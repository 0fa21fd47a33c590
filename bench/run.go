package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/sandbox"
	"github.com/metergate/metergate/pkg/policy"
	"github.com/metergate/metergate/pkg/topic"
)

// shards is ADMIT_SHARDS of the bench's admit.
const shards = 16

// Tokens of the bench's admit.
const (
	serviceToken = "bench-service-token-0123456789"
	adminToken   = "bench-admin-token-0123456789"
)

// stack is the bench's space and its running services.
type stack struct {
	cfg   Config
	dbURL string
	topic string
	env   []string // of admit, meter and reconcile
	pool  *pgxpool.Pool
	rdb   *redis.Client
	meter *sandbox.Proc
	admit *sandbox.Proc
	relay *sandbox.Proc // admit relay; nil while stopped
	http  *http.Client
	out   io.Writer
	key   string          // API key of benchAccount (benchKey)
	pol   policy.Resolved // benchAccount's policy (benchPolicy)
}

// run takes every measurement in turn, each on a quiet machine (nothing else of the bench
// runs meanwhile). A measurement that fails is a problem of the results; the others go on.
func run(ctx context.Context, cfg Config, out io.Writer) (*Results, error) {
	for _, b := range []string{"admit", "meter", "reconcile", "loadgen", "redisrate"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("binary %s: %w (make bench builds them into bin/)", b, err)
		}
	}
	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return nil, err
	}
	res := newResults()
	s, err := startStack(ctx, cfg, out)
	if err != nil {
		return res, err
	}
	defer s.close()

	steps := []struct {
		name, what string
		f          func(context.Context, *Results) error
	}{
		{"throughput", "admit vs redis_rate, Redis CPU, latency under load", s.admitThroughput},
		{"idle", "admit idle latency", s.admitIdle},
		{"e2e", "end-to-end latency through admit's HTTP API", s.endToEnd},
		{"pipeline", "end-to-end latency at the full rate, decisions in-process", s.pipeline},
		{"memory", "admit memory with a large policy cache", s.admitMemory},
		{"go", "Go benchmarks: meter vs INSERT … SELECT, reconcile, the decision path", s.goBenchmarks},
	}
	for _, st := range steps {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if !cfg.runs(st.name) {
			continue
		}
		s.step("%s", st.what)
		begin := time.Now()
		if err := st.f(ctx, res); err != nil {
			res.problem(st.what, err)
			fmt.Fprintf(out, "  FAILED: %v\n", err)
			continue
		}
		fmt.Fprintf(out, "  done (%s)\n", time.Since(begin).Round(100*time.Millisecond))
	}
	return res, ctx.Err()
}

func (s *stack) step(format string, args ...any) {
	fmt.Fprintf(s.out, "• %s\n", fmt.Sprintf(format, args...))
}

// startStack makes the bench's space and starts meter and admit in it.
func startStack(ctx context.Context, cfg Config, out io.Writer) (*stack, error) {
	s := &stack{cfg: cfg, out: out,
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 30 * time.Second}}
	fmt.Fprintf(out, "metergate bench: space %s / Redis prefix %s / a topic of the run; logs in %s\n", cfg.Space, cfg.KeyPrefix, cfg.LogDir)
	var err error
	if s.dbURL, _, err = sandbox.FreshDatabase(ctx, cfg.DatabaseURL, cfg.Space); err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	opts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	s.rdb = redis.NewClient(opts)
	if _, err := sandbox.DeleteKeys(ctx, s.rdb, s.cfg.KeyPrefix); err != nil {
		s.close()
		return nil, fmt.Errorf("redis: %w", err)
	}
	tctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := sandbox.DeleteTopics(tctx, cfg.Brokers, cfg.topicPrefix()); err != nil {
		s.close()
		return nil, fmt.Errorf("kafka: %w", err)
	}
	s.topic = cfg.topicPrefix() + time.Now().UTC().Format("20060102-150405")
	if err := topic.Ensure(tctx, cfg.Brokers, topic.Spec{Name: s.topic, Partitions: 12, ReplicationFactor: 1}); err != nil {
		s.close()
		return nil, fmt.Errorf("kafka: %w", err)
	}
	s.env = []string{
		"DATABASE_URL=" + s.dbURL, "REDIS_URL=" + cfg.RedisURL, "REDIS_CLUSTER_ADDRS=",
		"KAFKA_BROKERS=" + strings.Join(cfg.Brokers, ","), "KAFKA_TOPIC=" + s.topic, "KAFKA_TOPIC_PARTITIONS=12",
		"ADMIT_KEY_PREFIX=" + cfg.KeyPrefix, fmt.Sprintf("ADMIT_SHARDS=%d", shards), "LOG_FORMAT=json", "LOG_LEVEL=warn", "MIGRATE=false",
	}
	if s.meter, err = s.start(ctx, "meter", "-migrate"); err != nil {
		s.close()
		return nil, err
	}
	if s.pool, err = pgxpool.New(ctx, s.dbURL); err != nil {
		s.close()
		return nil, err
	}
	if s.admit, err = s.startAdmit(ctx); err != nil {
		s.close()
		return nil, err
	}
	if err := s.startRelay(ctx); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// start starts bin/name on a free port (env var ADMIT_ADDR or METER_ADDR) and waits for
// /readyz. role names the process and its log: "admit", "relay" (admit relay), "meter".
func (s *stack) start(ctx context.Context, role string, args ...string) (*sandbox.Proc, error) {
	addr, err := sandbox.FreeAddr()
	if err != nil {
		return nil, err
	}
	env := append([]string{}, s.env...)
	bin := role
	switch role {
	case "meter":
		env = append(env, "METER_ADDR="+addr, "METER_GROUP=metergate-bench-"+s.topic)
	case "admit", "relay":
		bin = "admit"
		env = append(env, "ADMIT_ADDR="+addr, "ADMIT_NODE=bench", "REDIS_TIMEOUT=5s", "ADMIT_RELAY=false",
			"ADMIT_SERVICE_TOKEN="+serviceToken, "ADMIT_ADMIN_TOKEN="+adminToken)
	}
	p, err := sandbox.StartAs(s.cfg.BinDir, s.cfg.LogDir, bin, role, addr, env, args...)
	if err != nil {
		return nil, err
	}
	if err := p.WaitReady(ctx, 2*time.Minute); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// startAdmit starts an admit node without its relay: the relay runs apart (startRelay),
// so that a run can pause it.
func (s *stack) startAdmit(ctx context.Context) (*sandbox.Proc, error) { return s.start(ctx, "admit") }

// startRelay starts `admit relay` (once stopped, again).
func (s *stack) startRelay(ctx context.Context) error {
	p, err := s.start(ctx, "relay", "relay")
	if err == nil {
		s.relay = p
	}
	return err
}

// stopRelay stops the relay: admitted events wait in the outbox meanwhile.
func (s *stack) stopRelay() error {
	err := s.relay.Stop(30 * time.Second)
	s.relay = nil
	return err
}

func (s *stack) close() {
	if s.relay != nil {
		_ = s.relay.Stop(30 * time.Second)
	}
	if s.admit != nil {
		_ = s.admit.Stop(30 * time.Second)
	}
	if s.meter != nil {
		_ = s.meter.Stop(30 * time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s.topic != "" {
		_ = topic.Delete(ctx, s.cfg.Brokers, s.topic)
	}
	if s.rdb != nil {
		_, _ = sandbox.DeleteKeys(ctx, s.rdb, s.cfg.KeyPrefix)
		_ = s.rdb.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
}
