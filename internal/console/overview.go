package console

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/gate"
)

var (
	//go:embed sql/billing_log_lag.sql
	billingLogLagSQL string
	//go:embed sql/dead_letters_newest.sql
	deadLettersNewestSQL string
	//go:embed sql/alerts_since.sql
	alertsSinceSQL string
)

const (
	// lagWindow is how far back the billing log's lag is measured, over lagRows rows at
	// most: the overview reads a bounded sample, however busy the log.
	lagWindow = 30 * time.Second
	lagRows   = 5000
	// chartWindow is how far back the admissions are charted, and the billing log's newest
	// row looked for: a log quiet for longer shows none (the scan stays bounded).
	chartWindow = time.Hour
	// minRateWindow is the shortest time rates are measured over: a view sooner than this
	// after the last sample shows that sample's rates.
	minRateWindow = time.Second
)

// The metrics of this node the overview reads (internal/gate, internal/admission,
// internal/outbox).
const (
	decisionsMetric   = "metergate_admit_decisions_total"
	rejectedMetric    = "metergate_admit_rejected_requests_total"
	outboxLenMetric   = "metergate_outbox_length"
	outboxUpMetric    = "metergate_outbox_scrape_ok"
	outboxAgeMetric   = "metergate_outbox_oldest_age_seconds"
	decisionKeyPrefix = "decision/"
	rejectedKeyPrefix = "rejected/"
)

// sample is this node's admission counters at a time, and the rates measured up to it.
type sample struct {
	at     time.Time
	counts map[string]float64 // "decision/<result>", "rejected/<code>"
	rates  map[string]float64 // per second, over window; nil for the first sample
	window time.Duration
}

// rateRow is one line of this node's decisions: how many a second lately, and since start.
type rateRow struct {
	Reason string
	PerS   string // "—" before there are two samples
	Total  int64
}

// nodeCard is this node's admissions, from its metrics.
type nodeCard struct {
	Available bool
	Window    string // what the rates are measured over; "" before the second sample
	Decisions []rateRow
	Rejected  []rateRow
}

// pipelineCard is the outbox and the billing log's lag.
type pipelineCard struct {
	OutboxHere bool      // this node exposes its outbox length
	OutboxOK   bool      // and Redis answered
	OutboxLen  int64     // entries in every shard's outbox
	RelayHere  bool      // this node runs a relay
	OutboxAge  string    // its oldest entry's age
	Rows       int64     // rows of the billing log read, within lagWindow (lagRows at most)
	P50, P95   string    // ingest_time - event_time
	Newest     time.Time // the newest row read
	NewestAge  string
	WindowS    int
	Capped     bool // lagRows were read: the window has more
}

// deadLetterCard is the dead letters' count and the newest.
type deadLetterCard struct {
	Count      int64
	ID         int64
	Topic      string
	Error      string
	ReceivedAt time.Time
}

// alertRow is a usage alert fired.
type alertRow struct {
	ID, Account, Unit, Kind, Period string
	Time                            time.Time
	Threshold, Value                int64
}

// overviewPage is the data of the overview.
type overviewPage struct {
	Node        nodeCard
	Pipeline    pipelineCard
	DeadLetters deadLetterCard
	Run         *runRow
	AlertsToday int64
	Alerts      []alertRow
	Admitted    chart
	Refused     chart
}

// overview is the console's first page: this node's decisions and refusals, the outbox
// and the billing log's lag, dead letters, the last reconcile run, today's alerts and the
// admissions of the last hour. It reloads itself every 10 s when its viewer asks
// (?refresh=on): a page that reloads unasked fails WCAG 2.2.1, which axe-core checks.
func (c *Console) overview(w http.ResponseWriter, r *http.Request, v *view) {
	v.Title, v.Nav = "Overview", "overview"
	if r.URL.Query().Get("refresh") == "on" {
		v.Refresh = 10
	}
	ctx := r.Context()
	now := c.now().UTC()
	var p overviewPage
	fams := c.gather()
	p.Node = c.nodeCard(fams, now)
	p.Pipeline = outboxCard(fams)
	p.Admitted, p.Refused = c.minuteCharts(now)
	var err error
	if err = c.billingLogLag(ctx, now, &p.Pipeline); err == nil {
		if p.DeadLetters, err = c.deadLetterCard(ctx); err == nil {
			if p.Run, err = c.lastRun(ctx); err == nil {
				p.AlertsToday, p.Alerts, err = c.alertsSince(ctx, now.Truncate(24*time.Hour), 10)
			}
		}
	}
	if err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	c.render(w, r, v, http.StatusOK, "overview", p)
}

// gather reads this node's metrics; nil when there is no registry. A collector that fails
// (Redis away) leaves its metrics out, and the rest is used.
func (c *Console) gather() map[string]*dto.MetricFamily {
	if c.cfg.Metrics == nil {
		return nil
	}
	list, err := c.cfg.Metrics.Gather()
	if err != nil {
		c.cfg.Log.Warn("console: gather metrics", "err", err)
	}
	out := make(map[string]*dto.MetricFamily, len(list))
	for _, f := range list {
		out[f.GetName()] = f
	}
	return out
}

// counts sums the admission counters of fams by result and by rejection code.
func counts(fams map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	add := func(name, label, prefix string) {
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[prefix+l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	add(decisionsMetric, "result", decisionKeyPrefix)
	add(rejectedMetric, "code", rejectedKeyPrefix)
	return out
}

// nodeCard samples this node's counters at now and reports them with their rates since
// the last sample (kept in the Console, for every viewer). A view within minRateWindow of
// the last sample shows that sample's rates, so that rates are never measured over an
// instant.
func (c *Console) nodeCard(fams map[string]*dto.MetricFamily, now time.Time) nodeCard {
	if fams == nil {
		return nodeCard{}
	}
	cur := sample{at: now, counts: counts(fams)}
	c.minutes.record(now, cur.counts)
	c.mu.Lock()
	prev := c.last
	switch {
	case prev.at.IsZero():
		c.last = cur
	case now.Sub(prev.at) < minRateWindow:
		cur.rates, cur.window = prev.rates, prev.window
	default:
		cur.window = now.Sub(prev.at)
		cur.rates = map[string]float64{}
		for k, n := range cur.counts {
			cur.rates[k] = max(0, n-prev.counts[k]) / cur.window.Seconds()
		}
		c.last = cur
	}
	c.mu.Unlock()

	card := nodeCard{Available: true}
	if cur.rates != nil {
		card.Window = cur.window.Round(100 * time.Millisecond).String()
	}
	row := func(reason string, keys ...string) rateRow {
		var total, rate float64
		for _, k := range keys {
			total += cur.counts[k]
			rate += cur.rates[k]
		}
		perS := "—"
		if cur.rates != nil {
			perS = fmt.Sprintf("%.1f", rate)
		}
		return rateRow{Reason: reason, PerS: perS, Total: int64(total)}
	}
	var all []string
	for k := range cur.counts {
		if strings.HasPrefix(k, decisionKeyPrefix) {
			all = append(all, k)
		}
	}
	d := func(r admission.Result) string { return decisionKeyPrefix + string(r) }
	card.Decisions = []rateRow{
		row("Decisions", all...),
		row("Admitted", d(admission.Allow)),
		row(refused(admission.RateLimited), d(admission.RateLimited)),
		row(refused(admission.QuotaExceeded), d(admission.QuotaExceeded)),
		row(refused(admission.InsufficientBalance), d(admission.InsufficientBalance)),
	}
	var codes []string
	for k := range cur.counts {
		if code, ok := strings.CutPrefix(k, rejectedKeyPrefix); ok {
			codes = append(codes, code)
		}
	}
	sort.Strings(codes)
	for _, code := range codes {
		card.Rejected = append(card.Rejected, row(code, rejectedKeyPrefix+code))
	}
	return card
}

// outboxCard reads the outbox's length and the relay's lag from this node's metrics, when
// this node exposes them (the admitter registers the length, a relay in this process its
// oldest entry's age).
func outboxCard(fams map[string]*dto.MetricFamily) pipelineCard {
	var p pipelineCard
	if f, ok := fams[outboxLenMetric]; ok {
		p.OutboxHere, p.OutboxOK = true, true
		for _, m := range f.GetMetric() {
			p.OutboxLen += int64(m.GetGauge().GetValue())
		}
	}
	if f, ok := fams[outboxUpMetric]; ok {
		p.OutboxHere = true
		for _, m := range f.GetMetric() {
			p.OutboxOK = p.OutboxOK || m.GetGauge().GetValue() == 1
		}
	}
	if f, ok := fams[outboxAgeMetric]; ok {
		p.RelayHere = true
		var oldest float64
		for _, m := range f.GetMetric() {
			oldest = max(oldest, m.GetGauge().GetValue())
		}
		p.OutboxAge = seconds(oldest)
	}
	return p
}

// seconds writes a duration of s seconds for people: "0.42 s", "12 s", "3.5 min", "2.0 h".
func seconds(s float64) string {
	switch {
	case s < 10:
		return fmt.Sprintf("%.2f s", s)
	case s < 120:
		return fmt.Sprintf("%.0f s", s)
	case s < 7200:
		return fmt.Sprintf("%.1f min", s/60)
	}
	return fmt.Sprintf("%.1f h", s/3600)
}

// billingLogLag measures the billing log's lag over its rows of the last lagWindow (the
// first lagRows of them at most), and how old the newest of those is.
func (c *Console) billingLogLag(ctx context.Context, now time.Time, p *pipelineCard) error {
	p.WindowS = int(lagWindow / time.Second)
	var p50, p95 float64
	var newest *time.Time
	if err := c.cfg.Pool.QueryRow(ctx, billingLogLagSQL, pgx.StrictNamedArgs{"since": now.Add(-lagWindow), "limit": lagRows}).Scan(
		&p.Rows, &p50, &p95, &newest); err != nil {
		return fmt.Errorf("billing log lag: %w", err)
	}
	p.Capped = p.Rows >= lagRows
	if p.Rows > 0 {
		p.P50, p.P95 = seconds(p50), seconds(p95)
	}
	if newest != nil {
		p.Newest = *newest
		p.NewestAge = seconds(max(0, now.Sub(p.Newest).Seconds()))
	}
	return nil
}

func (c *Console) deadLetterCard(ctx context.Context) (deadLetterCard, error) {
	var d deadLetterCard
	err := c.cfg.Pool.QueryRow(ctx, deadLettersNewestSQL).Scan(&d.Count, &d.ID, &d.Topic, &d.Error, &d.ReceivedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return deadLetterCard{}, nil
	}
	if err != nil {
		return d, fmt.Errorf("dead letters: %w", err)
	}
	if len(d.Error) > 300 {
		d.Error = truncate(d.Error, 300)
	}
	return d, nil
}

// lastRun is the latest reconcile run; nil when there is none.
func (c *Console) lastRun(ctx context.Context) (*runRow, error) {
	runs, err := c.runs(ctx, endOfTime, maxRunID, 1)
	if err != nil || len(runs) == 0 {
		return nil, err
	}
	return &runs[0], nil
}

// alertsSince counts the usage alerts fired since since and returns the latest limit.
func (c *Console) alertsSince(ctx context.Context, since time.Time, limit int) (int64, []alertRow, error) {
	rows, err := c.cfg.Pool.Query(ctx, alertsSinceSQL, pgx.StrictNamedArgs{"since": since, "limit": limit})
	if err != nil {
		return 0, nil, fmt.Errorf("alerts: %w", err)
	}
	var total int64
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (alertRow, error) {
		var a alertRow
		err := r.Scan(&total, &a.ID, &a.Time, &a.Account, &a.Unit, &a.Kind, &a.Threshold, &a.Value, &a.Period)
		return a, err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("alerts: %w", err)
	}
	return total, list, nil
}

// Sample keeps sampling this node's counters every 10 s for the overview's per-minute
// charts until ctx ends (the overview samples them too, whenever it is viewed).
func (c *Console) Sample(ctx context.Context) error {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if fams := c.gather(); fams != nil {
				c.minutes.record(c.now().UTC(), counts(fams))
			}
		}
	}
}

// minuteCharts charts this node's admissions and refusals per minute over the last
// chartWindow, the current minute last: each minute's growth of the counters, from the
// samples kept (a minute without a sample on either side shows nothing).
func (c *Console) minuteCharts(now time.Time) (admitted, refused chart) {
	last := now.Truncate(time.Minute)
	since := last.Add(-chartWindow + time.Minute)
	var labels []string
	var ok, no []int64
	for m := since; !m.After(last); m = m.Add(time.Minute) {
		labels = append(labels, m.Format("15:04"))
		a, r := c.minutes.growth(m)
		ok, no = append(ok, a), append(no, r)
	}
	admitted = newChart("Admitted per minute at this node, last hour", "admissions", labels, ok)
	admitted.Caption = fmt.Sprintf("%s, UTC (at most %s a minute), from this node's counters", admitted.Title, formatNum(admitted.Max))
	refused = newChart("Refused by a limit per minute at this node, last hour", "refusals", labels, no)
	refused.Caption = fmt.Sprintf("%s, UTC (at most %s a minute): 429 and 402", refused.Title, formatNum(refused.Max))
	return admitted, refused
}

// minuteSamples are this node's decision counters as last sampled in each minute of the
// last hour or so: a ring of chartWindow/minute + 1 slots, so that memory and the page's
// cost stay the same however busy the node.
type minuteSamples struct {
	mu    sync.Mutex
	slots [61]minuteSample
}

type minuteSample struct {
	minute             time.Time
	admitted, refusals float64
}

// record keeps counts as the sample of now's minute.
func (s *minuteSamples) record(now time.Time, counts map[string]float64) {
	var admitted, refusals float64
	for k, n := range counts {
		switch r, _ := strings.CutPrefix(k, decisionKeyPrefix); admission.Result(r) {
		case admission.Allow:
			admitted += n
		case admission.RateLimited, admission.QuotaExceeded, admission.InsufficientBalance:
			refusals += n
		}
	}
	m := now.Truncate(time.Minute)
	s.mu.Lock()
	s.slots[m.Unix()/60%int64(len(s.slots))] = minuteSample{minute: m, admitted: admitted, refusals: refusals}
	s.mu.Unlock()
}

// growth is how much the counters grew from the sample of the minute before m to m's.
func (s *minuteSamples) growth(m time.Time) (admitted, refusals int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(len(s.slots))
	cur, prev := s.slots[m.Unix()/60%n], s.slots[(m.Unix()/60-1+n)%n]
	if !cur.minute.Equal(m) || !prev.minute.Equal(m.Add(-time.Minute)) {
		return 0, 0
	}
	return int64(max(0, cur.admitted-prev.admitted)), int64(max(0, cur.refusals-prev.refusals))
}

// refused names a refusal as admit answers it: "Refused 402: quota exceeded".
func refused(r admission.Result) string {
	return fmt.Sprintf("Refused %d: %s", gate.Status(r), strings.ReplaceAll(string(r), "_", " "))
}
