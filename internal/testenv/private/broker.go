package private

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/metergate/metergate/internal/sandbox"
	"github.com/metergate/metergate/internal/testenv"
)

// Broker is an Apache Kafka broker (one KRaft node) of one test alone, run from the jars
// `make up` fetched (KAFKA_LIBS), so that the test can stop and start it: a broker outage
// without disturbing the other tests' shared broker.
type Broker struct {
	tb   testing.TB
	addr string
	dir  string
	java []string

	mu   sync.Mutex
	proc *sandbox.Proc // nil while stopped
}

// StartBroker starts a private broker and returns once it answers. It is killed when the
// test ends.
func StartBroker(tb testing.TB) *Broker {
	tb.Helper()
	libs := os.Getenv("KAFKA_LIBS")
	if libs == "" {
		testenv.Unavailable(tb, "a private Kafka broker", "KAFKA_LIBS", "KAFKA_LIBS unset (make up writes it to .run/env)")
	}
	dir := tb.TempDir()
	b := &Broker{tb: tb, addr: testenv.FreeAddr(tb), dir: dir}
	controller := testenv.FreeAddr(tb)
	props := fmt.Sprintf(`process.roles=broker,controller
node.id=1
controller.quorum.voters=1@%[2]s
listeners=PLAINTEXT://%[1]s,CONTROLLER://%[2]s
advertised.listeners=PLAINTEXT://%[1]s
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=%[3]s/data
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
`, b.addr, controller, dir)
	if err := os.WriteFile(filepath.Join(dir, "server.properties"), []byte(props), 0o644); err != nil {
		tb.Fatal(err)
	}
	log4j := "status = warn\nappender.out.type = Console\nappender.out.name = OUT\nappender.out.layout.type = PatternLayout\n" +
		"appender.out.layout.pattern = [%d] %p %m (%c)%n\nrootLogger.level = INFO\nrootLogger.appenderRef.out.ref = OUT\n"
	if err := os.WriteFile(filepath.Join(dir, "log4j2.properties"), []byte(log4j), 0o644); err != nil {
		tb.Fatal(err)
	}
	b.java = []string{"java", "-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Dlog4j2.configurationFile=" + filepath.Join(dir, "log4j2.properties"), "-cp", filepath.Join(libs, "*")}
	id, err := exec.Command(b.java[0], append(b.java[1:], "kafka.tools.StorageTool", "random-uuid")...).Output()
	if err != nil {
		tb.Fatalf("kafka random-uuid: %v", err)
	}
	format := exec.Command(b.java[0], append(b.java[1:], "kafka.tools.StorageTool", "format", "-t", strings.TrimSpace(string(id)),
		"-c", filepath.Join(dir, "server.properties"))...)
	if out, err := format.CombinedOutput(); err != nil {
		tb.Fatalf("kafka storage format: %v\n%s", err, out)
	}
	tb.Cleanup(func() { b.kill() })
	b.Start()
	return b
}

// Addr is the broker's bootstrap address.
func (b *Broker) Addr() string { return b.addr }

// Start starts the broker (again) on the same storage and waits until it serves metadata.
func (b *Broker) Start() {
	b.tb.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc != nil {
		b.tb.Fatal("broker already running")
	}
	p, err := sandbox.StartCommand(sandbox.Command{Name: "kafka", Path: b.java[0],
		Args: append(b.java[1:], "kafka.Kafka", filepath.Join(b.dir, "server.properties")), Addr: b.addr,
		Log: filepath.Join(b.dir, "kafka.log"), AppendLog: true, Group: true})
	if err != nil {
		b.tb.Fatal(err)
	}
	b.proc = p
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(b.addr), Timeout: 2 * time.Second}
	for {
		if _, err := client.Metadata(ctx, &kafka.MetadataRequest{}); err == nil {
			return
		}
		if ctx.Err() != nil {
			b.tb.Fatalf("private kafka did not start within 2 minutes:\n%s", tail(p.Output(), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops the broker (SIGTERM, a controlled shutdown) and waits for it to exit.
func (b *Broker) Stop() {
	b.tb.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil {
		return
	}
	_ = b.proc.Stop(time.Minute) // killed, group and all, past the minute
	b.proc = nil
}

func (b *Broker) kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc != nil {
		b.proc.Kill()
		b.proc = nil
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
