package testenv

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/metergate/metergate/internal/topic"
)

// CheckConfigErrors checks that the command exits 2 on bad settings, naming every one,
// and 0 with -validate on good ones. The command's TestMain must use MainOrTests.
func CheckConfigErrors(t *testing.T, addrEnv string) {
	t.Helper()
	bad := StartMain(t, []string{addrEnv + "=nonsense", "KAFKA_TOPIC_PARTITIONS=many", "LOG_LEVEL=loud"}, "-validate")
	code, err := bad.Wait(time.Minute)
	if err != nil || code != 2 {
		t.Fatalf("bad settings: exit %d (%v), want 2; output:\n%s", code, err, bad.Output())
	}
	for _, name := range []string{addrEnv, "KAFKA_TOPIC_PARTITIONS", "LOG_LEVEL"} {
		if !strings.Contains(bad.Output(), name) {
			t.Errorf("bad settings: output does not name %s:\n%s", name, bad.Output())
		}
	}
	// The good settings are the environment the tests run in (.run/env under make test)
	// and the tokens: what the stack exports must be a configuration the binaries accept.
	// It once exported REDIS_URL beside the Cluster's and the Sentinel's addresses, which
	// they refuse as ambiguous; the tests' own names for those are METERGATE_TEST_*.
	good := StartMain(t, append(AdmitTokens(), addrEnv+"=127.0.0.1:1"), "-validate")
	if code, err := good.Wait(time.Minute); err != nil || code != 0 {
		t.Fatalf("-validate with the tests' environment (.run/env): exit %d (%v), want 0; output:\n%s", code, err, good.Output())
	}
}

// CheckServiceLifecycle starts the command against the real services with -migrate, a
// schema of its own and a topic name of its own, and checks that it applies the migrations,
// creates the topic with the configured partitions, serves /healthz, /readyz (every named
// check ok) and /metrics, and exits 0 soon after SIGTERM.
func CheckServiceLifecycle(t *testing.T, addrEnv string, readyChecks ...string) {
	t.Helper()
	ctx := Context(t, 2*time.Minute)
	pool, schema := EmptySchema(t)
	brokers := KafkaBrokers(t)
	topicName := "t." + Name(t)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = topic.Delete(cctx, brokers, topicName)
	})
	addr := FreeAddr(t)
	p := StartMain(t, append(AdmitTokens(),
		addrEnv+"="+addr,
		"REDIS_URL="+RedisURL(t),
		"REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=",
		"DATABASE_URL="+WithSearchPath(t, DatabaseURL(t), schema),
		"KAFKA_BROKERS="+strings.Join(brokers, ","),
		"KAFKA_TOPIC="+topicName,
		"KAFKA_TOPIC_PARTITIONS=3",
		"LOG_FORMAT=text",
		"ADMIT_KEY_PREFIX="+Prefix(t)+"mg", // this process's outbox streams alone
	), "-migrate")

	base := "http://" + addr
	if _, err := WaitHTTP(ctx, base+"/healthz", 200); err != nil {
		t.Fatal(err)
	}
	body, err := WaitHTTP(ctx, base+"/readyz", 200)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range readyChecks {
		if !strings.Contains(body, `"name":"`+c+`","ok":true`) {
			t.Errorf("/readyz does not report %s ok: %s", c, body)
		}
	}
	if metrics, err := WaitHTTP(ctx, base+"/metrics", 200); err != nil || !strings.Contains(metrics, "go_goroutines") {
		t.Errorf("/metrics: %v %.200s", err, metrics)
	}

	var exists bool
	if err := pool.QueryRow(ctx, `select exists (select 1 from information_schema.tables where table_schema = $1 and table_name = 'goose_db_version')`, schema).Scan(&exists); err != nil || !exists {
		t.Errorf("-migrate did not apply migrations in %s (%v)", schema, err)
	}
	if n := waitPartitions(ctx, brokers[0], topicName); n != 3 {
		t.Errorf("topic %s has %d partitions, want 3", topicName, n)
	}

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(30 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("after SIGTERM: exit %d (%v), want 0", code, err)
	}
	if !strings.Contains(p.Output(), "http stopped") {
		t.Errorf("no graceful HTTP shutdown in the output:\n%s", p.Output())
	}
}

// AdmitTokens are service and admin tokens for an admit started by a test.
func AdmitTokens() []string {
	return []string{"ADMIT_SERVICE_TOKEN=test-service-token-0123456789", "ADMIT_ADMIN_TOKEN=test-admin-token-0123456789"}
}

func waitPartitions(ctx context.Context, broker, name string) int {
	for {
		if conn, err := kafka.DialContext(ctx, "tcp", broker); err == nil {
			parts, err := conn.ReadPartitions(name)
			conn.Close()
			if err == nil && len(parts) > 0 {
				return len(parts)
			}
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(100 * time.Millisecond):
		}
	}
}
