package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
)

// endToEnd offers E2ERate decisions/s to admit (open loop; its relay inside it, the meter
// running), waits until every admitted event is a row, and reads each row's latency from
// admission (event_time, Redis TIME) to the commit of the meter's transaction that wrote
// it (commitClock). The latency covers every event of the window.
func (s *stack) endToEnd(ctx context.Context, res *Results) error {
	key, err := s.benchKey(ctx)
	if err != nil {
		return err
	}
	if err := s.outboxEmpty(ctx, s.admit.URL(), time.Minute); err != nil {
		return err
	}
	c0, err := s.admitCounters(ctx, s.admit)
	if err != nil {
		return err
	}
	clock, err := startCommitClock(ctx, s.pool)
	if err != nil {
		return err
	}
	var since time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&since); err != nil {
		return err
	}
	body := `{"api_key":"` + key + `",` + decisionBody + `}`
	r, err := s.loadgen(ctx, s.admit.URL()+"/v1/admit", serviceToken, body,
		"-rate", strconv.FormatFloat(s.cfg.E2ERate, 'f', 0, 64), "-concurrency", "1024")
	if err != nil {
		return err
	}
	c1, err := s.admitCounters(ctx, s.admit)
	if err != nil {
		return err
	}
	admitted := int64(c1.decisions - c0.decisions)
	lat, err := s.rowLatency(ctx, clock, since, admitted)
	if err != nil {
		return err
	}
	p50, p99, rows := lat.P50, lat.P99, lat.Rows
	res.Raw["e2e"] = map[string]any{"load": r, "admitted": admitted, "rows": rows, "latency": lat}
	res.add("e2e_p99_ms", p99, "ms", "≤ 100",
		fmt.Sprintf("admission (Redis TIME) → its row committed (seen by a snapshot every %.1f ms), every one of %d events, through admit's HTTP API (relay inside) offered %.0f/s; admit answered %.0f/s (%d unsent: the ceiling of the cores shared with loadgen, relay, Kafka, meter and PostgreSQL); p50 %.0f ms; to the transaction's start (ingest_time) p99 %.0f ms", lat.CommitPollMS, rows, s.cfg.E2ERate, r.Rate, r.Unsent, p50, lat.P99Start))
	res.add("e2e_rate_achieved", r.Rate/s.cfg.E2ERate, "×", "", fmt.Sprintf("events/s achieved end to end ÷ the %.0f/s offered", s.cfg.E2ERate))
	return nil
}

// benchPolicy is benchAccount's resolved policy, read from the bench's database at the
// first call (the tree made first if need be), for the decisions the bench takes itself.
func (s *stack) benchPolicy(ctx context.Context) (policy.Resolved, error) {
	if s.pol.Org != "" {
		return s.pol, nil
	}
	if _, err := s.benchKey(ctx); err != nil {
		return policy.Resolved{}, err
	}
	cache := policy.NewCache(s.pool, s.cfg.Log, time.Hour)
	if err := cache.Reload(ctx); err != nil {
		return policy.Resolved{}, err
	}
	pol, err := cache.Resolve(benchAccount)
	if err == nil {
		s.pol = pol
	}
	return pol, err
}

// benchKey is the API key of benchAccount, made at the first call.
func (s *stack) benchKey(ctx context.Context) (string, error) {
	if s.key != "" {
		return s.key, nil
	}
	key, err := s.createTree(ctx, benchTree)
	if err != nil {
		return "", fmt.Errorf("accounts: %w", err)
	}
	s.key = key
	return key, nil
}

// latency is admission → row committed over the rows of a run; P50Start and P99Start are
// to the meter's transaction's start (ingest_time) instead, for comparison.
type latency struct {
	Rows         int64   `json:"rows"`
	P50          float64 `json:"p50_ms"`
	P99          float64 `json:"p99_ms"`
	Max          float64 `json:"max_ms"`
	P50Start     float64 `json:"p50_ms_to_transaction_start"`
	P99Start     float64 `json:"p99_ms_to_transaction_start"`
	CommitPollMS float64 `json:"commit_clock_period_ms"`
	DrainedInS   float64 `json:"drained_after_load_s"`
}

// rowLatency waits until the events admitted since are rows (want of them), stops clock
// once it has seen them committed, and reads each row's latency from admission
// (event_time, Redis TIME) to its transaction's commit.
func (s *stack) rowLatency(ctx context.Context, clock *commitClock, since time.Time, want int64) (latency, error) {
	var l latency
	begin := time.Now()
	var seenAt time.Time
	for {
		if err := s.pool.QueryRow(ctx, `SELECT count(*), clock_timestamp() FROM usage_events WHERE event_time >= $1`, since).Scan(&l.Rows, &seenAt); err != nil {
			return l, err
		}
		if l.Rows >= want {
			break
		}
		if time.Since(begin) > 2*time.Minute {
			return l, fmt.Errorf("%d of %d admitted events are rows 2 minutes after the load", l.Rows, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	l.DrainedInS = time.Since(begin).Seconds()
	if l.Rows != want {
		return l, fmt.Errorf("%d rows for %d admitted events", l.Rows, want)
	}
	if err := clock.stopAfter(ctx, seenAt); err != nil {
		return l, err
	}
	l.CommitPollMS = float64(clock.period().Microseconds()) / 1e3
	rows, err := s.pool.Query(ctx, `SELECT xmin::text::bigint, event_time, ingest_time FROM usage_events WHERE event_time >= $1`, since)
	if err != nil {
		return l, err
	}
	defer rows.Close()
	var commit, start []float64
	unknown := 0
	for rows.Next() {
		var xid int64
		var ev, ingest time.Time
		if err := rows.Scan(&xid, &ev, &ingest); err != nil {
			return l, err
		}
		start = append(start, float64(ingest.Sub(ev).Microseconds())/1e3)
		at, ok := clock.commitTime(uint32(xid))
		if !ok {
			unknown++
			continue
		}
		commit = append(commit, float64(at.Sub(ev).Microseconds())/1e3)
	}
	if err := rows.Err(); err != nil {
		return l, err
	}
	if unknown > 0 || len(commit) == 0 {
		return l, fmt.Errorf("no commit time for %d of %d rows", unknown, len(start))
	}
	slices.Sort(commit)
	slices.Sort(start)
	l.P50, l.P99, l.Max = nearestRank(commit, 50), nearestRank(commit, 99), commit[len(commit)-1]
	l.P50Start, l.P99Start = nearestRank(start, 50), nearestRank(start, 99)
	return l, nil
}

// nearestRank is the nearest-rank p-th percentile of sorted.
func nearestRank(sorted []float64, p float64) float64 {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// pipeline offers E2ERate decisions/s for Duration to an Admitter of the bench process
// itself (the admission script, the outbox, the relay, Kafka, the meter, PostgreSQL: the
// whole pipeline but admit's HTTP layer, which this machine cannot run at that rate beside
// the rest) and reads admission → row latency from the rows.
func (s *stack) pipeline(ctx context.Context, res *Results) error {
	pol, err := s.benchPolicy(ctx)
	if err != nil {
		return err
	}
	adm := admission.New(s.rdb, admission.Options{KeyPrefix: s.cfg.KeyPrefix, Shards: shards})
	if err := s.outboxEmpty(ctx, s.admit.URL(), time.Minute); err != nil {
		return err
	}
	clock, err := startCommitClock(ctx, s.pool)
	if err != nil {
		return err
	}
	var since time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&since); err != nil {
		return err
	}
	interval := float64(time.Second) / s.cfg.E2ERate
	start := time.Now()
	end := start.Add(s.cfg.Duration)
	var seq, allowed, failed, maxDelay atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range 256 {
		wg.Go(func() {
			for ctx.Err() == nil {
				due := start.Add(time.Duration(float64(seq.Add(1)-1) * interval))
				if !due.Before(end) {
					return
				}
				time.Sleep(time.Until(due))
				for d := int64(time.Since(due)); ; {
					if m := maxDelay.Load(); d <= m || maxDelay.CompareAndSwap(m, d) {
						break
					}
				}
				d, err := adm.Decide(ctx, admission.Request{EventID: adm.NewEventID(pol.Org), Policy: pol, Units: decisionUnits, Source: "bench"})
				switch {
				case err != nil:
					failed.Add(1)
					once.Do(func() { firstErr = err })
				case d.Result == admission.Allow:
					allowed.Add(1)
				default:
					failed.Add(1)
					once.Do(func() { firstErr = errors.New("refused: " + string(d.Result)) })
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d decisions failed: %w", n, firstErr)
	}
	lat, err := s.rowLatency(ctx, clock, since, allowed.Load())
	if err != nil {
		return err
	}
	rate := float64(allowed.Load()) / took.Seconds()
	res.Raw["pipeline"] = map[string]any{"admitted": allowed.Load(), "rate_per_s": rate, "max_send_delay_ms": float64(maxDelay.Load()) / 1e6, "latency": lat}
	res.add("pipeline_p99_ms", lat.P99, "ms", "≤ 2000",
		fmt.Sprintf("admission → row committed, every one of %d events offered at %.0f/s (achieved %.0f/s) to the admission script from an in-process Admitter: the relay inside admit, Kafka, meter, PostgreSQL at that rate; p50 %.0f ms; to the transaction's start p99 %.0f ms", lat.Rows, s.cfg.E2ERate, rate, lat.P50, lat.P99Start))
	return nil
}
