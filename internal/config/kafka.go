package config

import (
	"errors"
	"fmt"
	"net"
	"regexp"

	"github.com/metergate/metergate/internal/outbox"
	"github.com/metergate/metergate/internal/topic"
)

// Kafka locates the brokers and names the usage topic.
type Kafka struct {
	Brokers           []string
	Topic             string
	Partitions        int
	ReplicationFactor int
}

// Register adds KAFKA_BROKERS, KAFKA_TOPIC, KAFKA_TOPIC_PARTITIONS and KAFKA_TOPIC_REPLICATION.
func (c *Kafka) Register(l *Loader) {
	l.List(&c.Brokers, "KAFKA_BROKERS", []string{"127.0.0.1:9092"}, "comma-separated host:port of Kafka brokers")
	l.String(&c.Topic, "KAFKA_TOPIC", "usage.events", "topic of usage events")
	l.Int(&c.Partitions, "KAFKA_TOPIC_PARTITIONS", 12, "partitions of the topic when it is created")
	l.Int(&c.ReplicationFactor, "KAFKA_TOPIC_REPLICATION", 1, "replication factor of the topic when it is created")
}

var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// Validate reports missing brokers, a bad topic name or a bad topic shape.
func (c Kafka) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("KAFKA_BROKERS: at least one broker is needed"))
	}
	for _, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			errs = append(errs, fmt.Errorf("KAFKA_BROKERS: %q is not host:port", b))
		}
	}
	if !topicName.MatchString(c.Topic) || c.Topic == "." || c.Topic == ".." {
		errs = append(errs, fmt.Errorf("KAFKA_TOPIC=%q: want 1-249 of [a-zA-Z0-9._-]", c.Topic))
	}
	if c.Partitions < 1 {
		errs = append(errs, fmt.Errorf("KAFKA_TOPIC_PARTITIONS=%d: want at least 1", c.Partitions))
	}
	if c.ReplicationFactor < 1 {
		errs = append(errs, fmt.Errorf("KAFKA_TOPIC_REPLICATION=%d: want at least 1", c.ReplicationFactor))
	}
	return prefix("kafka", errs)
}

// Spec is the shape the topic is created with.
func (c Kafka) Spec() topic.Spec {
	return topic.Spec{Name: c.Topic, Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor}
}

// Writer returns a writer of the usage topic (internal/outbox). It does not dial.
func (c Kafka) Writer() *outbox.Writer { return outbox.NewWriter(c.Brokers, c.Topic) }
