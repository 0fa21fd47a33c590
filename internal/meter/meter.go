// Package meter writes the billing log. A Meter consumes the usage events on Kafka as a
// member of a consumer group and writes one row per event into PostgreSQL (usage_events,
// usage_borrowings for the rate capacity an admission borrowed, credit_consumptions for
// what it drew from credit grants, usage_outcomes, and dead_letters for messages it cannot
// parse or validate).
//
// Guarantee: every event on the topic ends up exactly once in PostgreSQL. Messages are
// written in batches, one transaction each, and a batch's Kafka offsets are committed only
// after its transaction has committed: a crash, a rebalance or an unavailable PostgreSQL
// can make messages be delivered again (kafka-go consumer groups redeliver after a
// rebalance, issues #970 and #1308), never skipped. What is delivered again is absorbed by
// the unique keys: usage_events is unique on the event id for ever, usage_outcomes on the
// admission's event id, usage_borrowings on the event id, account and unit,
// credit_consumptions on the event id and grant, dead_letters on the Kafka position.
package meter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/metergate/metergate/internal/period"
)

// The meter's defaults.
const (
	// DefaultGroup is the Kafka consumer group of the meters unless configured otherwise
	// (Options.Group has no default: it is required).
	DefaultGroup = "metergate-meter"
	// DefaultBatchSize is the most messages per batch.
	DefaultBatchSize = 1000
	// DefaultBatchWait is how long a batch waits to fill once its first message is in.
	DefaultBatchWait = 200 * time.Millisecond
	// DefaultSessionTimeout is how long the group coordinator waits for a silent meter.
	DefaultSessionTimeout = 30 * time.Second
)

// Options configure a Meter. Brokers, Topic and Group are required; zero values of the
// others take the defaults named.
type Options struct {
	// Clock picks the months whose partitions are kept ahead (nil: the system clock).
	Clock   period.Clock
	Brokers []string
	Topic   string
	// Group is the Kafka consumer group: meters of one group share the topic's partitions.
	// A new group starts at the first offset of every partition.
	Group string
	// BatchSize is the most messages per batch (1000). BatchWait is how long a batch waits
	// to fill once its first message is in (200 ms).
	BatchSize int
	BatchWait time.Duration
	// Writers is how many batches are parsed and written at once, each in a transaction of
	// its own (3: on 2 cores, 3 wrote more than 2 or 4). Offsets are still committed in
	// order, each batch's once its rows and those of every batch fetched before it are.
	Writers int
	// SessionTimeout is how long the group coordinator waits for a silent meter (killed,
	// partitioned) before giving its partitions to the others (30 s).
	SessionTimeout time.Duration
	// FlushTimeout bounds the shutdown: once Run's context ends, the batch in hand has this
	// long to be written and its offsets committed (10 s).
	FlushTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between attempts at a batch that could not be
	// written (100 ms doubling up to 5 s).
	RetryMin, RetryMax time.Duration
	// PartitionCheck is how often the meter makes sure usage_events has partitions for the
	// current and the next two months (1 h).
	PartitionCheck time.Duration
	// Logger receives the meter's logs (none when nil).
	Logger *slog.Logger
	// Registerer receives the meter's metrics (not registered when nil).
	Registerer prometheus.Registerer
	// Failpoint, when set, is called at each failpoint (BeforeWrite, AfterWrite), for crash
	// tests: it may hold the meter there until the process is killed, or return an error,
	// which stops Run there as a crash would (the batch's offsets are not committed).
	Failpoint func(point string) error
}

// Failpoints: where Options.Failpoint is called, so that a crash test can kill the meter
// in the middle of a batch.
const (
	// BeforeWrite: a batch is fetched and parsed, none of its rows written: a meter that
	// dies there has messages in hand that the group must deliver again.
	BeforeWrite = "before-write"
	// AfterWrite: a batch's rows are committed in PostgreSQL and its Kafka offsets are not
	// yet: a meter that dies there leaves rows that the group delivers again to its
	// successor, which must skip them.
	AfterWrite = "after-write"
)

// writeTimeout bounds one attempt at writing a batch of n messages, so that a PostgreSQL
// that stopped answering is retried rather than waited on for ever: 30 s, more for batches
// so large that they could take that long.
func writeTimeout(n int) time.Duration {
	return max(30*time.Second, time.Duration(n)*2*time.Millisecond)
}

// Meter moves usage events from Kafka into PostgreSQL. Run it once.
type Meter struct {
	opts    Options
	log     *slog.Logger
	config  kafka.ReaderConfig
	reader  atomic.Pointer[kafka.Reader] // while Run runs
	store   *store
	metrics *metrics
	fetched atomic.Int64 // messages fetched so far, for tests
}

// New returns a Meter writing through pool. It joins the consumer group when Run starts.
func New(pool *pgxpool.Pool, opts Options) (*Meter, error) {
	if len(opts.Brokers) == 0 || opts.Topic == "" || opts.Group == "" {
		return nil, errors.New("meter: brokers, topic and group are required")
	}
	if opts.Writers < 0 {
		return nil, fmt.Errorf("meter: writers %d: want at least 1", opts.Writers)
	}
	setDefault(&opts.BatchSize, DefaultBatchSize)
	setDefault(&opts.BatchWait, DefaultBatchWait)
	setDefault(&opts.Writers, 3)
	setDefault(&opts.SessionTimeout, DefaultSessionTimeout)
	setDefault(&opts.FlushTimeout, 10*time.Second)
	setDefault(&opts.RetryMin, 100*time.Millisecond)
	setDefault(&opts.RetryMax, 5*time.Second)
	setDefault(&opts.PartitionCheck, time.Hour)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	heartbeat := min(3*time.Second, opts.SessionTimeout/3)
	m := &Meter{opts: opts, log: log, store: newStore(pool, opts.Topic)}
	m.config = kafka.ReaderConfig{
		Brokers:        opts.Brokers,
		GroupID:        opts.Group,
		Topic:          opts.Topic,
		StartOffset:    kafka.FirstOffset,
		CommitInterval: 0, // synchronous: CommitMessages returns once the broker has the offsets
		MinBytes:       1,
		MaxBytes:       10 << 20,
		MaxWait:        500 * time.Millisecond,
		QueueCapacity:  opts.BatchSize,
		// A meter that stops heartbeating loses its partitions after SessionTimeout; a
		// rebalance waits that long at most for members to rejoin.
		SessionTimeout:        opts.SessionTimeout,
		RebalanceTimeout:      opts.SessionTimeout,
		HeartbeatInterval:     heartbeat,
		JoinGroupBackoff:      time.Second,
		WatchPartitionChanges: true,
		Logger: kafka.LoggerFunc(func(msg string, args ...any) {
			log.Debug(fmt.Sprintf(msg, args...), "component", "kafka")
		}),
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
			log.Warn(fmt.Sprintf(msg, args...), "component", "kafka")
		}),
	}
	if err := m.config.Validate(); err != nil {
		return nil, fmt.Errorf("meter: %w", err)
	}
	m.metrics = newMetrics(func() float64 {
		if r := m.reader.Load(); r != nil {
			return float64(r.Stats().Lag)
		}
		return 0
	})
	if opts.Registerer != nil {
		if err := m.metrics.register(opts.Registerer); err != nil {
			return nil, fmt.Errorf("register meter metrics: %w", err)
		}
	}
	return m, nil
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// Run consumes until ctx ends, then writes the batches in hand and commits their offsets
// (within FlushTimeout), leaves the group and returns nil. While PostgreSQL cannot take the
// batches in hand, Run retries them with backoff and neither commits offsets nor fetches
// further messages; Kafka errors are logged and retried too. It returns an error only when a
// batch in hand could not be written before the shutdown deadline: its offsets and those of
// the batches fetched after it are then not committed, and the messages go to the group's
// next consumer.
func (m *Meter) Run(ctx context.Context) error {
	reader := kafka.NewReader(m.config) // joins the group
	m.reader.Store(reader)
	defer func() {
		if err := reader.Close(); err != nil { // leaves the group
			m.log.Warn("close kafka reader", "err", err)
		}
	}()
	var wg sync.WaitGroup
	pctx, stopPartitions := context.WithCancel(ctx)
	wg.Go(func() { m.keepPartitions(pctx) })
	defer func() { stopPartitions(); wg.Wait() }()

	// Writes and commits outlive ctx by FlushTimeout, so a shutdown completes its batches.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(m.opts.FlushTimeout, cancel) })
	defer stop()

	m.log.Info("meter consuming", "topic", m.opts.Topic, "group", m.opts.Group,
		"batch_size", m.opts.BatchSize, "batch_wait", m.opts.BatchWait.String(), "writers", m.opts.Writers)

	// Three stages: one goroutine fetches batches; Writers goroutines parse and write them,
	// each batch in a transaction of its own, so that PostgreSQL works on one batch while the
	// next is parsed or waits for its commit to be flushed; this goroutine commits the
	// batches' offsets in the order they were fetched, each once its own rows and those of
	// every batch before it are committed. A batch is handed to a writer without a buffer: at
	// most Writers batches are written at once, and one more is fetched.
	toWrite := make(chan *batch)
	inOrder := make(chan *batch, m.opts.Writers) // fetched order; a writer has each already
	failed := make(chan struct{})                // closed once a batch could not be written
	fctx, stopFetching := context.WithCancel(ctx)
	defer stopFetching()
	var stages sync.WaitGroup
	var fetchErr error
	stages.Go(func() {
		defer close(inOrder)
		defer close(toWrite)
		fetchErr = m.fetchBatches(fctx, reader, toWrite, inOrder, failed)
	})
	for range m.opts.Writers {
		stages.Go(func() {
			for b := range toWrite {
				b.parse()
				if b.err = m.fail(BeforeWrite); b.err == nil {
					b.start = time.Now()
					b.written, b.err = m.write(wctx, b.items)
				}
				close(b.done)
			}
		})
	}
	var writeErr error
	flushed := 0
	for b := range inOrder {
		<-b.done
		err := b.err
		if err == nil && writeErr == nil {
			err = m.fail(AfterWrite)
		}
		if writeErr == nil && err != nil {
			// Neither its offsets nor those of a batch after it may be committed: stop, and
			// wait for the writers to give up the batches they have.
			writeErr = err
			close(failed)
			stopFetching()
		}
		if writeErr != nil {
			continue
		}
		m.commit(wctx, reader, b)
		if ctx.Err() != nil {
			flushed += len(b.msgs)
		}
	}
	stages.Wait()
	if err := errors.Join(writeErr, fetchErr); err != nil {
		return err
	}
	m.log.Info("meter stopped", "flushed", flushed)
	return nil
}

func (m *Meter) fail(point string) error {
	if m.opts.Failpoint == nil {
		return nil
	}
	if err := m.opts.Failpoint(point); err != nil {
		return fmt.Errorf("failpoint %s: %w", point, err)
	}
	return nil
}

// batch is a batch of messages on its way through Run's stages.
type batch struct {
	msgs    []kafka.Message
	items   []item    // what each message became
	start   time.Time // when its write began
	written written
	err     error         // why it could not be written
	done    chan struct{} // closed once written (or given up: err)
}

func (b *batch) parse() {
	b.items = make([]item, len(b.msgs))
	for i, msg := range b.msgs {
		p := parse(msg.Value, msg.Partition, msg.Offset)
		b.items[i] = item{partition: msg.Partition, offset: msg.Offset, key: msg.Key, value: msg.Value,
			usage: p.usage, outcome: p.outcome, void: p.void, alert: p.alert, err: p.err}
	}
}

// fetchBatches fetches batches and hands each to a writer (toWrite) and then to the
// committer (inOrder), until ctx ends (the batch in hand is handed on first) or a batch
// could not be written (failed). Kafka errors are logged and retried, except a closed
// reader.
//
// After a Kafka error it waits only RetryMin, never longer: kafka-go paces its own retries
// (a partition reader waits up to 1 s between attempts to reach a leader) and queues each
// error it reports among the messages, where it waits until FetchMessage takes it. While a
// broker was down its partition readers queued an error at every attempt; a meter that
// waited longer after each (it used to double the wait up to RetryMax) took that backlog of
// errors, and the messages queued behind it, at one every 5 s: after a partition leader was
// SIGKILLed it was still reading those errors a minute later (chaos scenario 15).
func (m *Meter) fetchBatches(ctx context.Context, reader *kafka.Reader, toWrite, inOrder chan<- *batch, failed <-chan struct{}) error {
	for {
		msgs, ferr := m.fetch(ctx, reader)
		if len(msgs) > 0 {
			b := &batch{msgs: msgs, done: make(chan struct{})}
			select {
			case toWrite <- b:
			case <-failed:
				return nil
			}
			select {
			case inOrder <- b:
			case <-failed:
				return nil
			}
		}
		switch {
		case ferr == nil:
		case ctx.Err() != nil:
			return nil
		case errors.Is(ferr, io.EOF):
			return fmt.Errorf("fetch from %s: the reader closed", m.opts.Topic)
		default:
			// kafka-go reports errors it goes on healing from (a group it could not join, a
			// partition's leader moving): wait and fetch again.
			m.metrics.fetchErrs.Inc()
			m.log.Warn("fetch from kafka failed; retrying", "err", ferr, "retry_in", m.opts.RetryMin.String())
			select {
			case <-ctx.Done():
			case <-time.After(m.opts.RetryMin):
			}
		}
	}
}

// fetch returns the next batch: blocks for its first message, then takes what arrives
// within BatchWait, up to BatchSize. With an error it returns what it had fetched before.
func (m *Meter) fetch(ctx context.Context, reader *kafka.Reader) ([]kafka.Message, error) {
	first, err := reader.FetchMessage(ctx)
	if err != nil {
		return nil, err
	}
	msgs := make([]kafka.Message, 1, m.opts.BatchSize)
	msgs[0] = first
	m.fetched.Add(1)
	bctx, cancel := context.WithTimeout(ctx, m.opts.BatchWait)
	defer cancel()
	for len(msgs) < m.opts.BatchSize {
		msg, err := reader.FetchMessage(bctx)
		if err != nil {
			if ctx.Err() == nil && bctx.Err() != nil {
				return msgs, nil // the wait is over
			}
			return msgs, err
		}
		m.fetched.Add(1)
		msgs = append(msgs, msg)
	}
	return msgs, nil
}

// commit commits the offsets of a batch whose rows are committed, then counts the batch.
func (m *Meter) commit(ctx context.Context, reader *kafka.Reader, b *batch) {
	if err := reader.CommitMessages(ctx, lastOfEachPartition(b.msgs)...); err != nil {
		// The rows are committed: the messages may come again and be skipped as duplicates.
		m.metrics.commitErrs.Inc()
		m.log.Warn("commit kafka offsets failed; the batch may be delivered again (its rows are deduplicated)",
			"err", err, "messages", len(b.msgs))
	}
	elapsed, w := time.Since(b.start), b.written
	m.metrics.observe(w)
	m.metrics.batch.Observe(elapsed.Seconds())
	m.metrics.batchSize.Observe(float64(len(b.msgs)))
	m.metrics.messages.Add(float64(len(b.msgs))) // last: a reader that sees it sees the rest of the batch's counts
	m.log.Debug("batch written", "messages", len(b.msgs), "usage_events", w.usage.inserted, "usage_borrowings", w.borrowings.inserted, "credit_consumptions", w.credits.inserted, "usage_outcomes", w.outcomes.inserted, "usage_voids", w.voids.inserted, "usage_alerts", w.alerts.inserted,
		"dead_letters", w.deadLetters.staged, "duplicates", w.usage.staged-w.usage.inserted+w.borrowings.staged-w.borrowings.inserted+w.credits.staged-w.credits.inserted+w.outcomes.staged-w.outcomes.inserted+w.voids.staged-w.voids.inserted+w.alerts.staged-w.alerts.inserted,
		"elapsed", elapsed.String())
}

// write writes items, retrying with backoff until it succeeds or ctx ends.
func (m *Meter) write(ctx context.Context, items []item) (written, error) {
	backoff := m.opts.RetryMin
	for {
		actx, cancel := context.WithTimeout(ctx, writeTimeout(len(items)))
		w, err := m.store.write(actx, items)
		if isContentError(err) {
			m.log.Warn("PostgreSQL refused the batch for its content; writing its messages one by one", "err", err, "messages", len(items))
			w, err = m.store.writeEach(actx, items)
		}
		cancel()
		if err == nil {
			return w, nil
		}
		if ctx.Err() != nil {
			return written{}, fmt.Errorf("write a batch of %d messages (offsets not committed: the messages will be delivered again): %w", len(items), err)
		}
		m.metrics.retries.Inc()
		m.log.Warn("write batch failed; retrying", "err", err, "messages", len(items), "retry_in", backoff.String())
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, m.opts.RetryMax)
	}
}

// keepPartitions makes sure the partitions of the current and the next two months exist,
// at start and every PartitionCheck (every minute while that fails).
func (m *Meter) keepPartitions(ctx context.Context) {
	for {
		next := m.opts.PartitionCheck
		if err := m.store.ensurePartitions(ctx, aheadMonths(m.opts.Clock.Now())); err != nil {
			if ctx.Err() != nil {
				return
			}
			m.log.Warn("create usage_events partitions ahead of time failed; retrying", "err", err)
			next = min(next, time.Minute)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
	}
}

// lastOfEachPartition returns the last message of each partition in msgs: committing it
// commits everything before it in that partition.
func lastOfEachPartition(msgs []kafka.Message) []kafka.Message {
	last := map[int]kafka.Message{}
	for _, msg := range msgs {
		if l, ok := last[msg.Partition]; !ok || msg.Offset > l.Offset {
			last[msg.Partition] = msg
		}
	}
	out := make([]kafka.Message, 0, len(last))
	for _, msg := range last {
		out = append(out, msg)
	}
	return out
}
