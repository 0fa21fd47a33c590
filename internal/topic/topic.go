// Package topic makes sure a Kafka topic exists with the wanted shape, so a fresh cluster
// works without manual steps.
package topic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
)

// Spec is the shape of a topic at creation. An existing topic is left as it is.
type Spec struct {
	Name              string
	Partitions        int
	ReplicationFactor int
}

// Ensure creates the topic unless it exists, then waits until every partition has a leader
// or ctx ends.
func Ensure(ctx context.Context, brokers []string, spec Spec) error {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic:             spec.Name,
		NumPartitions:     spec.Partitions,
		ReplicationFactor: spec.ReplicationFactor,
	}}})
	if err != nil {
		return fmt.Errorf("create topic %s: %w", spec.Name, err)
	}
	if err := resp.Errors[spec.Name]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", spec.Name, err)
	}
	return waitLeaders(ctx, client, spec.Name)
}

// Delete removes the topic; a topic that does not exist is not an error.
func Delete(ctx context.Context, brokers []string, name string) error {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{name}})
	if err != nil {
		return fmt.Errorf("delete topic %s: %w", name, err)
	}
	if err := resp.Errors[name]; err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
		return fmt.Errorf("delete topic %s: %w", name, err)
	}
	return nil
}

func waitLeaders(ctx context.Context, client *kafka.Client, name string) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{name}})
		switch {
		case err != nil:
			last = err
		case len(meta.Topics) != 1 || meta.Topics[0].Error != nil:
			last = fmt.Errorf("topic %s not in metadata yet", name)
			if len(meta.Topics) == 1 {
				last = meta.Topics[0].Error
			}
		default:
			last = nil
			for _, p := range meta.Topics[0].Partitions {
				if p.Error != nil || p.Leader.Host == "" {
					last = fmt.Errorf("partition %d of %s has no leader yet", p.ID, name)
					break
				}
			}
			if last == nil && len(meta.Topics[0].Partitions) > 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for topic %s: %w (last: %w)", name, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// EnsureRetry is Ensure retried with backoff (0.5 s doubling to 30 s) until it succeeds or
// ctx ends, logging each failure: for services that must ride out a broker that is not up yet.
func EnsureRetry(ctx context.Context, log *slog.Logger, brokers []string, spec Spec) error {
	for backoff := 500 * time.Millisecond; ; backoff = min(2*backoff, 30*time.Second) {
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := Ensure(tctx, brokers, spec)
		cancel()
		if err == nil {
			log.Info("kafka topic ready", "topic", spec.Name, "partitions", spec.Partitions)
			return nil
		}
		log.Warn("kafka topic not ready; retrying", "topic", spec.Name, "err", err, "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return fmt.Errorf("ensure topic %s: %w", spec.Name, ctx.Err())
		case <-time.After(backoff):
		}
	}
}

// EnsureThen returns a task for an errgroup that makes sure of the topic (EnsureRetry) and
// then, unless run is nil, runs run(ctx): for a service that must not wait for the broker
// to start (run nil: admit, whose outbox absorbs a Kafka outage) or that needs the topic
// first (the meter). A ctx that ends before the topic is there ends the task with nil: a
// shutdown, not a failure.
func EnsureThen(ctx context.Context, log *slog.Logger, brokers []string, spec Spec, run func(context.Context) error) func() error {
	return func() error {
		if err := EnsureRetry(ctx, log, brokers, spec); err != nil || run == nil {
			return nil // EnsureRetry ends only with ctx
		}
		return run(ctx)
	}
}
