package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/metergate/metergate/pkg/admission"
	"github.com/metergate/metergate/pkg/policy"
)

// endToEnd offers E2ERate decisions/s to admit (open loop) with the relay and meter
// running, waits until every admitted event is a row, and reads each row's latency from
// admission (event_time, Redis TIME) to its insert (ingest_time, the meter's transaction).
// The latency is read from the rows themselves, so it covers every event of the window.
func (s *stack) endToEnd(ctx context.Context, res *Results) error {
	key, err := s.benchKey(ctx)
	if err != nil {
		return err
	}
	if err := s.outboxEmpty(ctx, time.Minute); err != nil {
		return err
	}
	dec0, err := s.metric(ctx, s.admit.URL(), "metergate_admit_decisions_total")
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
	dec1, err := s.metric(ctx, s.admit.URL(), "metergate_admit_decisions_total")
	if err != nil {
		return err
	}
	admitted := int64(dec1 - dec0)
	lat, err := s.rowLatency(ctx, since, admitted)
	if err != nil {
		return err
	}
	p50, p99, rows := lat.P50, lat.P99, lat.Rows
	res.Raw["e2e"] = map[string]any{"load": r, "admitted": admitted, "rows": rows, "latency": lat}
	res.add("e2e_p99_ms", p99, "ms", "≤ 2000",
		fmt.Sprintf("admission (Redis TIME) → row inserted, every one of %d events, through admit's HTTP API offered %.0f/s; admit answered %.0f/s (%d unsent: the ceiling of 2 cores shared with loadgen, relay, Kafka, meter and PostgreSQL); p50 %.0f ms", rows, s.cfg.E2ERate, r.Rate, r.Unsent, p50))
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

// latency is admission → row over the rows of a run.
type latency struct {
	Rows       int64   `json:"rows"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	Max        float64 `json:"max_ms"`
	DrainedInS float64 `json:"drained_after_load_s"`
}

// rowLatency waits until the events admitted since are rows (want of them) and reads
// each row's latency from admission (event_time, Redis TIME) to its insert (ingest_time,
// the meter's transaction).
func (s *stack) rowLatency(ctx context.Context, since time.Time, want int64) (latency, error) {
	var l latency
	begin := time.Now()
	for {
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM usage_events WHERE event_time >= $1`, since).Scan(&l.Rows); err != nil {
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
	err := s.pool.QueryRow(ctx, `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms)
		FROM (SELECT extract(epoch FROM ingest_time - event_time) * 1000 AS ms FROM usage_events WHERE event_time >= $1) l`,
		since).Scan(&l.P50, &l.P99, &l.Max)
	return l, err
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
	if err := s.outboxEmpty(ctx, time.Minute); err != nil {
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
	lat, err := s.rowLatency(ctx, since, allowed.Load())
	if err != nil {
		return err
	}
	rate := float64(allowed.Load()) / took.Seconds()
	res.Raw["pipeline"] = map[string]any{"admitted": allowed.Load(), "rate_per_s": rate, "max_send_delay_ms": float64(maxDelay.Load()) / 1e6, "latency": lat}
	res.add("pipeline_p99_ms", lat.P99, "ms", "≤ 2000",
		fmt.Sprintf("admission → row, every one of %d events offered at %.0f/s (achieved %.0f/s) to the admission script from an in-process Admitter: relay, Kafka, meter, PostgreSQL at that rate; p50 %.0f ms", lat.Rows, s.cfg.E2ERate, rate, lat.P50))
	return nil
}
