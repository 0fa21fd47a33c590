package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// Broker is an Apache Kafka broker (one KRaft node) of one test alone, run from the jars
// `make up` fetched (KAFKA_LIBS), so that the test can stop and start it: a broker outage
// without disturbing the other tests' shared broker.
type Broker struct {
	tb   testing.TB
	addr string
	dir  string
	java []string

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
}

// StartBroker starts a private broker and returns once it answers. It is killed when the
// test ends.
func StartBroker(tb testing.TB) *Broker {
	tb.Helper()
	libs := os.Getenv("KAFKA_LIBS")
	if libs == "" {
		unavailable(tb, "a private Kafka broker", "KAFKA_LIBS", "KAFKA_LIBS unset (make up writes it to .run/env)")
	}
	dir := tb.TempDir()
	b := &Broker{tb: tb, addr: FreeAddr(tb), dir: dir}
	controller := FreeAddr(tb)
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
	if b.cmd != nil {
		b.tb.Fatal("broker already running")
	}
	log, err := os.OpenFile(filepath.Join(b.dir, "kafka.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.tb.Fatal(err)
	}
	cmd := exec.Command(b.java[0], append(b.java[1:], "kafka.Kafka", filepath.Join(b.dir, "server.properties"))...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.tb.Fatalf("start kafka: %v", err)
	}
	b.cmd, b.log = cmd, log
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(b.addr), Timeout: 2 * time.Second}
	for {
		if _, err := client.Metadata(ctx, &kafka.MetadataRequest{}); err == nil {
			return
		}
		if ctx.Err() != nil {
			out, _ := os.ReadFile(filepath.Join(b.dir, "kafka.log"))
			b.tb.Fatalf("private kafka did not start within 2 minutes:\n%s", tail(string(out), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops the broker (SIGTERM, a controlled shutdown) and waits for it to exit.
func (b *Broker) Stop() {
	b.tb.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	_ = b.log.Close()
	b.cmd = nil
}

func (b *Broker) kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil {
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		_ = b.cmd.Wait()
		_ = b.log.Close()
		b.cmd = nil
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
