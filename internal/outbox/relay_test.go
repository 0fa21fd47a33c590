package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/outbox"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
	"github.com/metergate/metergate/internal/topic"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/lua"
	"github.com/metergate/metergate/pkg/event"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

type testBundle struct {
	rdb    redis.UniversalClient
	adm    *admission.Admitter
	keys   keyspace.Keys
	topic  string
	writer *outbox.Writer
	org    string
}

func setup(t *testing.T, rdb redis.UniversalClient) *testBundle {
	t.Helper()
	keys := keyspace.Keys{Prefix: testenv.Prefix(t) + "mg", Shards: 4}
	b := &testBundle{
		rdb: rdb, keys: keys, topic: testenv.Topic(t, 4),
		adm: admission.New(rdb, admission.Options{KeyPrefix: keys.Prefix, Shards: keys.Shards}),
		org: strings.ReplaceAll(testenv.Name(t), "_", "-"),
	}
	b.writer = outbox.NewWriter(testenv.KafkaBrokers(t), b.topic)
	t.Cleanup(func() { _ = b.writer.Close() })
	return b
}

// admit takes n allowed decisions spread over orgs of every shard and returns their
// event ids.
func (b *testBundle) admit(t *testing.T, n int) map[string]bool {
	t.Helper()
	ids, err := b.tryAdmit(testenv.Context(t, time.Minute), n)
	require.NoError(t, err)
	return ids
}

// tryAdmit is admit for a goroutine other than the test's.
func (b *testBundle) tryAdmit(ctx context.Context, n int) (map[string]bool, error) {
	ids := map[string]bool{}
	for i := range n {
		org := b.org + "-" + strconv.Itoa(i%8)
		pol := policy.Resolved{Org: org, Path: []policy.Level{{Account: org, Kind: policy.Org}}}
		d, err := b.adm.Decide(ctx, admission.Request{EventID: b.adm.NewEventID(org), Policy: pol,
			Units: map[policy.Unit]int64{policy.Requests: 1}, Source: "test"})
		if err != nil {
			return ids, err
		}
		if d.Result != admission.Allow {
			return ids, fmt.Errorf("decision %s, want allow", d.Result)
		}
		ids[d.EventID] = true
	}
	return ids, nil
}

// consume reads the topic from the start until want distinct events arrived, and returns
// how often each event id was seen.
func (b *testBundle) consume(t *testing.T, want int) map[string]int {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: testenv.KafkaBrokers(t), Topic: b.topic, GroupID: "g-" + testenv.Name(t),
		StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond,
	})
	t.Cleanup(func() { _ = r.Close() })
	seen := map[string]int{}
	for len(seen) < want {
		msg, err := r.ReadMessage(ctx)
		require.NoError(t, err, "%d of %d events arrived", len(seen), want)
		var ev event.CloudEvent
		require.NoError(t, json.Unmarshal(msg.Value, &ev), string(msg.Value))
		var data event.Admitted
		require.NoError(t, json.Unmarshal(ev.Data, &data))
		require.Equal(t, data.Org, string(msg.Key), "keyed by org")
		require.Equal(t, "application/cloudevents+json", string(msg.Headers[0].Value))
		seen[ev.ID]++
	}
	return seen
}

func (b *testBundle) outboxLen(t *testing.T) int64 {
	t.Helper()
	var n int64
	for s := range b.keys.Shards {
		for _, stream := range b.keys.Outboxes(s) {
			l, err := b.rdb.XLen(testenv.Context(t, 10*time.Second), stream).Result()
			require.NoError(t, err)
			n += l
		}
	}
	return n
}

// waitEmpty polls until every outbox stream is empty.
func (b *testBundle) waitEmpty(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for b.outboxLen(t) > 0 {
		require.True(t, time.Now().Before(deadline), "the outbox never drained: %d left", b.outboxLen(t))
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *testBundle) run(t *testing.T, p outbox.Producer, o outbox.RelayOptions) (stop func()) {
	t.Helper()
	o.Keys = b.keys
	r := outbox.NewRelay(b.rdb, p, o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// Every event in the outbox reaches Kafka, keyed by org, and leaves the outbox.
func TestRelay(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		ids := b.admit(t, 300)
		reg := prometheus.NewRegistry()
		r := outbox.NewRelay(b.rdb, b.writer, outbox.RelayOptions{Keys: b.keys, Registerer: reg})
		age, err := r.OldestAge(testenv.Context(t, 10*time.Second))
		require.NoError(t, err)
		require.Positive(t, age, "entries wait while no relay runs")

		b.run(t, b.writer, outbox.RelayOptions{Registerer: prometheus.NewRegistry()})
		seen := b.consume(t, len(ids))
		for id, n := range seen {
			require.True(t, ids[id], "unknown event %s", id)
			require.Equal(t, 1, n, "event %s produced once", id)
		}
		b.waitEmpty(t)
		age, err = r.OldestAge(testenv.Context(t, 10*time.Second))
		require.NoError(t, err)
		require.Zero(t, age)
		require.Equal(t, 4, testutil.CollectAndCount(reg, "metergate_outbox_oldest_age_seconds"), "one age per shard")

		// Later events follow.
		more := b.admit(t, 20)
		for id := range more {
			ids[id] = true
		}
		seen = b.consume(t, len(ids))
		require.Len(t, seen, len(ids))
	})
}

// failing fails its first n writes (as a broker that is down would), then produces.
type failing struct {
	out   outbox.Producer
	n     atomic.Int64
	calls atomic.Int64
}

func (f *failing) Produce(ctx context.Context, msgs []kafka.Message) error {
	f.calls.Add(1)
	if f.n.Add(-1) >= 0 {
		return errors.New("kafka: broker unavailable")
	}
	return f.out.Produce(ctx, msgs)
}

// Kafka failing: nothing leaves the outbox until Kafka acks it; every event arrives.
func TestRelayRetriesUntilKafkaAcks(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Redis(t))
	ids := b.admit(t, 100)
	f := &failing{out: b.writer}
	f.n.Store(5)
	reg := prometheus.NewRegistry()
	b.run(t, f, outbox.RelayOptions{Registerer: reg, MaxBackoff: 100 * time.Millisecond})
	seen := b.consume(t, len(ids))
	require.Len(t, seen, len(ids))
	b.waitEmpty(t)
	require.Greater(t, f.calls.Load(), int64(5))
	require.Equal(t, 5.0, kafkaErrors(t, reg), "each failure counted")
}

// kafkaErrors reads metergate_relay_errors_total{service="kafka"}.
func kafkaErrors(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "metergate_relay_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == "kafka" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// stuck takes entries and never acks them, as a relay that died mid-write.
type stuck struct{ got atomic.Int64 }

func (s *stuck) Produce(ctx context.Context, msgs []kafka.Message) error {
	s.got.Add(int64(len(msgs)))
	<-ctx.Done()
	return ctx.Err()
}

// A relay that dies with entries read and unacknowledged: another relay claims them after
// the bound; a relay restarted under the same name sends them at once.
func TestRelayTakesOverPendingEntries(t *testing.T) {
	t.Parallel()
	for _, takeover := range []string{"claimed by another relay", "resumed by the same relay"} {
		t.Run(takeover, func(t *testing.T) {
			t.Parallel()
			b := setup(t, testenv.Redis(t))
			ids := b.admit(t, 50)
			s := &stuck{}
			stop := b.run(t, s, outbox.RelayOptions{Consumer: "dead"})
			deadline := time.Now().Add(30 * time.Second)
			for s.got.Load() < int64(len(ids)) {
				require.True(t, time.Now().Before(deadline), "the first relay never read everything")
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			require.Equal(t, int64(len(ids)), b.outboxLen(t), "nothing acked")

			o := outbox.RelayOptions{Consumer: "dead", ClaimAfter: time.Hour}
			if takeover == "claimed by another relay" {
				o = outbox.RelayOptions{Consumer: "alive", ClaimAfter: 300 * time.Millisecond}
			}
			b.run(t, b.writer, o)
			seen := b.consume(t, len(ids))
			for id := range ids {
				require.Equal(t, 1, seen[id], id)
			}
			b.waitEmpty(t)
		})
	}
}

// An entry that is not an event is still produced (the meter keeps it in dead_letters)
// and leaves the outbox: nothing is dropped, nothing blocks the stream.
func TestRelayForwardsMalformedEntries(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Redis(t))
	ctx := testenv.Context(t, time.Minute)
	require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.keys.Outbox(0), Values: []string{"junk", "1"}}).Err())
	ids := b.admit(t, 10)
	b.run(t, b.writer, outbox.RelayOptions{})
	b.waitEmpty(t)

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: testenv.KafkaBrokers(t), Topic: b.topic,
		GroupID: "g-" + testenv.Name(t), StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { _ = r.Close() })
	var empty, events int
	for empty+events < len(ids)+1 {
		msg, err := r.ReadMessage(ctx)
		require.NoError(t, err)
		if len(msg.Value) == 0 {
			empty++
		} else {
			events++
		}
	}
	require.Equal(t, 1, empty)
	require.Equal(t, len(ids), events)
}

// The broker stopped for 20 s while admissions go on, then started: the relay rides out
// the outage and every event arrives, once.
func TestRelayRidesOutBrokerOutage(t *testing.T) {
	t.Parallel()
	broker := private.StartBroker(t)
	brokers := []string{broker.Addr()}
	b := setup(t, testenv.Redis(t))
	b.topic = "outage"
	ctx := testenv.Context(t, 5*time.Minute)
	require.NoError(t, topic.Ensure(ctx, brokers, topic.Spec{Name: b.topic, Partitions: 4, ReplicationFactor: 1}))
	w := outbox.NewWriter(brokers, b.topic)
	t.Cleanup(func() { _ = w.Close() })
	reg := prometheus.NewRegistry()
	b.run(t, w, outbox.RelayOptions{Registerer: reg, MaxBackoff: time.Second})

	var mu sync.Mutex
	ids := map[string]bool{}
	admitting := make(chan struct{})
	admitted := make(chan error, 1)
	go func() { // admissions go on through the outage
		for {
			got, err := b.tryAdmit(ctx, 10)
			if err != nil {
				admitted <- err
				return
			}
			mu.Lock()
			for id := range got {
				ids[id] = true
			}
			mu.Unlock()
			select {
			case <-admitting:
				admitted <- nil
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	b.waitRelayed(t, reg, 20)
	broker.Stop()
	stopped := time.Now()
	for time.Since(stopped) < 20*time.Second { // the outage: 20 s by the clock, by design
		require.NoError(t, ctx.Err())
		time.Sleep(100 * time.Millisecond)
	}
	require.Positive(t, b.outboxLen(t), "events wait in the outbox while the broker is down")
	broker.Start()
	close(admitting)
	require.NoError(t, <-admitted, "admissions went on through the outage")

	mu.Lock()
	want := len(ids)
	mu.Unlock()
	// Read every partition directly: no consumer group to coordinate on the restarted broker.
	got := make(chan string)
	for p := range 4 {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: b.topic, Partition: p, MaxWait: 100 * time.Millisecond})
		t.Cleanup(func() { _ = r.Close() })
		go func() {
			for {
				msg, err := r.ReadMessage(ctx)
				if ctx.Err() != nil {
					return // the loop below reports what is missing
				}
				if err != nil {
					time.Sleep(100 * time.Millisecond) // a broker that just restarted: read again
					continue
				}
				var ev event.CloudEvent
				if json.Unmarshal(msg.Value, &ev) == nil {
					select {
					case got <- ev.ID:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}
	seen := map[string]int{}
	for len(seen) < want {
		select {
		case id := <-got:
			seen[id]++
		case <-ctx.Done():
			t.Fatalf("%d of %d events arrived", len(seen), want)
		}
	}
	for id := range ids {
		require.Positive(t, seen[id], "event %s lost", id)
	}
	b.waitEmpty(t)
	require.Positive(t, kafkaErrors(t, reg), "the outage was noticed")
	dupes := 0
	for _, n := range seen {
		dupes += n - 1
	}
	// Redelivery is allowed (a write whose ack was lost is produced again; the meter
	// deduplicates by event id); loss is not.
	t.Logf("%d events through a 20 s broker outage; %d produced more than once", want, dupes)
}

// waitRelayed waits until the relay has produced at least n events.
func (b *testBundle) waitRelayed(t *testing.T, reg *prometheus.Registry, n float64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "metergate_relay_produced_total" && mf.GetMetric()[0].GetCounter().GetValue() >= n {
				return
			}
		}
		require.True(t, time.Now().Before(deadline), "the relay never produced %v events", n)
		time.Sleep(20 * time.Millisecond)
	}
}

// Redis loses the streams and the relay's consumer group while the relay runs (restarted
// empty, or the keys deleted), and admissions go on: the relay makes the group again and
// every later event arrives.
func TestRelayRecreatesLostGroup(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		b.run(t, b.writer, outbox.RelayOptions{Registerer: prometheus.NewRegistry(), MaxBackoff: 200 * time.Millisecond})
		ids := b.admit(t, 40)
		b.consume(t, len(ids))
		b.waitEmpty(t)

		ctx := testenv.Context(t, time.Minute)
		for s := range b.keys.Shards {
			require.NoError(t, rdb.Del(ctx, b.keys.Outbox(s)).Err())
		}
		for id := range b.admit(t, 40) {
			ids[id] = true
		}
		seen := b.consume(t, len(ids))
		for id := range ids {
			require.Positive(t, seen[id], "event %s lost", id)
		}
		b.waitEmpty(t)
	})
}

// wiping deletes the outbox streams (and with them the relay's group) during the first
// Kafka write: Redis restarted empty while a batch was on its way.
type wiping struct {
	out  outbox.Producer
	wipe func(context.Context) error
	once sync.Once
}

func (w *wiping) Produce(ctx context.Context, msgs []kafka.Message) error {
	var err error
	w.once.Do(func() { err = w.wipe(ctx) })
	if err != nil {
		return err
	}
	return w.out.Produce(ctx, msgs)
}

// Redis loses the group between the relay's Kafka write and its acknowledgement (NOGROUP
// on the ack): the relay must not retry that ack for ever, but make the group again and
// relay every later event. (The events deleted with the streams are gone: not checked.)
func TestRelayLosesGroupMidBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Redis(t))
	b.admit(t, 40)
	wiped := make(chan struct{})
	w := &wiping{out: b.writer, wipe: func(ctx context.Context) error {
		defer close(wiped)
		for s := range b.keys.Shards {
			if err := b.rdb.Del(ctx, b.keys.Outbox(s)).Err(); err != nil {
				return err
			}
		}
		return nil
	}}
	b.run(t, w, outbox.RelayOptions{Registerer: prometheus.NewRegistry(), MaxBackoff: 200 * time.Millisecond})
	<-wiped
	later := b.admit(t, 40)

	ctx := testenv.Context(t, time.Minute)
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: testenv.KafkaBrokers(t), Topic: b.topic,
		GroupID: "g-" + testenv.Name(t), StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { _ = r.Close() })
	for arrived := 0; arrived < len(later); {
		msg, err := r.ReadMessage(ctx)
		require.NoError(t, err, "%d of the %d events admitted after the wipe arrived", arrived, len(later))
		var ev event.CloudEvent
		require.NoError(t, json.Unmarshal(msg.Value, &ev), string(msg.Value))
		if later[ev.ID] {
			later[ev.ID] = false
			arrived++
		}
	}
	b.waitEmpty(t)
}

// The relay deletes the consumers of relays that are gone (idle past ForgetAfter, holding
// nothing) and keeps one that still holds an entry, so nothing it holds is orphaned.
func TestRelayForgetsIdleConsumers(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		ctx := testenv.Context(t, time.Minute)
		stream := b.keys.Outbox(0)
		require.NoError(t, rdb.XGroupCreateMkStream(ctx, stream, "relay", "0").Err())
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"k": "x", "v": "{}"}}).Err())
		held, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "relay", Consumer: "gone-holding", Streams: []string{stream, ">"}, Count: 1, Block: -1}).Result()
		require.NoError(t, err)
		require.Len(t, held[0].Messages, 1)
		require.NoError(t, rdb.XGroupCreateConsumer(ctx, stream, "relay", "gone-empty").Err())

		reg := prometheus.NewRegistry()
		b.run(t, b.writer, outbox.RelayOptions{Consumer: "me", Registerer: reg, ForgetAfter: 300 * time.Millisecond, ClaimAfter: time.Hour})
		consumers := func() map[string]int64 {
			cs, err := rdb.XInfoConsumers(ctx, stream, "relay").Result()
			require.NoError(t, err)
			m := map[string]int64{}
			for _, c := range cs {
				m[c.Name] = c.Pending
			}
			return m
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, ok := consumers()["gone-empty"]; !ok {
				break
			}
			require.True(t, time.Now().Before(deadline), "the idle consumer was never forgotten: %v", consumers())
			time.Sleep(50 * time.Millisecond)
		}
		got := consumers()
		require.Equal(t, int64(1), got["gone-holding"], "a consumer holding an entry is kept: %v", got)
		require.Contains(t, got, "me")
		// The script itself keeps a consumer that holds an entry, whatever its caller saw.
		n, err := lua.ForgetConsumer.Run(ctx, rdb, []string{stream}, "relay", "gone-holding").Int()
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, int64(1), consumers()["gone-holding"])
		require.Equal(t, 1.0, testenv.CounterValue(t, reg, "metergate_relay_consumers_forgotten_total"))
	})
}

// The relay trims its stream (XTRIM MINID) only below the oldest entry any relay of the
// group still holds: entries a dead relay read and never acknowledged stay in the stream,
// as do those after them, until they are claimed and produced; then the stream drains.
func TestRelayTrimsOnlyWhatIsAcknowledged(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Redis(t))
	ctx := testenv.Context(t, time.Minute)
	first := b.admit(t, 24)
	// A relay that dies holding the first 2 entries of every stream.
	held := map[string]bool{}
	for s := range b.keys.Shards {
		stream := b.keys.Outbox(s)
		require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, stream, "relay", "0").Err())
		res, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "relay", Consumer: "dead",
			Streams: []string{stream, ">"}, Count: 2}).Result()
		require.NoError(t, err)
		for _, m := range res[0].Messages {
			_, v, err := wire.OutboxMessage(m.Values)
			require.NoError(t, err)
			var ev event.CloudEvent
			require.NoError(t, json.Unmarshal(v, &ev))
			held[ev.ID] = true
		}
	}
	require.Len(t, held, 2*b.keys.Shards)
	more := b.admit(t, 24)

	stop := b.run(t, b.writer, outbox.RelayOptions{Consumer: "alive", ClaimAfter: time.Hour})
	seen := b.consume(t, len(first)+len(more)-len(held))
	for id := range held {
		require.Zero(t, seen[id], "held by the dead relay")
	}
	stop()
	require.Equal(t, int64(len(first)+len(more)), b.outboxLen(t), "nothing at or after a held entry is trimmed")

	b.run(t, b.writer, outbox.RelayOptions{Consumer: "alive", ClaimAfter: 200 * time.Millisecond})
	seen = b.consume(t, len(first)+len(more))
	for id := range held {
		require.Equal(t, 1, seen[id], "claimed and produced")
	}
	b.waitEmpty(t)
}

// Entries written before the compact outbox entry (the Kafka key in "k", the CloudEvent
// JSON in "v"), still in the streams during a rolling upgrade, are relayed as they are,
// beside compact ones.
func TestRelayOldFormatEntries(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Redis(t))
	ctx := testenv.Context(t, time.Minute)
	ids := b.admit(t, 8)
	old := event.CloudEvent{SpecVersion: "1.0", ID: b.adm.NewEventID(b.org + "-0"), Source: "old-admit",
		Type: event.TypeAdmitted, Subject: b.org + "-0", Time: time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC),
		DataContentType: "application/json", Data: json.RawMessage(`{"org":"` + b.org + `-0","account":"` + b.org + `-0","path":[{"account":"` + b.org + `-0","kind":"org"}],"units":{"requests":1},"period":"2026-11","plan":""}`)}
	raw, err := json.Marshal(old)
	require.NoError(t, err)
	// Written as a node of the earlier version writes during a rolling upgrade: to the
	// legacy stream, which only relays of this version read beside the new one.
	require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.keys.LegacyOutbox(b.keys.Shard(b.org + "-0")),
		Values: []string{"k", b.org + "-0", "v", string(raw)}}).Err())
	b.run(t, b.writer, outbox.RelayOptions{})
	seen := b.consume(t, len(ids)+1)
	require.Equal(t, 1, seen[old.ID], "the old entry arrived")
	for id := range ids {
		require.Equal(t, 1, seen[id])
	}
	b.waitEmpty(t)
}

// recording notes when Produce is first called, and takes every write.
type recording struct {
	first    atomic.Pointer[time.Time]
	produced atomic.Int64
}

func (r *recording) Produce(_ context.Context, msgs []kafka.Message) error {
	now := time.Now()
	r.first.CompareAndSwap(nil, &now)
	r.produced.Add(int64(len(msgs)))
	return nil
}

// With WaitReplicas the relay produces nothing a replica does not hold: while the replica
// is busy (it acknowledges nothing), the entries wait in the outbox; once it is back they
// are produced, every one.
func TestRelayWaitsForReplicas(t *testing.T) {
	t.Parallel()
	primary, replica := private.StartRedisReplicated(t)
	rdb := redis.NewClient(&redis.Options{Addr: primary.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	b := setup(t, rdb)
	ctx := testenv.Context(t, time.Minute)
	stalled, err := private.StallRedis(ctx, &redis.Options{Addr: replica.Addr()}, 1500*time.Millisecond)
	require.NoError(t, err)
	ids := b.admit(t, 40) // written on the primary, on no replica until the stall ends
	out := &recording{}
	b.run(t, out, outbox.RelayOptions{Registerer: prometheus.NewRegistry(), MaxBackoff: 50 * time.Millisecond,
		WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	require.NoError(t, <-stalled)
	stallEnded := time.Now()
	require.Eventually(t, func() bool { return out.produced.Load() >= int64(len(ids)) }, 30*time.Second, 10*time.Millisecond)
	first := out.first.Load()
	require.NotNil(t, first)
	require.False(t, first.Before(stallEnded.Add(-50*time.Millisecond)),
		"produced at %s, %s before the replica could acknowledge", first.Format(time.StampMicro), stallEnded.Sub(*first))
	b.waitEmpty(t)
}
