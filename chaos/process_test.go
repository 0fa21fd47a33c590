package chaos_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/pkg/testenv"
)

// Scenario 3: the meter killed with SIGKILL five times (one in the short form) in the middle
// of a batch, during a load, and started again each time. The meter collects batches of up to
// 500 messages for up to 3 s, so during the load it always holds messages it has fetched and
// not yet written (or written and not yet committed). A kill is injected only once the
// running meter has joined the group and written a batch (it is consuming) and while the
// group's committed offsets trail the topic's end (messages in hand). Nothing the killed
// meter held may be lost (the restarted one reads again from the committed offsets) and
// nothing may be counted twice (what the killed one had written before its offsets were
// committed is delivered again and absorbed).
func TestKillMeter(t *testing.T) {
	t.Parallel()
	sc := begin(t, "3 kill -9 meter")
	s := newStack(t, options{Meters: 1, MeterEnv: []string{
		"METER_BATCH_SIZE=500", "METER_BATCH_WAIT=3s",
		"METER_SESSION_TIMEOUT=6s", // the killed member's partitions go to its successor after 6 s
	}})
	key := s.account("chaos-org", "org", "", "enterprise", map[string]any{"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000}})

	requests, kills := pick(2_000, 20_000), pick(1, 5)
	meter := s.meters[0]
	group := stackEnv(meter.env, "METER_GROUP")
	require.NotEmpty(t, group)
	var (
		done      []meterKill
		due       bool
		injectErr error
		// written and duplicates of each incarnation of the meter, read just before it was killed
		incarnations []meterCounts
	)
	res := s.load(loadSpec{Requests: requests, Workers: 32, Keys: []string{key}, Deadline: 5 * time.Minute,
		Progress: func(n int) {
			// Runs in a caller's goroutine, under the load's progress lock: no require here.
			if injectErr != nil || len(done) == kills {
				return
			}
			if !due && n < (len(done)+1)*requests/(kills+1) {
				return
			}
			due = true // evenly through the load, at the first point where the meter is mid-batch
			k, counts, killed, err := killMidBatch(s, meter, group)
			if err != nil {
				injectErr = err
				return
			}
			if killed {
				done = append(done, k)
				incarnations = append(incarnations, counts)
				due = false
			}
		}})
	require.NoError(t, injectErr, "inject the kills")
	require.Len(t, done, kills, "every kill happened during the load")
	b := s.waitBooks(3*time.Minute, res)
	sc.fill(b, res)

	// The last meter reads to the end of every partition and commits it.
	ctx := testenv.Context(t, 3*time.Minute)
	var behind int64
	deadline := time.Now().Add(2 * time.Minute)
	for {
		committed, end, err := groupPositions(ctx, s.brokers, s.topic, group)
		require.NoError(t, err)
		behind = 0
		for p, e := range end {
			behind += e - committed[p]
		}
		if behind == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	last, err := readMeterCounts(ctx, meter)
	require.NoError(t, err)
	incarnations = append(incarnations, last)

	// What each kill left uncommitted: rows written after the kill (by a restarted meter,
	// reading again from the committed offsets) and before it (written by the killed one
	// before its commit, delivered again and skipped as duplicates).
	var inHand, rereadAfter, dupAbsorbed []string
	rereadTotal := 0
	for i, k := range done {
		var parts []int32
		var lo, hi []int64
		window := int64(0)
		for p, to := range k.to {
			parts = append(parts, int32(p))
			lo = append(lo, k.from[p])
			hi = append(hi, to)
			window += to - k.from[p]
		}
		var rows, after int
		require.NoError(t, s.db.QueryRow(ctx, `
select count(*), count(*) filter (where e.ingest_time > $4)
from usage_events e
join unnest($1::int[], $2::bigint[], $3::bigint[]) as w(p, lo, hi)
  on e.kafka_partition = w.p and e.kafka_offset >= w.lo and e.kafka_offset < w.hi`, parts, lo, hi, k.at).Scan(&rows, &after))
		next := incarnations[i+1]
		inHand = append(inHand, fmt.Sprint(k.pending))
		rereadAfter = append(rereadAfter, fmt.Sprintf("%d/%d", after, window))
		dupAbsorbed = append(dupAbsorbed, fmt.Sprint(next.duplicates))
		rereadTotal += after
		require.Positive(t, incarnations[i].written, "kill %d: the killed meter had written batches (it was consuming)", i+1)
		require.Positive(t, k.pending, "kill %d: messages in hand (produced, not committed)", i+1)
		require.LessOrEqual(t, rows, int(window), "kill %d: rows of the offsets uncommitted at the kill", i+1)
		require.Positive(t, after, "kill %d: messages uncommitted at the kill were written after it, by a restarted meter", i+1)
		// A restarted meter starts at the committed offsets: it sees again at most what was
		// uncommitted at the kill (a meter that started from the beginning would skip every
		// row written so far).
		require.LessOrEqual(t, next.duplicates, window, "kill %d: the restarted meter read again only from the committed offsets", i+1)
	}
	sc.Note = fmt.Sprintf("%d kills mid-batch (batches of 500 / 3 s); uncommitted at each kill %s; of those offsets, rows written after the kill %s; "+
		"duplicates absorbed by the restarted meter %s; group committed to the end (%d behind); final answers %v",
		len(done), strings.Join(inHand, ","), strings.Join(rereadAfter, ","), strings.Join(dupAbsorbed, ","), behind, res.Status)
	require.Equal(t, requests, res.Status[200], "every request is admitted")
	b.requireExact(t, requests)
	require.Zero(t, behind, "the group committed every offset after the last restart")
	require.Positive(t, rereadTotal)
}

// meterKill is one kill of the meter.
type meterKill struct {
	at      time.Time
	pending int64 // messages produced and not committed when the kill was decided
	// from and to are, per partition, the committed and end offsets right after the kill:
	// what a restarted meter must read again.
	from, to map[int]int64
}

// meterCounts are one meter process's counters.
type meterCounts struct {
	written    int64 // metergate_meter_messages_total
	duplicates int64 // metergate_meter_duplicates_total{table="usage_events"}
}

// killMidBatch kills the meter if it is mid-batch: it has written a batch since it started
// (waiting, up to 2 minutes, until it has: a restarted meter first waits for the killed
// member's session to end) and the group's committed offsets trail the topic's end. It then
// starts it again. It returns false when nothing was uncommitted (the caller tries again at
// the next point of the load).
func killMidBatch(s *stack, m *node, group string) (meterKill, meterCounts, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var counts meterCounts
	for {
		c, err := readMeterCounts(ctx, m)
		if err != nil {
			return meterKill{}, counts, false, err
		}
		counts = c
		if c.written > 0 {
			break
		}
		select {
		case <-ctx.Done():
			return meterKill{}, counts, false, fmt.Errorf("the meter wrote no batch within 2 minutes of its start:\n%s", logTail(m.Output(), 3000))
		case <-time.After(100 * time.Millisecond):
		}
	}
	committed, end, err := groupPositions(ctx, s.brokers, s.topic, group)
	if err != nil {
		return meterKill{}, counts, false, err
	}
	pending := int64(0)
	for p, e := range end {
		pending += e - committed[p]
	}
	if pending == 0 {
		return meterKill{}, counts, false, nil
	}
	// The counters once more, as close to the kill as possible.
	if c, err := readMeterCounts(ctx, m); err == nil {
		counts = c
	}
	if err := m.p.Signal(syscall.SIGKILL); err != nil {
		return meterKill{}, counts, false, fmt.Errorf("kill the meter: %w", err)
	}
	if _, err := m.p.Wait(30 * time.Second); err != nil {
		return meterKill{}, counts, false, fmt.Errorf("the killed meter: %w", err)
	}
	k := meterKill{at: time.Now(), pending: pending}
	// Nobody consumes now: these are the offsets the next meter starts from, and the end of
	// what the killed one could have seen.
	if k.from, k.to, err = groupPositions(ctx, s.brokers, s.topic, group); err != nil {
		return k, counts, false, err
	}
	m.p = testenv.Start(m.t, filepath.Join(bin, m.name), m.env, m.args...)
	if _, err := testenv.WaitHTTP(ctx, m.URL()+"/healthz", 200); err != nil {
		return k, counts, false, fmt.Errorf("restarted meter up: %w\n%s", err, logTail(m.Output(), 3000))
	}
	return k, counts, true, nil
}

// readMeterCounts reads the counters of the meter's current process from its /metrics.
func readMeterCounts(ctx context.Context, m *node) (meterCounts, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", m.URL()+"/metrics", nil)
	if err != nil {
		return meterCounts{}, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return meterCounts{}, fmt.Errorf("meter metrics: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return meterCounts{}, fmt.Errorf("meter metrics: %w", err)
	}
	if resp.StatusCode != 200 {
		return meterCounts{}, fmt.Errorf("meter metrics: status %d", resp.StatusCode)
	}
	var c meterCounts
	found := 0
	for _, line := range strings.Split(string(raw), "\n") {
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch series {
		case "metergate_meter_messages_total":
			c.written = int64(v)
			found++
		case `metergate_meter_duplicates_total{table="usage_events"}`:
			c.duplicates = int64(v)
			found++
		}
	}
	if found != 2 {
		return c, fmt.Errorf("meter metrics: messages_total or duplicates_total missing:\n%s", raw)
	}
	return c, nil
}

// groupPositions returns, per partition of the topic, the group's committed offset (0 when
// none) and the end offset.
func groupPositions(ctx context.Context, brokers []string, topic, group string) (committed, end map[int]int64, err error) {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	var parts []int
	for _, tp := range meta.Topics {
		if tp.Error != nil {
			return nil, nil, fmt.Errorf("metadata of %s: %w", topic, tp.Error)
		}
		for _, p := range tp.Partitions {
			parts = append(parts, p.ID)
		}
	}
	if len(parts) == 0 {
		return nil, nil, fmt.Errorf("topic %s has no partitions", topic)
	}
	reqs := make([]kafka.OffsetRequest, len(parts))
	for i, p := range parts {
		reqs[i] = kafka.LastOffsetOf(p)
	}
	lo, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	end = map[int]int64{}
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return nil, nil, fmt.Errorf("end offset of %s/%d: %w", topic, po.Partition, po.Error)
		}
		end[po.Partition] = po.LastOffset
	}
	of, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return nil, nil, fmt.Errorf("committed offsets of %s: %w", group, err)
	}
	if of.Error != nil {
		return nil, nil, fmt.Errorf("committed offsets of %s: %w", group, of.Error)
	}
	committed = map[int]int64{}
	for _, p := range of.Topics[topic] {
		if p.Error != nil {
			return nil, nil, fmt.Errorf("committed offset of %s/%d: %w", topic, p.Partition, p.Error)
		}
		committed[p.Partition] = max(p.CommittedOffset, 0)
	}
	if len(end) != len(parts) {
		return nil, nil, fmt.Errorf("end offsets of %d of %d partitions", len(end), len(parts))
	}
	return committed, end, nil
}

// Scenario 6: reconcile killed with SIGKILL at its failpoints, five times (twice in the short
// form), on a state that needs corrections built through the real pipeline: admissions of a
// user under a team and an org with monthly quotas, then outcomes reported through admit (a
// 503 for a third of the requests, actual tokens for another third). The first kill is after
// the corrections are inserted, the others after a Redis change or after a mark, at a
// pseudo-random row of the run. One clean run then finishes: verify passes, a further run
// applies nothing, every correction is applied once and the counters hold the refunded totals.
func TestKillReconcile(t *testing.T) {
	t.Parallel()
	sc := begin(t, "6 kill -9 reconcile")
	seed := chaosSeed(t, time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	s := newStack(t, options{})
	const (
		org, team, user = "rc-org", "rc-team", "rc-user"
		estimate        = 1000 // tokens per request
	)
	s.account(org, "org", "", "enterprise", map[string]any{
		"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": 100_000_000},
		"tokens":   map[string]any{"quota": 100_000_000_000}})
	s.account(team, "team", org, "", map[string]any{
		"requests": map[string]any{"quota": 10_000_000},
		"tokens":   map[string]any{"quota": 10_000_000_000}})
	key := s.account(user, "user", team, "", map[string]any{})

	requests, kills := pick(400, 3_000), pick(2, 5)
	res := s.load(loadSpec{Requests: requests, Workers: 16, Keys: []string{key}, Deadline: 5 * time.Minute,
		Units: map[string]int64{"requests": 1, "tokens": estimate}})
	require.Equal(t, requests, res.Status[200], "every request is admitted: %v", res.Status)
	b := s.waitBooks(3*time.Minute, res)
	sc.fill(b, res)
	b.requireExact(t, requests)

	// Before any outcome, the counters hold what was admitted.
	ctx := testenv.Context(t, 10*time.Minute)
	for _, acc := range []string{org, team} {
		u := usageOf(t, ctx, s, acc)
		require.Equal(t, int64(requests), u["requests"], "%s requests before reconcile", acc)
		require.Equal(t, int64(requests*estimate), u["tokens"], "%s tokens before reconcile", acc)
	}

	// Outcomes: a 503 for a third, actual tokens (always below the estimate) for another
	// third, nothing for the rest.
	idems := make([]string, 0, len(res.Admitted))
	for idem := range res.Admitted {
		idems = append(idems, idem)
	}
	sort.Strings(idems)
	type outcome struct {
		id     string
		status int
		tokens int64 // actual; 0 when not reported
	}
	var outcomes []outcome
	wantRequests, wantTokens := int64(0), int64(0)
	n503, nSettle := 0, 0
	for i, idem := range idems {
		id := res.Admitted[idem]
		switch i % 3 {
		case 0:
			outcomes = append(outcomes, outcome{id: id, status: 503})
			n503++
		case 1:
			actual := int64(300 + rng.Intn(600)) // 300-899: a settlement of −(1000 − actual)
			outcomes = append(outcomes, outcome{id: id, status: 200, tokens: actual})
			nSettle++
			wantRequests++
			wantTokens += actual
		default:
			wantRequests++
			wantTokens += estimate
		}
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, len(outcomes))
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(outcomes) {
					return
				}
				o := outcomes[i]
				body := map[string]any{"event_id": o.id, "status": o.status}
				if o.tokens > 0 {
					body["units"] = map[string]any{"tokens": o.tokens}
				}
				url := s.admits[(w+i)%len(s.admits)].URL() + "/v1/outcomes"
				status, out, err := call(ctx, "POST", url, serviceToken, body)
				if err != nil || status != 202 {
					errs <- fmt.Errorf("outcome of %s: status %d %v %v", o.id, status, out, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	ids := make([]string, len(outcomes))
	for i, o := range outcomes {
		ids[i] = o.id
	}
	var metered int
	deadline := time.Now().Add(3 * time.Minute)
	for {
		require.NoError(t, s.db.QueryRow(ctx, `select count(*) from usage_outcomes where event_id = any($1)`, ids).Scan(&metered))
		if metered == len(ids) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Equal(t, len(ids), metered, "outcomes in usage_outcomes")

	// The kills: first after the corrections are inserted, then alternately after a Redis
	// change and after a mark, at a pseudo-random row among the first half of what is left.
	points := []string{"after-redis", "after-mark"}
	turn := rng.Intn(2)
	var killedAt []string
	left := -1 // rows the next run has to apply, as the kills left them (unknown before the first)
	for i := range kills {
		dry := reconcileJSON(t, s, nil, "-dry-run")
		require.Positive(t, dry.AdjustmentsPlanned, "kill %d: the dry run plans rows", i+1)
		if left >= 0 {
			require.Equal(t, left, dry.AdjustmentsPlanned, "kill %d: the dry run plans what the killed runs left", i+1)
		}
		fp, k := "after-insert:1", 0
		if i > 0 {
			k = 1 + rng.Intn(max(1, dry.AdjustmentsPlanned/2))
			fp = fmt.Sprintf("%s:%d", points[turn%2], k)
			turn++
		}
		code, out := s.reconcile([]string{"METERGATE_FAILPOINT=" + fp})
		require.Equal(t, -1, code, "reconcile with %s exits by SIGKILL:\n%s", fp, logTail(out, 3000))
		killedAt = append(killedAt, fmt.Sprintf("%s (of %d pending)", fp, dry.AdjustmentsPlanned))
		// Rows are applied one by one, oldest first: killed after the k-th Redis change, k-1
		// rows are marked (the k-th is applied again, as a replay of its marker); after the
		// k-th mark, k; after the insert, none.
		switch {
		case strings.HasPrefix(fp, "after-redis"):
			left = dry.AdjustmentsPlanned - (k - 1)
		case strings.HasPrefix(fp, "after-mark"):
			left = dry.AdjustmentsPlanned - k
		default:
			left = dry.AdjustmentsPlanned
		}
	}
	t.Logf("killed at %s", strings.Join(killedAt, ", "))

	clean := reconcileJSON(t, s, nil)
	require.Equal(t, left, clean.AdjustmentsApplied, "the clean run applies what the killed ones left")
	require.Equal(t, left, clean.Recovered, "all of it rows of the killed runs")
	require.Empty(t, clean.InvariantFailures)
	code, out := s.reconcile(nil, "verify")
	require.Equal(t, 0, code, "reconcile verify:\n%s", out)
	again := reconcileJSON(t, s, nil)
	require.Zero(t, again.AdjustmentsApplied, "a run after the clean one applies nothing")
	require.Zero(t, again.AdjustmentsPlanned)

	// The audit log: every row applied, each correction once, each changed its counter by
	// exactly its amount, and as many rows as the outcomes call for (a refund at both quota
	// levels for requests and tokens, a settlement at both levels for tokens).
	var unapplied, repeated, mismatched, killedRuns int
	require.NoError(t, s.db.QueryRow(ctx, `select count(*) filter (where applied_at is null),
  count(*) filter (where applied_at is not null and redis_after - redis_before <> amount) from adjustments`).Scan(&unapplied, &mismatched))
	require.NoError(t, s.db.QueryRow(ctx, `select count(*) from (
  select 1 from adjustments group by kind, source_event, account, unit, quota_period, period having count(*) > 1) d`).Scan(&repeated))
	require.NoError(t, s.db.QueryRow(ctx, `select count(*) from reconcile_runs where finished_at is null and not dry_run`).Scan(&killedRuns))
	byKind := map[string]int{}
	rows, err := s.db.Query(ctx, `select kind, count(*) from adjustments group by kind`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		var n int
		require.NoError(t, rows.Scan(&k, &n))
		byKind[k] = n
	}
	require.NoError(t, rows.Err())
	sums := map[string]int64{}
	rows, err = s.db.Query(ctx, `select account || ' ' || unit, sum(amount)::bigint from adjustments group by 1`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		var n int64
		require.NoError(t, rows.Scan(&k, &n))
		sums[k] = n
	}
	require.NoError(t, rows.Err())

	final := map[string]map[string]int64{}
	for _, acc := range []string{org, team} {
		final[acc] = usageOf(t, ctx, s, acc)
	}
	sc.Note = fmt.Sprintf("seed %d; killed at %s; then a clean run applied %d (recovered %d), verify exit 0, the next run applied %d; "+
		"%d outcomes (%d × 503, %d with actual tokens); adjustments %v, %d unapplied, %d repeated; org counters requests %d tokens %d (want %d, %d)",
		seed, strings.Join(killedAt, ", "), clean.AdjustmentsApplied, clean.Recovered, again.AdjustmentsApplied,
		len(outcomes), n503, nSettle, byKind, unapplied, repeated, final[org]["requests"], final[org]["tokens"], wantRequests, wantTokens)

	require.Zero(t, unapplied, "rows left unapplied")
	require.Zero(t, repeated, "corrections recorded more than once")
	require.Zero(t, mismatched, "rows whose redis_after - redis_before is not their amount")
	require.Equal(t, kills, killedRuns, "runs that died")
	require.Equal(t, map[string]int{"refund_5xx": 4 * n503, "settle_tokens": 2 * nSettle}, byKind)
	for _, acc := range []string{org, team} {
		require.Equal(t, int64(-n503), sums[acc+" requests"], "%s: requests given back", acc)
		require.Equal(t, wantTokens-int64(requests*estimate), sums[acc+" tokens"], "%s: tokens given back and settled", acc)
		require.Equal(t, wantRequests, final[acc]["requests"], "%s requests counter", acc)
		require.Equal(t, wantTokens, final[acc]["tokens"], "%s tokens counter", acc)
	}
}

// reconcileSummary is the part of reconcile's -json summary the scenarios read.
type reconcileSummary struct {
	RunID              string   `json:"run_id"`
	Recovered          int      `json:"recovered"`
	AdjustmentsPlanned int      `json:"adjustments_planned"`
	AdjustmentsApplied int      `json:"adjustments_applied"`
	InvariantFailures  []string `json:"invariant_failures"`
}

// reconcileJSON runs reconcile -json (with args), requires exit 0 and returns its summary.
func reconcileJSON(t *testing.T, s *stack, env []string, args ...string) reconcileSummary {
	t.Helper()
	code, out := s.reconcile(env, append([]string{"-json"}, args...)...)
	require.Equal(t, 0, code, "reconcile -json %v:\n%s", args, logTail(out, 3000))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var sum reconcileSummary
		if json.Unmarshal([]byte(lines[i]), &sum) == nil && sum.RunID != "" {
			return sum
		}
	}
	t.Fatalf("reconcile -json %v printed no summary:\n%s", args, logTail(out, 3000))
	return reconcileSummary{}
}

// usageOf reads an account's quota counters (used, per unit) through admit's usage API.
func usageOf(t *testing.T, ctx context.Context, s *stack, account string) map[string]int64 {
	t.Helper()
	status, out, err := call(ctx, "GET", s.admits[0].URL()+"/v1/usage/"+account, serviceToken, nil)
	require.NoError(t, err)
	require.Equal(t, 200, status, "usage of %s: %v", account, out)
	units, _ := out["units"].(map[string]any)
	got := map[string]int64{}
	for unit, v := range units {
		u, _ := v.(map[string]any)
		used, ok := u["used"].(float64)
		require.True(t, ok, "usage of %s: %s has no used: %v", account, unit, out)
		got[unit] = int64(used)
	}
	return got
}

// Scenario 7: six admit nodes share one API key of a pro org whose requests are limited by a
// token bucket of 100/s, burst 200. 64 callers send as fast as they can for 3 s, spread
// over the six nodes. The nodes decide in one Redis script on one bucket, so together they
// admit no more than the burst plus the rate over the time the load took; every admitted
// id is in PostgreSQL once.
func TestSixAdmitNodes(t *testing.T) {
	t.Parallel()
	sc := begin(t, "7 six admit nodes, one pro key")
	s := newStack(t, options{Admits: 6})
	const (
		rate    = 100.0
		burst   = 200
		workers = 64
		span    = 3 * time.Second
	)
	key := s.account("pro-org", "org", "", "pro", map[string]any{"requests": map[string]any{"rate_per_s": rate, "burst": burst}})
	l := s.timedLoad(key, workers, span)
	require.Empty(t, l.errs, "requests without an answer")

	elapsed := l.last.Sub(l.first).Seconds()
	accepted := len(l.res.Admitted)
	bound := float64(burst) + rate*elapsed*1.01 + 1
	b := s.waitBooks(3*time.Minute, l.res)
	sc.fill(b, l.res)
	sc.Note = fmt.Sprintf("accepted %d ≤ bound %.0f (burst %d + %.0f/s × %.2f s × 1.01 + 1); %d requests, answers %v; admitted per node %v",
		accepted, bound, burst, rate, elapsed, l.res.Requests, l.res.Status, l.admittedBy)

	require.LessOrEqual(t, float64(accepted), bound, "the six nodes together stay within the bucket")
	require.GreaterOrEqual(t, float64(accepted), 0.8*burst, "the burst is admitted")
	require.Equal(t, l.res.Requests, l.res.Status[200]+l.res.Status[429], "every answer is 200 or 429: %v", l.res.Status)
	require.Zero(t, l.res.FiveXX)
	require.Greater(t, l.res.Status[429], 0, "the load went past the bucket")
	for i, n := range l.answeredBy {
		require.Positive(t, n, "node %d answered", i)
	}
	require.Zero(t, b.Lost, "lost")
	require.Zero(t, b.Duplicated, "duplicated")
	require.Equal(t, accepted, b.Rows)
}

// timedRun is what the callers of a time-bounded load saw.
type timedRun struct {
	res         *loadResult
	first, last time.Time // the first request sent, the last answered
	answeredBy  []int     // answers per admit node
	admittedBy  []int     // 200s per admit node
	errs        []error
}

// timedLoad sends admissions of one unit with key from workers callers, round robin over the
// stack's admit nodes, each request with an idempotency key of its own and no retry, until
// span has passed since the load began; requests under way get their answers.
func (s *stack) timedLoad(key string, workers int, span time.Duration) *timedRun {
	s.t.Helper()
	ctx := testenv.Context(s.t, span+2*time.Minute)
	urls := s.admitURLs()
	run := testenv.Random(8)
	r := &timedRun{res: &loadResult{Admitted: map[string]string{}, Status: map[int]int{}},
		answeredBy: make([]int, len(urls)), admittedBy: make([]int, len(urls))}
	var (
		mu   sync.Mutex
		next atomic.Int64
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < span {
				i := int(next.Add(1)) - 1
				idem := fmt.Sprintf("chaos-%s-%d", run, i)
				node := i % len(urls)
				sent := time.Now()
				status, out, err := call(ctx, "POST", urls[node]+"/v1/admit", serviceToken,
					map[string]any{"api_key": key, "idempotency_key": idem, "units": map[string]any{"requests": 1}})
				answered := time.Now()
				mu.Lock()
				r.res.Requests++
				if r.first.IsZero() || sent.Before(r.first) {
					r.first = sent
				}
				if answered.After(r.last) {
					r.last = answered
				}
				if err != nil {
					r.errs = append(r.errs, fmt.Errorf("request %d to %s: %w", i, urls[node], err))
					mu.Unlock()
					continue
				}
				r.res.Status[status]++
				r.answeredBy[node]++
				if status >= 500 {
					r.res.FiveXX++
				}
				if status == 200 {
					id, _ := out["event_id"].(string)
					r.res.Admitted[idem] = id
					r.admittedBy[node]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return r
}
