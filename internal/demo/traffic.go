package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/metergate/metergate/pkg/client"
)

// Blocked counts the denials of one limit: the status (429 or 402) and admit's blocked_by.
type Blocked struct {
	Status  int
	Level   string // org, team, user, agent
	Account string
	Unit    string // requests, tokens, credits, cost_micros or concurrent-requests
	Count   int
}

// stats is what the callers saw, shared by the traffic's goroutines.
type stats struct {
	mu        sync.Mutex
	requests  int
	byStatus  map[int]int
	replays   int
	estimated int // 200s whose tokens admit estimated from the model request
	errors    map[string]int
	blocked   map[Blocked]int // Count 0 in the key
	ids       map[string]bool // event ids of the 200s
	periods   map[string]bool
	reported  int // outcomes accepted (202)
	fiveXX    int // of them with a 5xx status
	actual    int // of them reporting actual tokens
	outErrors map[string]int
	// tokens admitted (charged at admission, replays left out), by the account whose key
	// sent the request, and its 429s for tokens by the account that refused.
	tokens       map[string]int64
	tokenRefused map[[2]string]int // sender, blocked_by.account
	// waits: the requests sent with a MaxWait, by account.
	waits map[string]*Wait
	// insufficient: the 402s for a spent balance (insufficient_balance), of byStatus[402].
	insufficient int
	prepaid      prepaidSeen
}

// prepaidSeen is what prepaidco's caller saw.
type prepaidSeen struct {
	sent, admitted, refused, afterTopUp, fiveXX int
	refusedAfterTopUp                           int
	charged                                     int64 // units of its admitted calls
	firstRefusal                                time.Duration
	topUp                                       *GrantMade
	topUpErr                                    error
}

func newStats() *stats {
	return &stats{byStatus: map[int]int{}, errors: map[string]int{}, blocked: map[Blocked]int{},
		ids: map[string]bool{}, periods: map[string]bool{}, outErrors: map[string]int{},
		tokens: map[string]int64{}, tokenRefused: map[[2]string]int{}, waits: map[string]*Wait{}}
}

// errorKey names an error reply for the counts: "503 unavailable", or "transport".
func errorKey(err error) string {
	var apiErr *client.APIError
	if errors.As(err, &apiErr) {
		return fmt.Sprintf("%d %s", apiErr.Status, apiErr.Code)
	}
	return "transport error"
}

// traffic drives the demo's callers through pkg/client until end.
type traffic struct {
	c          *client.Client
	keys       map[string]string
	st         *stats
	begin, end time.Time
	seed       uint64
	// topUp grants prepaidco more once its balance has run out; nil: no top-up.
	topUp func(context.Context) (GrantMade, error)
}

func (t *traffic) running(ctx context.Context) bool {
	return ctx.Err() == nil && time.Now().Before(t.end)
}

// sleep waits d, or less if the traffic ends first.
func (t *traffic) sleep(ctx context.Context, d time.Duration) {
	if left := time.Until(t.end); d > left {
		d = max(left, 0)
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// waitThreshold is how long admit must have held a request for it to count as having waited:
// an answer at once takes a millisecond or two.
const waitThreshold = 5 * time.Millisecond

// admit asks for a decision for the account's key and counts it.
func (t *traffic) admit(ctx context.Context, account string, r client.Request) (client.Decision, bool) {
	r.APIKey = t.keys[account]
	begin := time.Now()
	d, err := t.c.Admit(ctx, r)
	took := time.Since(begin)
	t.st.mu.Lock()
	defer t.st.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			t.st.requests++
			t.st.errors[errorKey(err)]++
		}
		return d, false
	}
	if r.MaxWait > 0 {
		t.st.wait(account, d, took)
	}
	t.st.requests++
	t.st.byStatus[d.Status]++
	switch {
	case d.Allowed():
		t.st.ids[d.EventID] = true
		t.st.periods[d.Period] = true
		if d.Replayed {
			t.st.replays++
		}
		if d.Estimated != nil && !d.Replayed {
			t.st.estimated++
		}
		switch {
		case d.Replayed:
		case d.Estimated != nil:
			t.st.tokens[account] += d.Estimated.TotalTokens
		default:
			t.st.tokens[account] += r.Units["tokens"]
		}
	case d.BlockedBy != nil:
		if d.Decision == "insufficient_balance" {
			t.st.insufficient++
		}
		t.st.blocked[Blocked{Status: d.Status, Level: d.BlockedBy.Level, Account: d.BlockedBy.Account, Unit: d.BlockedBy.Unit}]++
		if d.BlockedBy.Unit == "tokens" {
			t.st.tokenRefused[[2]string{account, d.BlockedBy.Account}]++
		}
	}
	return d, d.Allowed()
}

// wait counts a decision of a request that could wait: admit's waited_ms, or the call's
// time if the reply has none.
func (st *stats) wait(account string, d client.Decision, took time.Duration) {
	w := st.waits[account]
	if w == nil {
		w = &Wait{Account: account}
		st.waits[account] = w
	}
	w.Sent++
	waited := took
	if d.WaitedMS != nil {
		waited = time.Duration(*d.WaitedMS) * time.Millisecond
	}
	switch {
	case waited < waitThreshold && d.Allowed():
		w.AdmittedAtOnce++
		return
	case waited < waitThreshold:
		w.RefusedAtOnce++
		return
	case d.Allowed():
		w.AdmittedAfterWait++
	default:
		w.OutOfTime++
	}
	w.Total += waited
	w.Max = max(w.Max, waited)
}

// outcome reports how an admitted request ended, with its actual units if any.
func (t *traffic) outcome(ctx context.Context, eventID string, status int, units map[string]int64) {
	err := t.c.Outcome(context.WithoutCancel(ctx), eventID, status, units)
	t.st.mu.Lock()
	defer t.st.mu.Unlock()
	if err != nil {
		t.st.outErrors[errorKey(err)]++
		return
	}
	t.st.reported++
	if status >= 500 {
		t.st.fiveXX++
	}
	if units["tokens"] > 0 {
		t.st.actual++
	}
}

// pause after a 429: its retry_after_ms, kept between 20 and 200 ms.
func pause(d client.Decision) time.Duration {
	w := 50 * time.Millisecond
	if d.RetryAfterMS != nil && *d.RetryAfterMS >= 0 {
		w = time.Duration(*d.RetryAfterMS) * time.Millisecond
	}
	return min(max(w, 20*time.Millisecond), 200*time.Millisecond)
}

// upstream picks how a request ended upstream: a 5xx with probability p.
func upstream(rng *rand.Rand, p float64) int {
	if rng.Float64() < p {
		return []int{500, 502, 503}[rng.IntN(3)]
	}
	return http.StatusOK
}

// run starts every caller and returns when the traffic is over (and every outcome is in).
func (t *traffic) run(ctx context.Context, d time.Duration) {
	var wg sync.WaitGroup
	n := uint64(0)
	goFn := func(f func(*rand.Rand)) {
		n++
		rng := rand.New(rand.NewPCG(t.seed, n))
		wg.Add(1)
		go func() { defer wg.Done(); f(rng) }()
	}
	for range 3 {
		goFn(func(rng *rand.Rand) { t.agent1(ctx, rng) })
	}
	goFn(func(rng *rand.Rand) { t.agent2(ctx, rng) })
	for range 2 {
		goFn(func(rng *rand.Rand) { t.bob(ctx, rng) })
		goFn(func(rng *rand.Rand) { t.bigcorp(ctx, rng) })
	}
	goFn(func(rng *rand.Rand) { t.marketing(ctx, rng) })
	goFn(func(rng *rand.Rand) { t.support(ctx, rng, "oncall", 300*time.Millisecond) })
	for range 4 {
		goFn(func(rng *rand.Rand) { t.support(ctx, rng, "batch", 150*time.Millisecond) })
	}
	goFn(func(rng *rand.Rand) { t.tinyco(ctx, rng) })
	goFn(func(*rand.Rand) { t.prepaid(ctx, d) })
	goFn(func(*rand.Rand) {
		t.sleep(ctx, d*2/5)
		if t.running(ctx) {
			t.spike(ctx)
		}
	})
	wg.Wait()
}

// agent1 makes token-heavy LLM calls: an estimate of 1,500-6,000 tokens, 60-180 ms of
// work, then the outcome with the actual tokens (55-95 % of the estimate), or a 5xx. Three
// callers share agent-1's 2 slots, so about one call in three is refused (429,
// concurrent-requests) until a slot is released by an outcome.
func (t *traffic) agent1(ctx context.Context, rng *rand.Rand) {
	for t.running(ctx) {
		est := int64(1500 + rng.IntN(4500))
		d, ok := t.admit(ctx, "agent-1", client.Request{Units: map[string]int64{"tokens": est}, Tool: "llm_call"})
		if !ok {
			t.sleep(ctx, pause(d))
			continue
		}
		time.Sleep(time.Duration(60+rng.IntN(120)) * time.Millisecond)
		if status := upstream(rng, 0.07); status >= 500 {
			t.outcome(ctx, d.EventID, status, nil)
		} else {
			t.outcome(ctx, d.EventID, status, map[string]int64{"tokens": est * int64(55+rng.IntN(41)) / 100})
		}
	}
}

// agent2 calls tools (web_search 1 credit, code_execute 5, image_generate 10) in bursts of
// 8 every 2 s, against a rate of 2 requests/s with a burst of 4.
func (t *traffic) agent2(ctx context.Context, rng *rand.Rand) {
	tools := []string{"web_search", "web_search", "code_execute", "image_generate"}
	for t.running(ctx) {
		var wg sync.WaitGroup
		for range 8 {
			tool, status := tools[rng.IntN(len(tools))], upstream(rng, 0.07)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if d, ok := t.admit(ctx, "agent-2", client.Request{Tool: tool}); ok {
					t.outcome(ctx, d.EventID, status, nil)
				}
			}()
		}
		wg.Wait()
		t.sleep(ctx, 2*time.Second)
	}
}

// bob makes light calls, some with web_search; one in ten carries an idempotency key and
// is sent twice, as a client retry would: the second is answered from the first
// ("replayed", same event id) and charged nothing.
func (t *traffic) bob(ctx context.Context, rng *rand.Rand) {
	for t.running(ctx) {
		r := client.Request{Units: map[string]int64{"tokens": int64(200 + rng.IntN(600))}}
		if rng.IntN(4) == 0 { // a quarter send the model request for admit to estimate
			r.Units = nil
			r.Estimate = &client.EstimateRequest{Request: json.RawMessage(fmt.Sprintf(
				`{"model":"gpt-4o-mini","max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
				100+rng.IntN(400), strings.Repeat("Summarise this week's usage. ", 5+rng.IntN(40))))}
		}
		if rng.IntN(5) == 0 {
			r.Tool = "web_search"
		}
		retry := rng.IntN(10) == 0
		if retry {
			r.IdempotencyKey = fmt.Sprintf("demo-%016x", rng.Uint64())
		}
		d, ok := t.admit(ctx, "bob", r)
		if ok && retry {
			t.admit(ctx, "bob", r)
		}
		if ok {
			status := upstream(rng, 0.07)
			var units map[string]int64
			charged := r.Units["tokens"]
			if d.Estimated != nil {
				charged = d.Estimated.TotalTokens
			}
			if status < 500 && rng.IntN(2) == 0 {
				units = map[string]int64{"tokens": charged * int64(50+rng.IntN(51)) / 100}
			}
			t.outcome(ctx, d.EventID, status, units)
		}
		t.sleep(ctx, time.Duration(100+rng.IntN(100))*time.Millisecond)
	}
}

// spike: 480 of bob's requests at once from 12 callers, past acme's burst of 300 (team has pro's rates)
// requests (a 429 at the org level).
func (t *traffic) spike(ctx context.Context) {
	var wg sync.WaitGroup
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				if d, ok := t.admit(ctx, "bob", client.Request{Units: map[string]int64{"tokens": 100}}); ok {
					t.outcome(ctx, d.EventID, http.StatusOK, nil)
				}
			}
		}()
	}
	wg.Wait()
}

// marketing sends about 6.6 requests/s against its sliding window of 20 per 5 s.
func (t *traffic) marketing(ctx context.Context, rng *rand.Rand) {
	for t.running(ctx) {
		r := client.Request{Units: map[string]int64{"tokens": int64(300 + rng.IntN(1200))}}
		if rng.IntN(3) == 0 {
			r.Tool = "web_search"
		}
		if d, ok := t.admit(ctx, "marketing", r); ok {
			t.outcome(ctx, d.EventID, upstream(rng, 0.05), nil)
		}
		t.sleep(ctx, 150*time.Millisecond)
	}
}

// supportWait is how long support's requests may wait for capacity (max_wait_ms).
const supportWait = time.Second

// support sends one of account's requests at a time, each allowed to wait supportWait
// in support's queue, and pauses 0.5-1.5 × every after each. oncall (one caller, every
// 300 ms) and batch (four, every 150 ms) ask for more than support's 5 requests/s, so
// most requests wait and some run out of time. By priority oncall's waits should be the
// shorter; the report shows them, nothing asserts it.
func (t *traffic) support(ctx context.Context, rng *rand.Rand, account string, every time.Duration) {
	for t.running(ctx) {
		if d, ok := t.admit(ctx, account, client.Request{Tool: "web_search", MaxWait: supportWait}); ok {
			t.outcome(ctx, d.EventID, upstream(rng, 0.02), nil)
		}
		t.sleep(ctx, every/2+time.Duration(rng.Int64N(int64(every))))
	}
}

// tinyco, a free org: a burst of 25 at once (the free plan lets 20 through), then 5/s
// until its monthly quota is spent (402) and on.
func (t *traffic) tinyco(ctx context.Context, rng *rand.Rand) {
	var wg sync.WaitGroup
	for range 25 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d, ok := t.admit(ctx, "tinyco", client.Request{Units: map[string]int64{"tokens": 250}}); ok {
				t.outcome(ctx, d.EventID, http.StatusOK, nil)
			}
		}()
	}
	wg.Wait()
	for t.running(ctx) {
		t.sleep(ctx, 200*time.Millisecond)
		if d, ok := t.admit(ctx, "tinyco", client.Request{Units: map[string]int64{"tokens": int64(100 + rng.IntN(300))}}); ok {
			t.outcome(ctx, d.EventID, http.StatusOK, nil)
		}
	}
}

// prepaid is prepaidco's caller: a call of 2,000-8,000 cost_micros every 100 ms or so,
// each drawn from its grants; one admitted call in six ends in a 5xx, whose draw reconcile
// gives back. Once its balance has run out (402 insufficient_balance) for a tenth of the
// run (and three calls at least), it is topped up (t.topUp), and its calls pass again.
func (t *traffic) prepaid(ctx context.Context, d time.Duration) {
	refusedFor := max(d/10, 300*time.Millisecond)
	var firstRefusal time.Time
	for n := 0; t.running(ctx); n++ {
		cost := int64(2000 + (n*1237)%6001) // spread over 2,000-8,000, no rng: runs compare
		dec, ok := t.admit(ctx, prepaidOrg, client.Request{Units: map[string]int64{prepaidUnit: cost}})
		t.st.mu.Lock()
		p := &t.st.prepaid
		p.sent++
		switch {
		case ok:
			p.admitted++
			p.charged += cost
			if p.topUp != nil {
				p.afterTopUp++
			}
		case dec.Decision == "insufficient_balance":
			p.refused++
			if p.topUp != nil {
				p.refusedAfterTopUp++
			}
			if firstRefusal.IsZero() {
				firstRefusal = time.Now()
				p.firstRefusal = firstRefusal.Sub(t.begin)
			}
		}
		fiveXX := ok && p.admitted%6 == 3
		if fiveXX {
			p.fiveXX++
		}
		topUp := t.topUp != nil && p.topUp == nil && p.topUpErr == nil &&
			p.refused >= 3 && !firstRefusal.IsZero() && time.Since(firstRefusal) >= refusedFor
		t.st.mu.Unlock()
		if ok {
			status := http.StatusOK
			if fiveXX {
				status = http.StatusBadGateway
			}
			t.outcome(ctx, dec.EventID, status, nil)
		}
		if topUp {
			g, err := t.topUp(ctx)
			g.At = time.Since(t.begin)
			t.st.mu.Lock()
			if err != nil {
				t.st.prepaid.topUpErr = err
			} else {
				t.st.prepaid.topUp = &g
			}
			t.st.mu.Unlock()
		}
		t.sleep(ctx, 100*time.Millisecond)
	}
}

// bigcorp, an enterprise org: tool-weighted calls with tokens, some 5xx, actual tokens
// reported.
func (t *traffic) bigcorp(ctx context.Context, rng *rand.Rand) {
	tools := []string{"llm_call", "llm_call", "code_execute", "image_generate"}
	for t.running(ctx) {
		est := int64(1000 + rng.IntN(8000))
		d, ok := t.admit(ctx, "bigcorp", client.Request{Units: map[string]int64{"tokens": est}, Tool: tools[rng.IntN(len(tools))]})
		if ok {
			time.Sleep(time.Duration(30+rng.IntN(50)) * time.Millisecond)
			if status := upstream(rng, 0.06); status >= 500 {
				t.outcome(ctx, d.EventID, status, nil)
			} else {
				t.outcome(ctx, d.EventID, status, map[string]int64{"tokens": est * int64(60+rng.IntN(41)) / 100})
			}
		}
		t.sleep(ctx, time.Duration(50+rng.IntN(40))*time.Millisecond)
	}
}

// progress prints the decisions so far: a line rewritten in place on a terminal, a line
// every 5 s otherwise. It returns when done is closed, after a last line.
func progress(out io.Writer, st *stats, start time.Time, d time.Duration, done <-chan struct{}) {
	tty := isTerminal(out)
	every := 5 * time.Second
	if tty {
		every = 250 * time.Millisecond
	}
	line := func(final bool) string {
		st.mu.Lock()
		defer st.mu.Unlock()
		at := fmt.Sprintf("%3s/%s", min(time.Since(start), d).Truncate(time.Second), d)
		if final {
			at = "done"
		}
		var errs int
		for _, n := range st.errors {
			errs += n
		}
		return fmt.Sprintf("  traffic %-8s requests %5d   200 %5d   429 %5d   402 %4d   errors %d   outcomes %5d",
			at, st.requests, st.byStatus[200], st.byStatus[429], st.byStatus[402], errs, st.reported)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-done:
			if tty {
				fmt.Fprintf(out, "\r%s\n", line(true))
			} else {
				fmt.Fprintln(out, line(true))
			}
			return
		case <-tick.C:
			if tty {
				fmt.Fprintf(out, "\r%s", line(false))
			} else {
				fmt.Fprintln(out, line(false))
			}
		}
	}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// snapshot copies the counts for the report.
func (st *stats) snapshot(r *Report) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r.Requests = st.requests
	r.Decisions = map[int]int{}
	for k, v := range st.byStatus {
		r.Decisions[k] = v
	}
	r.Replays = st.replays
	r.Estimated = st.estimated
	r.Errors = map[string]int{}
	for k, v := range st.errors {
		r.Errors[k] = v
	}
	for k, v := range st.outErrors {
		r.Errors["outcome "+k] += v
	}
	r.Blocked = r.Blocked[:0]
	for k, v := range st.blocked {
		k.Count = v
		r.Blocked = append(r.Blocked, k)
	}
	sort.Slice(r.Blocked, func(i, j int) bool {
		a, b := r.Blocked[i], r.Blocked[j]
		if a.Status != b.Status {
			return a.Status > b.Status
		}
		if levelRank(a.Level) != levelRank(b.Level) {
			return levelRank(a.Level) < levelRank(b.Level)
		}
		return a.Account+a.Unit < b.Account+b.Unit
	})
	r.Admitted = len(st.ids)
	r.Periods = r.Periods[:0]
	for p := range st.periods {
		r.Periods = append(r.Periods, p)
	}
	sort.Strings(r.Periods)
	r.OutcomesReported, r.Outcomes5xx, r.OutcomesActual = st.reported, st.fiveXX, st.actual
	r.Insufficient = st.insufficient
	c, p := &r.Credits, st.prepaid
	c.Sent, c.Admitted, c.Refused, c.AdmittedAfterTopUp, c.FiveXX = p.sent, p.admitted, p.refused, p.afterTopUp, p.fiveXX
	c.Charged, c.FirstRefusal, c.RefusedAfterTopUp = p.charged, p.firstRefusal, p.refusedAfterTopUp
	if p.topUp != nil && len(c.Grants) < 2 {
		c.Grants = append(c.Grants, *p.topUp)
	}
	if p.topUpErr != nil {
		c.TopUpErr = p.topUpErr.Error()
	}
	r.Waits = r.Waits[:0]
	for _, w := range st.waits {
		r.Waits = append(r.Waits, *w)
	}
	sort.Slice(r.Waits, func(i, j int) bool { return r.Waits[i].Account < r.Waits[j].Account })
	for i := range r.Guarantees {
		g := &r.Guarantees[i]
		g.Admitted, g.Refused = 0, 0
		for _, acc := range g.callers {
			g.Admitted += st.tokens[acc]
			for _, by := range g.above {
				g.Refused += st.tokenRefused[[2]string{acc, by}]
			}
		}
	}
}

// eventIDs returns a copy of the admitted event ids.
func (st *stats) eventIDs() map[string]bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make(map[string]bool, len(st.ids))
	for id := range st.ids {
		out[id] = true
	}
	return out
}

func levelRank(l string) int {
	switch strings.ToLower(l) {
	case "org":
		return 0
	case "team":
		return 1
	case "user":
		return 2
	case "agent":
		return 3
	}
	return 4
}

var discard = slog.New(slog.DiscardHandler)
