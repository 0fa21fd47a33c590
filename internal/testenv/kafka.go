package testenv

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"

	"github.com/metergate/metergate/internal/topic"
)

// kafkaImage is the image testcontainers-go starts when KAFKA_BROKERS is unset. The
// testcontainers kafka module drives Confluent's KRaft image (Apache Kafka 3.9 inside);
// `make up` and CI run Apache Kafka 4.x itself.
const kafkaImage = "confluentinc/confluent-local:7.9.0"

var kafkaContainer container[[]string]

// KafkaBrokers returns the bootstrap addresses of the test Kafka.
func KafkaBrokers(tb testing.TB) []string {
	tb.Helper()
	if b := os.Getenv("KAFKA_BROKERS"); b != "" {
		return strings.Split(b, ",")
	}
	if !dockerAvailable() {
		Unavailable(tb, "Kafka", "KAFKA_BROKERS", "KAFKA_BROKERS unset and no Docker daemon")
	}
	brokers, err := kafkaContainer.get(func(ctx context.Context) ([]string, testcontainers.Container, error) {
		c, err := tckafka.Run(ctx, kafkaImage)
		if err != nil {
			return nil, c, err
		}
		b, err := c.Brokers(ctx)
		return b, c, err
	})
	if err != nil {
		Unavailable(tb, "Kafka", "KAFKA_BROKERS", "testcontainers: "+err.Error())
	}
	return brokers
}

// Topic creates a topic of this test alone, "t.<name>", with the given number of
// partitions, and deletes it when the test ends.
func Topic(tb testing.TB, partitions int) string {
	tb.Helper()
	brokers := KafkaBrokers(tb)
	name := "t." + Name(tb)
	if err := topic.Ensure(Context(tb, time.Minute), brokers, topic.Spec{Name: name, Partitions: partitions, ReplicationFactor: 1}); err != nil {
		Unavailable(tb, "Kafka", "KAFKA_BROKERS", err.Error())
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := topic.Delete(ctx, brokers, name); err != nil {
			tb.Errorf("delete topic %s: %v", name, err)
		}
	})
	return name
}
