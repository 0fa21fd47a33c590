package meter

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/period"
)

// item is one Kafka message and what it became: a usage row, an outcome row, or (err set)
// a dead letter.
type item struct {
	partition  int
	offset     int64
	key, value []byte
	usage      *usageRow
	outcome    *outcomeRow
	void       *voidRow
	alert      *alertRow
	err        error
}

// counts is what one table got from a batch: rows staged and rows inserted; the
// difference are duplicates skipped by ON CONFLICT DO NOTHING.
type counts struct{ staged, inserted int64 }

func (c *counts) add(o counts) { c.staged += o.staged; c.inserted += o.inserted }

// written is what a batch wrote, per table.
type written struct {
	usage, borrowings, credits, outcomes, voids, alerts, deadLetters counts
	// refused counts rows PostgreSQL refused for their content, written as dead letters.
	refused int
}

func (w *written) add(o written) {
	w.usage.add(o.usage)
	w.borrowings.add(o.borrowings)
	w.credits.add(o.credits)
	w.outcomes.add(o.outcomes)
	w.voids.add(o.voids)
	w.alerts.add(o.alerts)
	w.deadLetters.add(o.deadLetters)
	w.refused += o.refused
}

// store writes batches into PostgreSQL.
type store struct {
	pool  *pgxpool.Pool
	topic string

	mu    sync.Mutex
	known map[time.Time]bool // months whose usage_events partition exists
}

func newStore(pool *pgxpool.Pool, topic string) *store {
	return &store{pool: pool, topic: topic, known: map[time.Time]bool{}}
}

// ensurePartitions makes sure usage_events has a partition for each month (first days,
// UTC), asking PostgreSQL only about months it has not seen yet.
func (s *store) ensurePartitions(ctx context.Context, months []time.Time) error {
	for _, m := range months {
		s.mu.Lock()
		ok := s.known[m]
		s.mu.Unlock()
		if ok {
			continue
		}
		if _, err := s.pool.Exec(ctx, "select usage_events_partition(@month)", pgx.StrictNamedArgs{"month": m}); err != nil {
			return fmt.Errorf("create usage_events partition %s: %w", period.MonthLabel(m), err)
		}
		s.mu.Lock()
		s.known[m] = true
		s.mu.Unlock()
	}
	return nil
}

// forgetPartitions drops what is known of partitions, so that the next write asks again
// (after an error: someone may have detached or dropped one).
func (s *store) forgetPartitions() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.known)
}

// aheadMonths are the current month (by now) and the next two.
func aheadMonths(now time.Time) []time.Time {
	m := period.MonthStart(now)
	return []time.Time{m, m.AddDate(0, 1, 0), m.AddDate(0, 2, 0)}
}

// stagingTables are the statements that make the staging tables of a connection unless it
// has them. They live as long as the connection, and every commit empties them: creating
// them in each batch's transaction and dropping them at its commit cost catalog writes (and
// their vacuuming) on every batch. A batch of admissions alone needs none (see store.write).
var stagingTables = []string{createMeterUsageSQL, createMeterOutcomesSQL, createMeterBorrowingsSQL, createMeterCreditsSQL}

var (
	//go:embed sql/create_meter_usage.sql
	createMeterUsageSQL string
	//go:embed sql/create_meter_outcomes.sql
	createMeterOutcomesSQL string
	//go:embed sql/create_meter_borrowings.sql
	createMeterBorrowingsSQL string
	//go:embed sql/create_meter_credits.sql
	createMeterCreditsSQL string
)

// The columns the rows of a batch are copied into, in the order the write functions give
// their values: of the staging tables (sql/create_meter_*.sql) and of usage_events.
var (
	usageColumns = []string{"event_id", "billing_period", "event_time", "charged_period",
		"org", "account", "account_kind", "path", "api_key_id", "idempotency_key",
		"plan", "tool", "source", "fail_open",
		"requests", "tokens", "credits", "cost_micros", "kafka_partition", "kafka_offset", "shadow_refusal"}
	outcomeColumns = []string{"event_id", "status", "requests", "tokens", "credits", "cost_micros",
		"outcome_time", "source", "kafka_partition", "kafka_offset"}
	// COPY straight into usage_events writes late as well (see store.write).
	usageCopy = append(slices.Clip(usageColumns), "late")
	// The staging tables also have the message's position, to keep the first delivery.
	borrowingStaging = []string{"event_id", "billing_period", "charged_period", "event_time", "org",
		"account", "lender", "unit", "units", "kafka_partition", "kafka_offset"}
	creditStaging = []string{"event_id", "grant_id", "billing_period", "charged_period", "event_time", "org",
		"account", "unit", "units", "kafka_partition", "kafka_offset"}
)

// The inserts from staging. Their ORDER BY makes the first delivery win within a batch, and
// makes concurrent meters take index locks in one order (fewer deadlocks when their batches
// overlap).
var (
	// late: the event's billing period was closed (invoiced) before this batch took its
	// partition locks; the next invoice bills it (internal/invoice).
	//go:embed sql/insert_usage.sql
	insertUsageSQL string
	//go:embed sql/insert_outcomes.sql
	insertOutcomesSQL string
	// A redelivered admission carries the same borrowings: the key keeps them once.
	//go:embed sql/insert_borrowings.sql
	insertBorrowingsSQL string
	// And the same credit draws: the key keeps them once.
	//go:embed sql/insert_credits.sql
	insertCreditsSQL string
)

var (
	// Voids are rare (a request nobody was told the decision of): inserted from arrays, no
	// staging table.
	//go:embed sql/insert_voids.sql
	insertVoidsSQL string
	// A new usage_alerts row's webhook deliveries are made by its trigger (migrations
	// 00017), in the batch's transaction.
	//go:embed sql/insert_alerts.sql
	insertAlertsSQL string
	//go:embed sql/insert_dead_letters.sql
	insertDeadLettersSQL string
)

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func orZero(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// ptr turns a missing unit into NULL for pgx.
func ptr(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// byTable is a batch's items by the table they go to, with the billing periods of its
// admissions (their partitions of usage_events).
type byTable struct {
	usage                         []*item // by event id, then Kafka partition and offset
	outcomes, voids, alerts, dead []*item
	months                        []time.Time // in order
	borrowings, credits           int         // rows of usage_borrowings and credit_consumptions
}

func splitItems(items []item) byTable {
	var r byTable
	seen := map[time.Time]bool{}
	for i := range items {
		it := &items[i]
		switch {
		case it.err != nil:
			r.dead = append(r.dead, it)
		case it.usage != nil:
			r.usage = append(r.usage, it)
			r.borrowings += len(it.usage.Borrowed)
			r.credits += len(it.usage.Credits)
			if m := it.usage.BillingPeriod; !seen[m] {
				seen[m] = true
				r.months = append(r.months, m)
			}
		case it.outcome != nil:
			r.outcomes = append(r.outcomes, it)
		case it.void != nil:
			r.voids = append(r.voids, it)
		case it.alert != nil:
			r.alerts = append(r.alerts, it)
		}
	}
	slices.SortFunc(r.months, func(a, b time.Time) int { return a.Compare(b) })
	// The first delivery of an event is the one kept (its Kafka position is the row's), and
	// concurrent writers take the key's index locks in one order (no deadlock between
	// batches that overlap, as after a rebalance).
	slices.SortFunc(r.usage, func(a, b *item) int {
		x, y := a.usage, b.usage
		if c := strings.Compare(x.EventID, y.EventID); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Partition, y.Partition); c != 0 {
			return c
		}
		return cmp.Compare(x.Offset, y.Offset)
	})
	return r
}

// errWrittenBefore: a batch's COPY into usage_events met an event that is a row already.
var errWrittenBefore = errors.New("an event of the batch is a row already")

// write writes items in one transaction: either everything is written or nothing is.
//
// A batch's admissions go by COPY straight into usage_events, its first delivery of each
// event; the primary key keeps any event from being written twice. A redelivered event
// (after a crash or a rebalance) that is a row already makes that COPY fail: the batch is
// then written again in a transaction of its own through staging, COPY into a temporary
// table and INSERT … ON CONFLICT DO NOTHING, which skips the rows that exist. Admissions
// are almost never redelivered, and the COPY alone is the cheapest way into the table: it
// neither writes the rows twice nor makes the insert check for a conflict (speculative
// insertion) row by row. Outcomes, borrowings and credit draws, voids, thresholds and dead
// letters go through staging or arrays with ON CONFLICT DO NOTHING in both.
func (s *store) write(ctx context.Context, items []item) (w written, err error) {
	r := splitItems(items)
	defer func() {
		if err != nil {
			s.forgetPartitions()
		}
	}()
	// Outside the batch's transaction: a partition is added under its own, short lock.
	if err := s.ensurePartitions(ctx, r.months); err != nil {
		return written{}, err
	}
	w, err = s.writeTx(ctx, r, false)
	if errors.Is(err, errWrittenBefore) {
		w, err = s.writeTx(ctx, r, true)
	}
	return w, err
}

// writeTx writes r in one transaction, in three round trips when it holds admissions alone:
// the transaction begun, partitions locked and closed periods read; the COPY; the commit.
// staged: admissions through staging and ON CONFLICT DO NOTHING rather than COPY.
func (s *store) writeTx(ctx context.Context, r byTable, staged bool) (w written, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return written{}, fmt.Errorf("acquire a connection: %w", err)
	}
	defer conn.Release() // closed rather than pooled if still in a transaction
	c := conn.Conn()
	committed := false
	defer func() {
		if !committed && c.PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_, _ = c.Exec(rctx, "rollback")
		}
	}()

	open := &pgx.Batch{}
	open.Queue("begin")
	closed := map[time.Time]bool{}
	if len(r.usage) > 0 {
		// Lock the batch's partitions before reading which periods are closed. A period
		// close takes a SHARE lock on the partition: it either committed before this lock
		// (the read then sees the period closed and the rows are flagged late) or waits for
		// this batch to commit (and then invoices its rows). No event falls between the two.
		parts := make([]string, len(r.months))
		for i, m := range r.months {
			parts[i] = pgx.Identifier{"usage_events_" + m.Format("2006_01")}.Sanitize()
		}
		open.Queue("lock table " + strings.Join(parts, ", ") + " in row exclusive mode")
		// The batch's billing periods that are closed (invoiced): its admissions of those
		// months are late.
		open.Queue("select period from periods where period = any(@months::date[])",
			pgx.StrictNamedArgs{"months": r.months}).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var m time.Time
				if err := rows.Scan(&m); err != nil {
					return err
				}
				closed[m] = true
			}
			return rows.Err()
		})
	}
	if len(r.outcomes) > 0 || r.borrowings > 0 || r.credits > 0 || (staged && len(r.usage) > 0) {
		for _, q := range stagingTables {
			open.Queue(q)
		}
	}
	if err := c.SendBatch(ctx, open).Close(); err != nil {
		return written{}, fmt.Errorf("begin, lock usage partitions: %w", err)
	}

	if len(r.usage) > 0 {
		if w.usage, err = writeUsage(ctx, c, r.usage, closed, staged); err != nil {
			return written{}, err
		}
		if w.borrowings, err = writeBorrowings(ctx, c, r.usage); err != nil {
			return written{}, err
		}
		if w.credits, err = writeCredits(ctx, c, r.usage); err != nil {
			return written{}, err
		}
	}
	if len(r.outcomes) > 0 {
		if w.outcomes, err = writeOutcomes(ctx, c, r.outcomes); err != nil {
			return written{}, err
		}
	}
	if len(r.voids) > 0 {
		if w.voids, err = writeVoids(ctx, c, r.voids); err != nil {
			return written{}, err
		}
	}
	if len(r.alerts) > 0 {
		if w.alerts, err = writeAlerts(ctx, c, r.alerts); err != nil {
			return written{}, err
		}
	}
	if len(r.dead) > 0 {
		if w.deadLetters, err = writeDeadLetters(ctx, c, s.topic, r.dead); err != nil {
			return written{}, err
		}
	}
	tag, err := c.Exec(ctx, "commit")
	if err != nil {
		return written{}, fmt.Errorf("commit: %w", err)
	}
	if tag.String() != "COMMIT" { // an aborted transaction answers ROLLBACK
		return written{}, fmt.Errorf("commit: rolled back (%s)", tag)
	}
	committed = true
	return w, nil
}

// writeUsage writes a batch's admissions (sorted: splitItems), by COPY straight into
// usage_events unless staged, late when their period is closed.
func writeUsage(ctx context.Context, c *pgx.Conn, usage []*item, closed map[time.Time]bool, staged bool) (counts, error) {
	if staged {
		n, err := c.CopyFrom(ctx, pgx.Identifier{"meter_usage"}, usageColumns, pgx.CopyFromSlice(len(usage), func(i int) ([]any, error) {
			r := usage[i].usage
			return []any{r.EventID, r.BillingPeriod, r.EventTime, r.ChargedPeriod,
				r.Org, r.Account, r.AccountKind, r.Path, nullable(r.APIKeyID), nullable(r.IdempotencyKey),
				nullable(r.Plan), nullable(r.Tool), r.Source, r.FailOpen,
				orZero(r.Units.Requests), orZero(r.Units.Tokens), orZero(r.Units.Credits), orZero(r.Units.CostMicros),
				r.Partition, r.Offset, nullable(r.ShadowRefusal)}, nil
		}))
		if err != nil {
			return counts{}, fmt.Errorf("copy usage rows: %w", err)
		}
		tag, err := c.Exec(ctx, insertUsageSQL)
		if err != nil {
			return counts{}, fmt.Errorf("insert usage_events: %w", err)
		}
		return counts{staged: n, inserted: tag.RowsAffected()}, nil
	}
	// An event delivered twice within the batch is written once: its first delivery.
	var data copyData
	n := 0
	for i, it := range usage {
		if i > 0 && it.usage.EventID == usage[i-1].usage.EventID {
			continue
		}
		data.usageRow(it.usage, closed[it.usage.BillingPeriod])
		n++
	}
	if _, err := c.PgConn().CopyFrom(ctx, data.reader(), copyUsage); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" { // unique_violation
			return counts{}, fmt.Errorf("copy into usage_events: %w: %w", errWrittenBefore, err)
		}
		return counts{}, fmt.Errorf("copy into usage_events: %w", err)
	}
	return counts{staged: int64(len(usage)), inserted: int64(n)}, nil
}

// copyUsage reads rows of copyData into usage_events, each routed to its month's partition.
var copyUsage = "copy usage_events (" + strings.Join(usageCopy, ", ") + ") from stdin (format binary)"

// copyData is rows in COPY's binary format. Admissions are encoded here rather than by
// pgx's CopyFrom, which boxes every value of every row in an interface and encodes it
// through its type map: that cost the meter about 2.5 µs of CPU per event (a fifth of its
// Go CPU, with the garbage it made), this about a tenth of it.
type copyData struct{ buf []byte }

// pgEpoch is where PostgreSQL's dates and timestamps count from.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// textOID is the type of text[]'s elements.
const textOID = 25

func (d *copyData) usageRow(r *usageRow, late bool) {
	if d.buf == nil {
		d.buf = append(make([]byte, 0, 64<<10), "PGCOPY\n\xff\r\n\x00"...)
		d.buf = binary.BigEndian.AppendUint32(d.buf, 0) // flags
		d.buf = binary.BigEndian.AppendUint32(d.buf, 0) // header extension
	}
	d.buf = binary.BigEndian.AppendUint16(d.buf, uint16(len(usageCopy))) //nolint:gosec // 22 columns
	d.text(r.EventID)
	d.date(r.BillingPeriod)
	d.timestamp(r.EventTime)
	d.date(r.ChargedPeriod)
	d.text(r.Org)
	d.text(r.Account)
	d.text(r.AccountKind)
	d.textArray(r.Path)
	d.nullableText(r.APIKeyID)
	d.nullableText(r.IdempotencyKey)
	d.nullableText(r.Plan)
	d.nullableText(r.Tool)
	d.text(r.Source)
	d.bool(r.FailOpen)
	d.int8(orZero(r.Units.Requests))
	d.int8(orZero(r.Units.Tokens))
	d.int8(orZero(r.Units.Credits))
	d.int8(orZero(r.Units.CostMicros))
	d.int4(int32(r.Partition)) //nolint:gosec // Kafka partitions are int32
	d.int8(r.Offset)
	d.nullableText(r.ShadowRefusal)
	d.bool(late)
}

// reader ends the data and reads it.
func (d *copyData) reader() io.Reader {
	return bytes.NewReader(binary.BigEndian.AppendUint16(d.buf, 0xffff)) // the trailer: -1 fields
}

func (d *copyData) field(n int) {
	d.buf = binary.BigEndian.AppendUint32(d.buf, uint32(n)) //nolint:gosec // a field's length, or -1 for NULL
}

func (d *copyData) text(s string) {
	d.field(len(s))
	d.buf = append(d.buf, s...)
}

// nullableText stores "" as NULL.
func (d *copyData) nullableText(s string) {
	if s == "" {
		d.buf = binary.BigEndian.AppendUint32(d.buf, 0xffffffff)
		return
	}
	d.text(s)
}

// textArray is a one-dimensional text[] from 1, without NULLs.
func (d *copyData) textArray(ss []string) {
	size := 12 // dimensions, flags, element type
	if len(ss) > 0 {
		size += 8 // the dimension's length and lower bound
	}
	for _, s := range ss {
		size += 4 + len(s)
	}
	d.field(size)
	dims := uint32(0)
	if len(ss) > 0 {
		dims = 1
	}
	d.buf = binary.BigEndian.AppendUint32(d.buf, dims)
	d.buf = binary.BigEndian.AppendUint32(d.buf, 0) // no NULL
	d.buf = binary.BigEndian.AppendUint32(d.buf, textOID)
	if len(ss) > 0 {
		d.buf = binary.BigEndian.AppendUint32(d.buf, uint32(len(ss))) //nolint:gosec // a path of a few levels
		d.buf = binary.BigEndian.AppendUint32(d.buf, 1)
	}
	for _, s := range ss {
		d.text(s)
	}
}

// date is t's day (as pgx takes it: year, month and day in t's location) as days since
// 2000-01-01.
func (d *copyData) date(t time.Time) {
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	d.int4(int32((day.Unix() - pgEpoch.Unix()) / (24 * 60 * 60))) //nolint:gosec // PostgreSQL's dates fit
}

// timestamp is microseconds since 2000-01-01 UTC.
func (d *copyData) timestamp(t time.Time) {
	d.int8(t.UnixMicro() - pgEpoch.UnixMicro())
}

func (d *copyData) bool(b bool) {
	d.field(1)
	if b {
		d.buf = append(d.buf, 1)
	} else {
		d.buf = append(d.buf, 0)
	}
}

func (d *copyData) int8(v int64) {
	d.field(8)
	d.buf = binary.BigEndian.AppendUint64(d.buf, uint64(v)) //nolint:gosec // two's complement
}

func (d *copyData) int4(v int32) {
	d.field(4)
	d.buf = binary.BigEndian.AppendUint32(d.buf, uint32(v)) //nolint:gosec // two's complement
}

// writeOutcomes writes a batch's outcomes: COPY into staging, then INSERT … ON CONFLICT DO
// NOTHING (a request's first outcome wins).
func writeOutcomes(ctx context.Context, c *pgx.Conn, outcomes []*item) (counts, error) {
	n, err := c.CopyFrom(ctx, pgx.Identifier{"meter_outcomes"}, outcomeColumns, pgx.CopyFromSlice(len(outcomes), func(i int) ([]any, error) {
		r := outcomes[i].outcome
		return []any{r.EventID, r.Status, ptr(r.Units.Requests), ptr(r.Units.Tokens), ptr(r.Units.Credits), ptr(r.Units.CostMicros),
			r.OutcomeTime, r.Source, r.Partition, r.Offset}, nil
	}))
	if err != nil {
		return counts{}, fmt.Errorf("copy outcome rows: %w", err)
	}
	tag, err := c.Exec(ctx, insertOutcomesSQL)
	if err != nil {
		return counts{}, fmt.Errorf("insert usage_outcomes: %w", err)
	}
	return counts{staged: n, inserted: tag.RowsAffected()}, nil
}

// writeVoids writes a batch's voids into usage_voids.
func writeVoids(ctx context.Context, c *pgx.Conn, voids []*item) (counts, error) {
	var ids, attempts, reasons, sources []string
	var times []time.Time
	var parts []int32
	var offsets []int64
	for _, it := range voids {
		v := it.void
		ids, attempts, reasons = append(ids, v.EventID), append(attempts, v.Attempt), append(reasons, v.Reason)
		times, sources = append(times, v.VoidTime), append(sources, v.Source)
		parts, offsets = append(parts, int32(v.Partition)), append(offsets, v.Offset) //nolint:gosec // Kafka partitions are int32
	}
	tag, err := c.Exec(ctx, insertVoidsSQL, pgx.StrictNamedArgs{
		"event_ids": ids, "attempts": attempts, "reasons": reasons, "void_times": times, "sources": sources,
		"kafka_partitions": parts, "kafka_offsets": offsets,
	})
	if err != nil {
		return counts{}, fmt.Errorf("insert usage_voids: %w", err)
	}
	return counts{staged: int64(len(voids)), inserted: tag.RowsAffected()}, nil
}

// writeDeadLetters writes the messages that could not be parsed, keyed by their Kafka
// position.
func writeDeadLetters(ctx context.Context, c *pgx.Conn, topic string, dead []*item) (counts, error) {
	parts := make([]int32, len(dead))
	offsets := make([]int64, len(dead))
	keys := make([][]byte, len(dead))
	values := make([][]byte, len(dead))
	errs := make([]string, len(dead))
	for i, it := range dead {
		parts[i], offsets[i], keys[i] = int32(it.partition), it.offset, it.key //nolint:gosec // Kafka partitions are int32
		values[i] = it.value
		if values[i] == nil { // a tombstone: the column is NOT NULL
			values[i] = []byte{}
		}
		errs[i] = cleanText(it.err.Error())
	}
	tag, err := c.Exec(ctx, insertDeadLettersSQL, pgx.StrictNamedArgs{
		"topic": topic, "partitions": parts, "offsets": offsets, "keys": keys, "values": values, "errors": errs,
	})
	if err != nil {
		return counts{}, fmt.Errorf("insert dead_letters: %w", err)
	}
	return counts{staged: int64(len(dead)), inserted: tag.RowsAffected()}, nil
}

// writeAlerts writes a batch's thresholds into usage_alerts.
func writeAlerts(ctx context.Context, c *pgx.Conn, alerts []*item) (counts, error) {
	n := len(alerts)
	ids, orgs, accounts, paths, unitNames, kinds := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	periods, grants, triggers, payloads := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	times := make([]time.Time, n)
	thresholds, ats, values := make([]int64, n), make([]int64, n), make([]int64, n)
	admitted := make([]bool, n)
	for i, it := range alerts {
		a := it.alert
		ids[i], times[i], orgs[i], accounts[i], paths[i] = a.ID, a.EventTime, a.Org, a.Account, strings.Join(a.Path, "/")
		unitNames[i], kinds[i], thresholds[i], ats[i], values[i] = a.Unit, a.Kind, a.Threshold, a.At, a.Value
		periods[i], grants[i], triggers[i], admitted[i], payloads[i] = a.Period, a.Grant, a.TriggeredBy, a.Admitted, string(a.Payload)
	}
	tag, err := c.Exec(ctx, insertAlertsSQL, pgx.StrictNamedArgs{
		"ids": ids, "event_times": times, "orgs": orgs, "accounts": accounts, "paths": paths, "units": unitNames,
		"kinds": kinds, "thresholds": thresholds, "at_units": ats, "values": values, "periods": periods,
		"arming_grants": grants, "triggered_by": triggers, "admitted": admitted, "payloads": payloads,
	})
	if err != nil {
		return counts{}, fmt.Errorf("insert usage_alerts: %w", err)
	}
	return counts{staged: int64(n), inserted: tag.RowsAffected()}, nil
}

// writeBorrowings writes the borrowings of a batch's admissions, in the batch's
// transaction, as the admissions themselves: COPY into staging, then INSERT … ON CONFLICT
// DO NOTHING. Most batches have none and cost nothing more.
func writeBorrowings(ctx context.Context, c *pgx.Conn, usage []*item) (counts, error) {
	var rows [][]any
	for _, it := range usage {
		r := it.usage
		for _, b := range r.Borrowed {
			rows = append(rows, []any{r.EventID, r.BillingPeriod, r.ChargedPeriod, r.EventTime, r.Org,
				b.Account, b.Lender, b.Unit, b.Units, r.Partition, r.Offset})
		}
	}
	if len(rows) == 0 {
		return counts{}, nil
	}
	n, err := c.CopyFrom(ctx, pgx.Identifier{"meter_borrowings"}, borrowingStaging, pgx.CopyFromRows(rows))
	if err != nil {
		return counts{}, fmt.Errorf("copy borrowing rows: %w", err)
	}
	tag, err := c.Exec(ctx, insertBorrowingsSQL)
	if err != nil {
		return counts{}, fmt.Errorf("insert usage_borrowings: %w", err)
	}
	return counts{staged: n, inserted: tag.RowsAffected()}, nil
}

// writeCredits writes the credit draws of a batch's admissions as writeBorrowings writes
// their borrowings: with the admissions, in the batch's transaction, the first delivery of
// each draw kept.
func writeCredits(ctx context.Context, c *pgx.Conn, usage []*item) (counts, error) {
	var rows [][]any
	for _, it := range usage {
		r := it.usage
		for _, c := range r.Credits {
			rows = append(rows, []any{r.EventID, c.Grant, r.BillingPeriod, r.ChargedPeriod, r.EventTime, r.Org,
				c.Account, c.Unit, c.Units, r.Partition, r.Offset})
		}
	}
	if len(rows) == 0 {
		return counts{}, nil
	}
	n, err := c.CopyFrom(ctx, pgx.Identifier{"meter_credits"}, creditStaging, pgx.CopyFromRows(rows))
	if err != nil {
		return counts{}, fmt.Errorf("copy credit rows: %w", err)
	}
	tag, err := c.Exec(ctx, insertCreditsSQL)
	if err != nil {
		return counts{}, fmt.Errorf("insert credit_consumptions: %w", err)
	}
	return counts{staged: n, inserted: tag.RowsAffected()}, nil
}

// writeEach writes items one transaction each, after PostgreSQL refused the batch for its
// content: a row it refuses for its own content (a bug in parse's checks, or a constraint
// added by hand) is written as a dead letter instead, and the others go through. Any other
// error stops it; the caller retries the batch.
func (s *store) writeEach(ctx context.Context, items []item) (written, error) {
	var total written
	for i := range items {
		w, err := s.write(ctx, items[i:i+1])
		if isContentError(err) && items[i].err == nil {
			items[i].usage, items[i].outcome, items[i].void, items[i].alert = nil, nil, nil, nil
			items[i].err = fmt.Errorf("refused by PostgreSQL: %w", err)
			w, err = s.write(ctx, items[i:i+1])
			w.refused = 1
		}
		if err != nil {
			return total, err
		}
		total.add(w)
	}
	return total, nil
}

// isContentError reports an error PostgreSQL gives for the data itself: class 22 (data
// exception) or 23 (integrity constraint violation). Retrying the same rows cannot help.
func isContentError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23"))
}

// cleanText makes s storable as PostgreSQL text: valid UTF-8, no NUL.
func cleanText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
