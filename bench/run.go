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

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/sandbox"
	"github.com/metergate/metergate/internal/topic"
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
	// admit is the default deployment: its relay runs inside it (ADMIT_RELAY's default).
	admit *sandbox.Proc
	// apart is a node with ADMIT_RELAY=false and relay `admit relay` beside it (nil while
	// stopped), under a key prefix of their own (apartPrefix), so that a run can pause
	// the relay without touching admit's.
	apart *sandbox.Proc
	relay *sandbox.Proc
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
		{"redismem", "Redis memory per active account and per idempotency record", s.redisMemory},
		{"waiters", "Redis CPU with 1,000 requests waiting for capacity", s.waiters},
		{"credits", "Redis CPU per decision with a prepaid balance against without", s.credits},
		{"alerts", "Redis CPU per decision with alert rules against without", s.alerts},
		{"gateway", "admit CPU per decision through Envoy's rate-limit service (gRPC) against HTTP", s.gateway},
		{"replicas", "decisions with ADMIT_REDIS_WAIT_REPLICAS=1 against without, on the Sentinel setup", s.replicas},
		{"console", "the console: each page's server time over a seeded billing log, its effect on admission", s.consoleBench},
		{"portal", "the portal's usage page over a year of one org's events (usage_daily)", s.portalBench},
		{"sdk", "the SDKs' client overhead against a raw HTTP call of the same admit", s.sdkBench},
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
	if err := s.deleteKeys(ctx); err != nil {
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
		// DATABASE_MIGRATE_URL= : the services migrate the bench's space, not the one the
		// environment's owner URL names.
		"DATABASE_URL=" + s.dbURL, "DATABASE_MIGRATE_URL=", "REDIS_URL=" + cfg.RedisURL, "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=",
		"KAFKA_BROKERS=" + strings.Join(cfg.Brokers, ","), "KAFKA_TOPIC=" + s.topic, "KAFKA_TOPIC_PARTITIONS=12",
		fmt.Sprintf("ADMIT_SHARDS=%d", shards), "LOG_FORMAT=json", "LOG_LEVEL=warn", "MIGRATE=false",
		"ADMIT_IDEMPOTENCY_TTL=" + cfg.IdempotencyTTL.String(),
		// The console's session cookie without Secure: the bench signs in over plain HTTP.
		"CONSOLE_INSECURE_COOKIES=true",
		// admit's idempotency janitor reads the meter's committed offsets.
		"METER_GROUP=metergate-bench-" + s.topic,
	}
	if s.meter, err = s.start(ctx, "meter", "-migrate"); err != nil {
		s.close()
		return nil, err
	}
	if s.pool, err = pgxpool.New(ctx, s.dbURL); err != nil {
		s.close()
		return nil, err
	}
	if s.admit, err = s.start(ctx, "admit"); err != nil {
		s.close()
		return nil, err
	}
	if s.apart, err = s.start(ctx, "apart"); err != nil {
		s.close()
		return nil, err
	}
	if err := s.startRelay(ctx); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// apartPrefix is the key prefix of the apart node and its relay.
func (c Config) apartPrefix() string { return c.KeyPrefix + "-apart" }

// deleteKeys empties the run's key prefixes.
func (s *stack) deleteKeys(ctx context.Context) error {
	for _, p := range []string{s.cfg.KeyPrefix, s.cfg.apartPrefix()} {
		if _, err := sandbox.DeleteKeys(ctx, s.rdb, p); err != nil {
			return err
		}
	}
	return nil
}

// start starts bin/name on a free port (env var ADMIT_ADDR or METER_ADDR) and waits for
// /readyz. role names the process and its log: "meter"; "admit" (the default deployment,
// its relay inside); "apart" (ADMIT_RELAY=false) and "relay" (admit relay) under
// apartPrefix; "rss" (ADMIT_RELAY=false, for the memory figure).
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
	default:
		bin = "admit"
		env = append(env, "ADMIT_ADDR="+addr, "ADMIT_NODE=bench-"+role, "REDIS_TIMEOUT=5s",
			"ADMIT_SERVICE_TOKEN="+serviceToken, "ADMIT_ADMIN_TOKEN="+adminToken)
		switch role {
		case "admit":
			env = append(env, "ADMIT_KEY_PREFIX="+s.cfg.KeyPrefix)
		case "rss":
			env = append(env, "ADMIT_KEY_PREFIX="+s.cfg.KeyPrefix, "ADMIT_RELAY=false")
		case "apart":
			env = append(env, "ADMIT_KEY_PREFIX="+s.cfg.apartPrefix(), "ADMIT_RELAY=false")
		case "relay":
			env = append(env, "ADMIT_KEY_PREFIX="+s.cfg.apartPrefix())
		}
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

// startRelay starts the apart node's `admit relay` (once stopped, again).
func (s *stack) startRelay(ctx context.Context) error {
	p, err := s.start(ctx, "relay", "relay")
	if err == nil {
		s.relay = p
	}
	return err
}

// stopRelay stops the apart node's relay: its admitted events wait in the outbox meanwhile.
func (s *stack) stopRelay() error {
	err := s.relay.Stop(30 * time.Second)
	s.relay = nil
	return err
}

func (s *stack) close() {
	if s.relay != nil {
		_ = s.relay.Stop(30 * time.Second)
	}
	if s.apart != nil {
		_ = s.apart.Stop(30 * time.Second)
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
		_ = s.deleteKeys(ctx)
		_ = s.rdb.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
}
