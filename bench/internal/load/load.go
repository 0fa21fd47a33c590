// Package load drives an HTTP endpoint with POST requests and measures what it answers:
// counts per status, the achieved rate and latency percentiles. It is the engine of
// bench/loadgen, kept apart from the command so that it can be tested.
//
// It runs in one of two modes. Closed loop (Rate 0): Concurrency workers each send the
// next request as soon as the last one is answered, which finds the maximum rate. Open
// loop (Rate > 0): requests are due on a fixed schedule of Rate per second and latency is
// measured from when a request was due, not from when it was sent, so a stalled server is
// charged for the requests it kept waiting (no coordinated omission); requests that went
// out late, or not at all, are counted.
package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Config is one run.
type Config struct {
	URL         string
	Token       string    // sent as "Authorization: Bearer <Token>" when set
	Body        *Template // required
	Concurrency int       // workers, and so the most requests in flight
	Duration    time.Duration
	Warmup      time.Duration // sent before Duration starts, not measured
	Rate        float64       // requests per second; 0 is closed loop
	Timeout     time.Duration // per request; 0 is none
	// LateAfter is how far past its due time an open-loop request may be sent and still
	// count as on time (timer and scheduler jitter).
	LateAfter time.Duration
	// Requests, when more than 0, ends a closed-loop run after that many requests (warmup
	// included) even before Warmup + Duration: with {{item}}, Requests = the items sends
	// each item once.
	Requests uint64
	// Client sends the requests; nil builds one with keep-alive and Concurrency idle
	// connections, see NewClient.
	Client *http.Client
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("url: empty"))
	}
	if c.Body == nil {
		errs = append(errs, errors.New("body: no template"))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("concurrency=%d: want at least 1", c.Concurrency))
	}
	if c.Duration <= 0 {
		errs = append(errs, fmt.Errorf("duration=%s: want more than 0", c.Duration))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("warmup=%s: want 0 or more", c.Warmup))
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		errs = append(errs, fmt.Errorf("rate=%v: want 0 (closed loop) or more", c.Rate))
	}
	if c.Requests > 0 && c.Rate > 0 {
		errs = append(errs, errors.New("requests: for a closed loop only (rate 0)"))
	}
	if c.Timeout < 0 || c.LateAfter < 0 {
		errs = append(errs, errors.New("timeout, late-after: want 0 or more"))
	}
	return errors.Join(errs...)
}

// NewClient is an HTTP client for conns concurrent requests to one host: every connection
// is kept alive and reused, none is closed for lack of idle slots.
func NewClient(conns int, timeout time.Duration) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = conns
	tr.MaxIdleConnsPerHost = conns
	tr.DisableCompression = true
	return &http.Client{Transport: tr, Timeout: timeout}
}

// Result is what a run measured, over the window after the warmup. Its JSON is the
// output of bench/loadgen.
type Result struct {
	Mode        string  `json:"mode"` // "closed" or "open"
	URL         string  `json:"url"`
	Concurrency int     `json:"concurrency"`
	TargetRate  float64 `json:"target_rate_per_s,omitempty"`
	WarmupS     float64 `json:"warmup_s"`
	// DurationS runs from the end of the warmup to the last measured answer (at least the
	// configured duration).
	DurationS float64 `json:"duration_s"`
	Requests  int64   `json:"requests"` // answered or failed, in the window
	// Sent counts every request sent, warmup included: what the server worked for.
	Sent   int64            `json:"sent"`
	Status map[string]int64 `json:"status"` // answers by HTTP status code
	Errors int64            `json:"errors"` // requests that got no answer
	// ErrorSamples holds the first few distinct errors.
	ErrorSamples []string `json:"error_samples,omitempty"`
	Rate         float64  `json:"rate_per_s"` // Requests / DurationS
	// Late counts open-loop requests sent more than LateAfterMS past their due time,
	// Unsent those due in the window that were never sent (every worker stayed busy).
	Late        int64   `json:"late"`
	Unsent      int64   `json:"unsent"`
	LateAfterMS float64 `json:"late_after_ms,omitempty"`
	// MaxSendDelayMS is the longest an open-loop request waited past its due time to be
	// sent: timer jitter when small, a saturated server when large.
	MaxSendDelayMS float64 `json:"max_send_delay_ms,omitempty"`
	Latency        Latency `json:"latency_ms"`
}

// Latency summarizes answered requests, in milliseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// maxErrorSamples bounds Result.ErrorSamples.
const maxErrorSamples = 5

// Run sends requests for Warmup + Duration, waits for those in flight, and reports.
// It returns early, with what was measured so far, when ctx ends.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	client := cfg.Client
	if client == nil {
		client = NewClient(cfg.Concurrency, cfg.Timeout)
	}
	r := &runner{cfg: cfg, client: client}
	start := time.Now()
	r.measureFrom = start.Add(cfg.Warmup)
	r.end = r.measureFrom.Add(cfg.Duration)

	workers := make([]*worker, cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{status: map[int]int64{}}
		workers[i] = w
		wg.Go(func() {
			if cfg.Rate > 0 {
				r.openLoop(ctx, w, start)
			} else {
				r.closedLoop(ctx, w)
			}
		})
	}
	wg.Wait()
	return r.result(workers, start), nil
}

type runner struct {
	cfg              Config
	client           *http.Client
	measureFrom, end time.Time
	seq              atomic.Uint64 // next request number (closed loop) or schedule slot (open loop)
}

// worker holds one goroutine's measurements; they are merged once at the end, so the hot
// path shares nothing but the sequence counter.
type worker struct {
	latencies []time.Duration
	status    map[int]int64
	errors    int64
	errSample []string
	late      int64
	sendDelay time.Duration // the largest, open loop
	lastDone  time.Time
	sent      int64
	buf       []byte
}

func (r *runner) closedLoop(ctx context.Context, w *worker) {
	for ctx.Err() == nil {
		sent := time.Now()
		if !sent.Before(r.end) {
			return
		}
		seq := r.seq.Add(1) - 1
		if r.cfg.Requests > 0 && seq >= r.cfg.Requests {
			return
		}
		r.send(ctx, w, seq, sent, !sent.Before(r.measureFrom))
	}
}

// openLoop claims the next slot of the schedule, sleeps until it is due and sends it;
// slot i is due at start + i/Rate. A worker claims a slot only when free, so when every
// worker is busy the due slots wait, and their latency counts the wait.
func (r *runner) openLoop(ctx context.Context, w *worker, start time.Time) {
	interval := float64(time.Second) / r.cfg.Rate
	for ctx.Err() == nil {
		if !time.Now().Before(r.end) {
			return
		}
		seq := r.seq.Add(1) - 1
		due := start.Add(time.Duration(float64(seq) * interval))
		if !due.Before(r.end) {
			return
		}
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		measured := !due.Before(r.measureFrom)
		if delay := time.Since(due); measured {
			w.sendDelay = max(w.sendDelay, delay)
			if delay > r.cfg.LateAfter {
				w.late++
			}
		}
		r.send(ctx, w, seq, due, measured)
	}
}

// send makes request seq and, when measured, records it with its latency from since.
func (r *runner) send(ctx context.Context, w *worker, seq uint64, since time.Time, measured bool) {
	w.buf = r.cfg.Body.Render(w.buf[:0], seq)
	status, err := r.do(ctx, w.buf)
	done := time.Now()
	w.sent++
	if !measured {
		return
	}
	w.lastDone = done
	if err != nil {
		if ctx.Err() != nil {
			return // interrupted, not the server's failure
		}
		w.errors++
		if len(w.errSample) < maxErrorSamples && !slices.Contains(w.errSample, err.Error()) {
			w.errSample = append(w.errSample, err.Error())
		}
		return
	}
	w.status[status]++
	w.latencies = append(w.latencies, done.Sub(since))
}

func (r *runner) do(ctx context.Context, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("new request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if r.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.Token)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	// Read to the end, or the connection is not reused.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, nil
}

func (r *runner) result(workers []*worker, start time.Time) Result {
	res := Result{
		Mode:        "closed",
		URL:         r.cfg.URL,
		Concurrency: r.cfg.Concurrency,
		WarmupS:     r.cfg.Warmup.Seconds(),
		Status:      map[string]int64{},
	}
	last := r.end
	var lat []time.Duration
	for _, w := range workers {
		for code, n := range w.status {
			res.Status[strconv.Itoa(code)] += n
			res.Requests += n
		}
		res.Errors += w.errors
		res.Requests += w.errors
		res.Sent += w.sent
		res.Late += w.late
		res.MaxSendDelayMS = max(res.MaxSendDelayMS, ms(w.sendDelay))
		for _, s := range w.errSample {
			if len(res.ErrorSamples) < maxErrorSamples && !slices.Contains(res.ErrorSamples, s) {
				res.ErrorSamples = append(res.ErrorSamples, s)
			}
		}
		if w.lastDone.After(last) {
			last = w.lastDone
		}
		lat = append(lat, w.latencies...)
	}
	if now := time.Now(); last.After(now) {
		last = now // interrupted before the end
	}
	elapsed := last.Sub(r.measureFrom)
	res.DurationS = elapsed.Seconds()
	if elapsed > 0 {
		res.Rate = float64(res.Requests) / elapsed.Seconds()
	}
	if r.cfg.Rate > 0 {
		res.Mode = "open"
		res.TargetRate = r.cfg.Rate
		res.LateAfterMS = ms(r.cfg.LateAfter)
		res.Unsent = max(0, dueBetween(start, r.measureFrom, r.end, r.cfg.Rate)-res.Requests)
	}
	res.Latency = summarize(lat)
	return res
}

// dueBetween counts the slots of the schedule (start + i/rate) due in [from, to).
func dueBetween(start, from, to time.Time, rate float64) int64 {
	interval := float64(time.Second) / rate
	first := int64(math.Ceil(float64(from.Sub(start)) / interval))
	end := int64(math.Ceil(float64(to.Sub(start)) / interval))
	return end - first
}

// summarize sorts lat in place and reads nearest-rank percentiles off it.
func summarize(lat []time.Duration) Latency {
	if len(lat) == 0 {
		return Latency{}
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	return Latency{
		P50:  ms(percentile(lat, 50)),
		P90:  ms(percentile(lat, 90)),
		P99:  ms(percentile(lat, 99)),
		Max:  ms(lat[len(lat)-1]),
		Mean: ms(sum / time.Duration(len(lat))),
	}
}

// percentile is the nearest-rank p-th percentile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
