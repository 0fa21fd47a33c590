// Package outbox moves usage events from admit to Kafka: the relay drains the Redis Stream
// outboxes the admission script writes, and Writer produces events synchronously with acks
// from every in-sync replica.
package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/metergate/metergate/pkg/event"
)

// Writer produces CloudEvents to one topic, keyed (by org) so that one org's events keep
// their order in one partition. A write returns only after every in-sync replica acked it.
type Writer struct {
	w *kafka.Writer
}

// NewWriter returns a Writer to topic on brokers. It never creates topics.
func NewWriter(brokers []string, topic string) *Writer {
	return &Writer{w: &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, // a zero Writer defaults to no acks at all
		BatchTimeout: time.Millisecond,
		BatchSize:    1000,
		WriteTimeout: 5 * time.Second,
		ReadTimeout:  5 * time.Second,
		MaxAttempts:  3,
	}}
}

// Record produces ev with key, synchronously.
func (w *Writer) Record(ctx context.Context, key string, ev event.CloudEvent) error {
	value, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode event %s: %w", ev.ID, err)
	}
	if err := w.w.WriteMessages(ctx, message(key, value)); err != nil {
		return fmt.Errorf("produce event %s: %w", ev.ID, err)
	}
	return nil
}

// Produce writes msgs synchronously; nil means every in-sync replica acked every one.
func (w *Writer) Produce(ctx context.Context, msgs []kafka.Message) error {
	if err := w.w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("produce %d events: %w", len(msgs), err)
	}
	return nil
}

// message is a usage event as a Kafka message: keyed by org, CloudEvents structured JSON.
func message(key string, value []byte) kafka.Message {
	return kafka.Message{
		Key:     []byte(key),
		Value:   value,
		Headers: []kafka.Header{{Key: "content-type", Value: []byte("application/cloudevents+json")}},
	}
}

// Close flushes and closes the writer.
func (w *Writer) Close() error { return w.w.Close() }
