package topic_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/topic"
)

func TestEnsureIsIdempotent(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	ctx := testenv.Context(t, time.Minute)
	name := testenv.Topic(t, 3)
	// Ensuring an existing topic succeeds and leaves its shape alone.
	require.NoError(t, topic.Ensure(ctx, brokers, topic.Spec{Name: name, Partitions: 7, ReplicationFactor: 1}))
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	require.NoError(t, err)
	defer conn.Close()
	parts, err := conn.ReadPartitions(name)
	require.NoError(t, err)
	require.Len(t, parts, 3)
}

// EnsureThen runs its task once the topic is there, and ends with nil, without running
// it, when its context ends first (a broker that never answers).
func TestEnsureThen(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	ctx := testenv.Context(t, time.Minute)
	log := slog.New(slog.DiscardHandler)
	name := testenv.Topic(t, 2)
	errRun := errors.New("ran")
	run := func(context.Context) error { return errRun }
	require.ErrorIs(t, topic.EnsureThen(ctx, log, brokers, topic.Spec{Name: name, Partitions: 2, ReplicationFactor: 1}, run)(), errRun)
	require.NoError(t, topic.EnsureThen(ctx, log, brokers, topic.Spec{Name: name, Partitions: 2, ReplicationFactor: 1}, nil)())

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	ran := false
	task := topic.EnsureThen(short, log, []string{"127.0.0.1:1"}, topic.Spec{Name: name, Partitions: 1, ReplicationFactor: 1},
		func(context.Context) error { ran = true; return nil })
	require.NoError(t, task())
	require.False(t, ran)
}

// A produce/consume round trip through the broker: acks from every in-sync replica, a
// consumer group, and offsets committed after the messages are handled.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	ctx := testenv.Context(t, 2*time.Minute)
	name := testenv.Topic(t, 4)

	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        name,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
	}
	defer w.Close()
	const n = 200
	want := make(map[string]string, n)
	msgs := make([]kafka.Message, 0, n)
	for i := range n {
		k, v := fmt.Sprintf("org-%d", i%7), fmt.Sprintf("event-%d", i)
		want[v] = k
		msgs = append(msgs, kafka.Message{Key: []byte(k), Value: []byte(v)})
	}
	require.NoError(t, w.WriteMessages(ctx, msgs...))

	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:     brokers,
		Topic:       name,
		GroupID:     "g-" + testenv.Name(t),
		StartOffset: kafka.FirstOffset,
		MaxWait:     100 * time.Millisecond,
	})
	defer r.Close()
	got := make(map[string]string, n)
	partitionOf := make(map[string]int)
	for len(got) < n {
		m, err := r.FetchMessage(ctx)
		require.NoError(t, err, "after %d of %d messages", len(got), n)
		got[string(m.Value)] = string(m.Key)
		if p, ok := partitionOf[string(m.Key)]; ok {
			require.Equal(t, p, m.Partition, "one key, one partition")
		}
		partitionOf[string(m.Key)] = m.Partition
		require.NoError(t, r.CommitMessages(ctx, m))
	}
	require.Equal(t, want, got)
}
