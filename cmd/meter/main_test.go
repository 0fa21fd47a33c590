package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

func TestMain(m *testing.M) { os.Exit(testenv.MainOrTests(m, main)) }

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	testenv.CheckConfigErrors(t, "METER_ADDR")
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	testenv.CheckServiceLifecycle(t, "METER_ADDR", "postgres", "kafka")
}

// cluster is a test's meter processes: one schema, one topic, one consumer group.
type cluster struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	env    []string
	topic  string
	name   string
	writer *kafka.Writer
}

func newCluster(t *testing.T, partitions int) *cluster {
	t.Helper()
	pool, schema := testenv.EmptySchema(t)
	brokers := testenv.KafkaBrokers(t)
	c := &cluster{
		t: t, ctx: testenv.Context(t, 3*time.Minute), pool: pool,
		topic: testenv.Topic(t, partitions), name: strings.ReplaceAll(testenv.Name(t), "_", "-"),
	}
	c.env = []string{
		"DATABASE_URL=" + testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
		"KAFKA_BROKERS=" + strings.Join(brokers, ","), "KAFKA_TOPIC=" + c.topic,
		"METER_GROUP=" + c.name, "METER_SESSION_TIMEOUT=6s", "METER_BATCH_SIZE=200",
		"LOG_FORMAT=text", "LOG_LEVEL=info",
	}
	c.writer = &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: c.topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: time.Millisecond}
	t.Cleanup(func() { _ = c.writer.Close() })
	return c
}

// start runs a meter process and waits until it is ready; the first one migrates.
func (c *cluster) start(migrate bool) *testenv.Process {
	c.t.Helper()
	addr := testenv.FreeAddr(c.t)
	var args []string
	if migrate {
		args = append(args, "-migrate")
	}
	p := testenv.StartMain(c.t, append(append([]string{}, c.env...), "METER_ADDR="+addr), args...)
	_, err := testenv.WaitHTTP(c.ctx, "http://"+addr+"/readyz", 200)
	require.NoError(c.t, err)
	return p
}

// producer produces admissions in chunks of 250, a chunk every 10 ms, until stopped: faster
// than a meter writes them, so a meter killed mid-run has messages in hand.
type producer struct {
	total atomic.Int64 // events produced and acknowledged so far
	stop  chan struct{}
	errc  chan error
}

func (c *cluster) produce() *producer {
	p := &producer{stop: make(chan struct{}), errc: make(chan error, 1)}
	now := time.Now().UTC()
	go func() {
		for {
			select {
			case <-p.stop:
				p.errc <- nil
				return
			case <-time.After(10 * time.Millisecond): // pacing the load, not synchronisation
			}
			var msgs []kafka.Message
			first := int(p.total.Load())
			for i := first; i < first+250; i++ {
				org := fmt.Sprintf("%s-o%d", c.name, i%10)
				path := []event.PathNode{{Account: org, Kind: "org"}, {Account: org + "-agent", Kind: "agent"}}
				ev, err := event.New(fmt.Sprintf("%s-e%d", c.name, i), "node-1", event.TypeAdmitted, event.Subject(path), now,
					event.Admitted{Org: org, Account: org + "-agent", Path: path, Units: map[string]int64{"requests": 1, "tokens": int64(i)},
						Period: period.MonthLabel(now), Plan: "pro"})
				if err != nil {
					p.errc <- err
					return
				}
				v, _ := json.Marshal(ev)
				msgs = append(msgs, kafka.Message{Key: []byte(org), Value: v})
			}
			if err := c.writer.WriteMessages(c.ctx, msgs...); err != nil {
				p.errc <- err
				return
			}
			p.total.Add(int64(len(msgs)))
		}
	}()
	return p
}

// waitProduced polls until at least n events are produced.
func (c *cluster) waitProduced(p *producer, n int64) {
	c.t.Helper()
	for p.total.Load() < n {
		select {
		case <-c.ctx.Done():
			c.t.Fatalf("timed out waiting for %d events to be produced", n)
		case err := <-p.errc:
			c.t.Fatalf("producer stopped: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// finish stops the producer and returns how many events it produced.
func (p *producer) finish(t *testing.T) int {
	t.Helper()
	close(p.stop)
	require.NoError(t, <-p.errc)
	return int(p.total.Load())
}

func (c *cluster) rows() int64 {
	c.t.Helper()
	var n int64
	require.NoError(c.t, c.pool.QueryRow(c.ctx, `select count(*) from usage_events`).Scan(&n))
	return n
}

// waitRows polls until at least n rows are in usage_events.
func (c *cluster) waitRows(n int64) {
	c.t.Helper()
	for c.rows() < n {
		select {
		case <-c.ctx.Done():
			c.t.Fatalf("timed out waiting for %d rows (have %d)", n, c.rows())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitCaughtUp polls until the group has committed the end offset of every partition:
// the meters have nothing left to write.
func (c *cluster) waitCaughtUp(partitions int) {
	c.t.Helper()
	brokers := testenv.KafkaBrokers(c.t)
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	parts := make([]int, partitions)
	for i := range parts {
		parts[i] = i
	}
	for {
		ends := map[int]int64{}
		for p := range partitions {
			conn, err := kafka.DialLeader(c.ctx, "tcp", brokers[0], c.topic, p)
			require.NoError(c.t, err)
			ends[p], err = conn.ReadLastOffset()
			_ = conn.Close()
			require.NoError(c.t, err)
		}
		resp, err := client.OffsetFetch(c.ctx, &kafka.OffsetFetchRequest{GroupID: c.name, Topics: map[string][]int{c.topic: parts}})
		require.NoError(c.t, err)
		behind := int64(0)
		for _, p := range resp.Topics[c.topic] {
			behind += ends[p.Partition] - max(p.CommittedOffset, 0)
		}
		if behind == 0 {
			return
		}
		select {
		case <-c.ctx.Done():
			c.t.Fatalf("timed out waiting for the group to commit every offset (%d messages behind)", behind)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkExactlyOnce: every produced event is one row, and nothing else is.
func (c *cluster) checkExactlyOnce(n int) {
	c.t.Helper()
	var rows, distinct, ours int64
	require.NoError(c.t, c.pool.QueryRow(c.ctx, `select count(*), count(distinct event_id),
		count(*) filter (where event_id = any (select format('%s-e%s', $1::text, i) from generate_series(0, $2::int - 1) i))
		from usage_events`, c.name, n).Scan(&rows, &distinct, &ours))
	require.EqualValues(c.t, n, rows, "one row per event")
	require.EqualValues(c.t, n, distinct, "no event twice")
	require.EqualValues(c.t, n, ours, "every produced event")
}

// A meter killed with SIGKILL while it has written some events and more arrive, then
// restarted: every event is in PostgreSQL exactly once.
func TestKilledMeterRestartsWithoutLossOrDuplicates(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 4)
	first := c.start(true)
	p := c.produce()
	c.waitRows(1000)
	require.NoError(t, first.Signal(syscall.SIGKILL))
	killedAt := p.total.Load()
	code, err := first.Wait(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, -1, code, "killed by a signal")
	rowsAtKill := c.rows()

	second := c.start(false)
	c.waitProduced(p, killedAt+1000) // events keep arriving after the kill
	n := p.finish(t)
	c.waitCaughtUp(4)
	c.checkExactlyOnce(n)
	t.Logf("killed with %d rows written of %d events produced; %d events in all", rowsAtKill, killedAt, n)

	require.NoError(t, second.Signal(syscall.SIGTERM))
	code, err = second.Wait(30 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code, "SIGTERM: graceful exit")
	require.Contains(t, second.Output(), "meter stopped")
}

// Two meters share the group; one is killed with SIGKILL mid-run. The other takes its
// partitions over: no event lost, none twice.
func TestTwoMetersOneKilled(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 6)
	a := c.start(true)
	b := c.start(false)
	p := c.produce()
	c.waitRows(1000)
	require.NoError(t, a.Signal(syscall.SIGKILL))
	c.waitProduced(p, p.total.Load()+1000) // events keep arriving after the kill
	n := p.finish(t)
	c.waitCaughtUp(6)
	c.checkExactlyOnce(n)
	// Both meters had partitions: each wrote batches.
	require.Contains(t, a.Output(), "meter consuming")
	require.Contains(t, b.Output(), "meter consuming")

	require.NoError(t, b.Signal(syscall.SIGTERM))
	code, err := b.Wait(30 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code)
}
