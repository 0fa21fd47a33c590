package chaos_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
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

	"github.com/metergate/metergate/internal/testenv"
)

// Scenario 3: the meter killed with SIGKILL five times (twice in the short form) in the
// middle of a batch, during a load, and started again each time. The scenario's meter is the
// test build of cmd/meter, with a failpoint that the test arms at each kill's point of the
// load: the meter, consuming as usual until then, holds in its next batch, in turns after
// the batch's rows are committed in PostgreSQL and before its offsets are (after-write), or
// before any of the batch's rows is written (before-write); the batches behind it are in
// hand either way. Once the meter says it holds there, the test kills it with SIGKILL, while
// the load goes on: every kill lands in a batch, never on a meter with nothing fetched. The
// meter is started again from the committed offsets (the plain binary after the last kill).
// Nothing the killed meter held may be lost (the restarted one reads again from the
// committed offsets) and nothing may be counted twice (the rows written before the kill are
// delivered again and absorbed as duplicates).
func TestKillMeter(t *testing.T) {
	t.Parallel()
	sc := begin(t, "3 kill -9 meter")
	held := testBuild(t, "meter")
	s := newStack(t, options{Meters: 1, MeterEnv: []string{
		"METER_BATCH_SIZE=500", "METER_BATCH_WAIT=3s",
		"METER_SESSION_TIMEOUT=6s", // the killed member's partitions go to its successor after 6 s
	}})
	meter := s.meters[0]
	group := stackEnv(meter.env, "METER_GROUP")
	require.NotEmpty(t, group)
	plain := meter.env
	armDir := t.TempDir()
	armFile := func(i int) string { return filepath.Join(armDir, strconv.Itoa(i)) }
	armed := func(i int) []string { // the environment of the i-th incarnation: its failpoint, unarmed
		return append(append([]string{}, plain...), testenv.ReexecEnv+"=1",
			"METERGATE_FAILPOINT="+meterFailpoints[i%len(meterFailpoints)], "METERGATE_FAILPOINT_ARM="+armFile(i))
	}
	// Before any event: the stack's meter leaves the group and the test build takes its place.
	require.NoError(t, meter.p.Signal(syscall.SIGTERM))
	code, err := meter.p.Wait(time.Minute)
	require.NoError(t, err)
	require.Equal(t, 0, code, "the plain meter stops cleanly:\n%s", logTail(meter.Output(), 3000))
	meter.name, meter.env = held, armed(0)
	meter.Start()
	key := s.account("chaos-org", "org", "", "enterprise", map[string]any{"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000}})

	requests, kills := pick(2_000, 20_000), pick(2, 5)
	interval := requests / (kills + 1)
	// The load slows down (about 30 answers a second) while an armed kill is pending, so that
	// it outlasts the kills; it stops only before its last requests, should the kills still
	// not be done then (a kill there would not be under load, and the test says so).
	const throttle = 30 * time.Millisecond
	stopAt := int64(requests - 50)
	var (
		answered  atomic.Int64
		killsDone atomic.Int64
		killer    = make(chan struct{}) // closed when the kills are over (done or failed)
		done      []meterKill
		injectErr error
		// written and duplicates of each incarnation of the meter, read just before it was killed
		incarnations []meterCounts
	)
	go func() {
		defer close(killer)
		for i := range kills {
			due := int64((i + 1) * interval)
			k, counts, err := killHeldMeter(s, meter, group, meterFailpoints[i%len(meterFailpoints)], armFile(i),
				func() (int64, bool) { n := answered.Load(); return n, n >= due })
			if err != nil {
				injectErr = fmt.Errorf("kill %d: %w", i+1, err)
				return
			}
			done = append(done, k)
			incarnations = append(incarnations, counts)
			meter.env = armed(i + 1)
			if i == kills-1 { // the last one: the plain binary
				meter.name, meter.env = "meter", plain
			}
			if err := meter.start(); err != nil {
				injectErr = fmt.Errorf("restart after kill %d: %w", i+1, err)
				return
			}
			killsDone.Add(1)
		}
	}()
	res := s.load(loadSpec{Requests: requests, Workers: 32, Keys: []string{key}, Deadline: 10 * time.Minute,
		Progress: func(n int) {
			// Runs in a caller's goroutine, under the load's progress lock: no require here.
			answered.Store(int64(n))
			i := killsDone.Load()
			switch {
			case i >= int64(kills):
			case int64(n) >= stopAt:
				<-killer
			case int64(n) >= int64(i+1)*int64(interval): // kill i is armed
				select {
				case <-killer:
				case <-time.After(throttle):
				}
			}
		}})
	<-killer
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
	// reading again from the committed offsets) and before it (the held batch's at
	// after-write, and any other written by the killed one before its commit, delivered
	// again and skipped as duplicates).
	var points, inHand, writtenBefore, rereadAfter, dupAbsorbed, atLoad []string
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
		writtenBefore = append(writtenBefore, fmt.Sprint(rows-after))
		dupAbsorbed = append(dupAbsorbed, fmt.Sprint(next.duplicates))
		atLoad = append(atLoad, fmt.Sprintf("%d/%d", k.answered, requests))
		points = append(points, k.point)
		rereadTotal += after
		require.Positive(t, k.pending, "kill %d: messages in hand (produced, not committed)", i+1)
		require.Less(t, k.answered, stopAt, "kill %d: the load was still running (not stopped before its end to wait for the kill)", i+1)
		require.LessOrEqual(t, rows, int(window), "kill %d: rows of the offsets uncommitted at the kill", i+1)
		if strings.HasPrefix(k.point, "after-write") {
			require.Positive(t, incarnations[i].written, "kill %d: the killed meter had committed a batch before the one it held", i+1)
			// The kill landed between a batch's rows and its offsets: rows written before the
			// kill are of offsets it left uncommitted (delivered again to the restarted meter,
			// which must skip them: the books are exact).
			require.Positive(t, rows-after, "kill %d: rows written by the killed meter whose offsets it had not committed", i+1)
		} else {
			// The kill landed in a batch fetched and not written: its messages were written
			// after the kill, by a restarted meter reading again from the committed offsets.
			require.Positive(t, after, "kill %d: messages uncommitted at the kill were written after it, by a restarted meter", i+1)
		}
		// A restarted meter starts at the committed offsets: it sees again at most what was
		// uncommitted at the kill (a meter that started from the beginning would skip every
		// row written so far).
		require.LessOrEqual(t, next.duplicates, window, "kill %d: the restarted meter read again only from the committed offsets", i+1)
	}
	sc.Note = fmt.Sprintf("%d kills of a meter held in a batch (batches of 500 / 3 s) at %s, at load answers %s; "+
		"uncommitted at each kill %s; of those offsets, rows written before the kill %s and after it %s; duplicates absorbed by the meter after each kill (until its own) %s; "+
		"group committed to the end (%d behind); final answers %v",
		len(done), strings.Join(points, ","), strings.Join(atLoad, ","), strings.Join(inHand, ","), strings.Join(writtenBefore, ","),
		strings.Join(rereadAfter, ","), strings.Join(dupAbsorbed, ","), behind, res.Status)
	require.Equal(t, requests, res.Status[200], "every request is admitted")
	b.requireExact(t, requests)
	require.Zero(t, behind, "the group committed every offset after the last restart")
	require.Positive(t, rereadTotal)
}

// meterFailpoints are the failpoints of the test build of the meter (cmd/meter's
// failpoint_test.go), one per incarnation in turn. Once armed it holds after the rows of
// the second batch it writes and before that batch's offsets (the first is committed: the
// meter was consuming), or before the first batch it is handed has any row written.
var meterFailpoints = []string{"after-write:2", "before-write:1"}

var testBuilds sync.Map // command name → *testBuildOnce

type testBuildOnce struct {
	once sync.Once
	err  error
}

// testBuild builds, once per run, the test build of cmd/<command> (go test -c) beside the
// suite's binaries and returns its name there. Run with testenv.ReexecEnv=1 it is the
// command, with the failpoints of its failpoint_test.go that the plain binary does not
// have: the meter holds at one, reconcile kills itself with SIGKILL at one.
func testBuild(t *testing.T, command string) string {
	t.Helper()
	name := command + "-test-build"
	v, _ := testBuilds.LoadOrStore(command, &testBuildOnce{})
	b := v.(*testBuildOnce)
	b.once.Do(func() {
		out, err := exec.Command("go", "test", "-c", "-o", filepath.Join(bin, name), "../cmd/"+command).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go test -c ../cmd/%s: %w\n%s", command, err, out)
		}
	})
	require.NoError(t, b.err)
	return name
}

// meterKill is one kill of the meter.
type meterKill struct {
	point    string // the failpoint the meter held at
	at       time.Time
	answered int64 // the load's answers when the meter was killed
	pending  int64 // messages produced and not committed when the kill was decided
	// from and to are, per partition, the committed and end offsets right after the kill:
	// what a restarted meter must read again.
	from, to map[int]int64
}

// meterCounts are one meter process's counters.
type meterCounts struct {
	written    int64 // metergate_meter_messages_total
	duplicates int64 // metergate_meter_duplicates_total{table="usage_events"}
}

// killHeldMeter waits (up to 5 minutes) until due says the load reached the kill's point,
// arms the meter's failpoint fp (creates the file arm), then waits (up to 2 minutes) until
// the meter says it holds there, in a batch. It reads the meter's counters and the group's
// positions, kills the meter with SIGKILL and returns the kill; the caller starts the meter
// again.
func killHeldMeter(s *stack, m *node, group, fp, arm string, due func() (int64, bool)) (meterKill, meterCounts, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	wait := func(within time.Duration, what string, cond func() bool) error {
		deadline := time.Now().Add(within)
		for !cond() {
			if time.Now().After(deadline) {
				return fmt.Errorf("not within %s: %s:\n%s", within, what, logTail(m.Output(), 3000))
			}
			time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
		}
		return nil
	}
	if err := wait(5*time.Minute, "the load reaches the kill's point", func() bool { _, ok := due(); return ok }); err != nil {
		return meterKill{}, meterCounts{}, err
	}
	if err := os.WriteFile(arm, nil, 0o600); err != nil {
		return meterKill{}, meterCounts{}, fmt.Errorf("arm the failpoint: %w", err)
	}
	if err := wait(2*time.Minute, "the meter holds at "+fp, func() bool {
		return strings.Contains(m.Output(), "failpoint "+fp+" reached")
	}); err != nil {
		return meterKill{}, meterCounts{}, err
	}
	counts, err := readMeterCounts(ctx, m)
	if err != nil {
		return meterKill{}, counts, err
	}
	committed, end, err := groupPositions(ctx, s.brokers, s.topic, group)
	if err != nil {
		return meterKill{}, counts, err
	}
	k := meterKill{point: fp}
	for p, e := range end {
		k.pending += e - committed[p]
	}
	k.answered, _ = due()
	if err := m.p.Signal(syscall.SIGKILL); err != nil {
		return k, counts, fmt.Errorf("kill the meter: %w", err)
	}
	if _, err := m.p.Wait(30 * time.Second); err != nil {
		return k, counts, fmt.Errorf("the killed meter: %w", err)
	}
	k.at = time.Now()
	// Nobody consumes now: these are the offsets the next meter starts from, and the end of
	// what the killed one could have seen.
	if k.from, k.to, err = groupPositions(ctx, s.brokers, s.topic, group); err != nil {
		return k, counts, err
	}
	return k, counts, nil
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
// 503 for a third of the requests, actual tokens for another third). The kills happen under
// load: a second user of the same team is admitted all the while (paced, so that the load
// outlasts the kills), so the runs read a log that the meter is writing and change counters
// that admissions are charging. The first kill is after the corrections are inserted, the
// others after a Redis change or after a mark, at a pseudo-random row of the run; the killed
// runs are the test build of cmd/reconcile, whose failpoint kills it (the plain binary has
// none). Once the load is over and in the books, one clean run of the plain binary finishes:
// verify passes, a further run applies nothing, every correction is applied once and the
// counters hold the refunded totals plus the load's admissions.
func TestKillReconcile(t *testing.T) {
	t.Parallel()
	sc := begin(t, "6 kill -9 reconcile")
	killing := testBuild(t, "reconcile") // built now: the kills happen under a paced load
	seed := chaosSeed(t, time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	s := newStack(t, options{})
	const (
		org, team, user = "rc-org", "rc-team", "rc-user"
		busy            = "rc-busy" // the user of the load that runs during the kills
		estimate        = 1000      // tokens per request
	)
	s.account(org, "org", "", "enterprise", map[string]any{
		"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": 100_000_000},
		"tokens":   map[string]any{"quota": 100_000_000_000}})
	s.account(team, "team", org, "", map[string]any{
		"requests": map[string]any{"quota": 10_000_000},
		"tokens":   map[string]any{"quota": 10_000_000_000}})
	key := s.account(user, "user", team, "", map[string]any{})
	busyKey := s.account(busy, "user", team, "", map[string]any{})

	requests, kills := pick(400, 3_000), pick(2, 5)
	res := s.load(loadSpec{Requests: requests, Workers: 16, Keys: []string{key}, Deadline: 5 * time.Minute,
		Units: map[string]int64{"requests": 1, "tokens": estimate}})
	require.Equal(t, requests, res.Status[200], "every request is admitted: %v", res.Status)
	b := s.waitBooks(3*time.Minute, res)
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

	// The load that runs while reconcile is killed: one request and estimate tokens each for
	// busy, paced at about 100 a second until the kills are over (then as fast as it goes),
	// and held before its last requests if the kills take longer than it.
	busyRequests := pick(3_000, 10_000)
	var (
		busyAnswered atomic.Int64
		killsOver    = make(chan struct{})
		endKills     = sync.OnceFunc(func() { close(killsOver) })
		busyRes      *loadResult
		busyDone     = make(chan struct{})
	)
	t.Cleanup(func() { // should the test stop early: the load ends while the stack still runs
		endKills()
		select {
		case <-busyDone:
		case <-time.After(time.Minute):
		}
	})
	go func() {
		defer close(busyDone)
		busyRes = s.load(loadSpec{Requests: busyRequests, Workers: 4, Keys: []string{busyKey}, Deadline: 10 * time.Minute,
			Units: map[string]int64{"requests": 1, "tokens": estimate},
			Progress: func(n int) {
				busyAnswered.Store(int64(n))
				if n < busyRequests-100 {
					select {
					case <-killsOver:
					case <-time.After(10 * time.Millisecond):
					}
					return
				}
				select {
				case <-killsOver:
				case <-time.After(5 * time.Minute):
				}
			}})
	}()
	started := time.Now() // the load is under way before the first run
	for busyAnswered.Load() == 0 {
		require.Less(t, time.Since(started), time.Minute, "the load got no answer within a minute")
		time.Sleep(10 * time.Millisecond)
	}

	// The kills: first after the corrections are inserted, then alternately after a Redis
	// change and after a mark, at a pseudo-random row among the first half of what is left.
	points := []string{"after-redis", "after-mark"}
	turn := rng.Intn(2)
	var killedAt, underLoad []string
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
		before := busyAnswered.Load()
		p := testenv.Start(t, filepath.Join(bin, killing), append(append([]string{}, s.env...), testenv.ReexecEnv+"=1", "METERGATE_FAILPOINT="+fp))
		code, err := p.Wait(3 * time.Minute)
		require.NoError(t, err, "reconcile with %s", fp)
		out := p.Output()
		after := busyAnswered.Load()
		require.Equal(t, -1, code, "reconcile with %s exits by SIGKILL:\n%s", fp, logTail(out, 3000))
		killedAt = append(killedAt, fmt.Sprintf("%s (of %d pending)", fp, dry.AdjustmentsPlanned))
		underLoad = append(underLoad, fmt.Sprintf("%d→%d", before, after))
		// The load was answered while this run lived and died, and had not reached its end.
		require.Greater(t, after, before, "kill %d: the load went on while reconcile ran", i+1)
		require.Less(t, after, int64(busyRequests-100), "kill %d: the load was not over, nor held before its end", i+1)
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
	t.Logf("killed at %s; the load's answers during each killed run %s", strings.Join(killedAt, ", "), strings.Join(underLoad, ", "))
	endKills()
	<-busyDone
	require.NotNil(t, busyRes, "the load finished")
	require.Equal(t, busyRequests, busyRes.Status[200], "every request of the load is admitted: %v", busyRes.Status)
	b = s.waitBooks(3*time.Minute, res, busyRes)
	sc.fill(b, res, busyRes)
	b.requireExact(t, requests+busyRequests)

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
	busyTokens := int64(busyRequests) * estimate
	sc.Note = fmt.Sprintf("seed %d; killed at %s, under a load of %d admissions to the same team (answers during each killed run %s); "+
		"then a clean run applied %d (recovered %d), verify exit 0, the next run applied %d; "+
		"%d outcomes (%d × 503, %d with actual tokens); adjustments %v, %d unapplied, %d repeated; org counters requests %d tokens %d (want %d, %d)",
		seed, strings.Join(killedAt, ", "), busyRequests, strings.Join(underLoad, ", "), clean.AdjustmentsApplied, clean.Recovered, again.AdjustmentsApplied,
		len(outcomes), n503, nSettle, byKind, unapplied, repeated, final[org]["requests"], final[org]["tokens"],
		wantRequests+int64(busyRequests), wantTokens+busyTokens)

	require.Zero(t, unapplied, "rows left unapplied")
	require.Zero(t, repeated, "corrections recorded more than once")
	require.Zero(t, mismatched, "rows whose redis_after - redis_before is not their amount")
	require.Equal(t, kills, killedRuns, "runs that died")
	require.Equal(t, map[string]int{"refund_5xx": 4 * n503, "settle_tokens": 2 * nSettle}, byKind)
	for _, acc := range []string{org, team} {
		require.Equal(t, int64(-n503), sums[acc+" requests"], "%s: requests given back", acc)
		require.Equal(t, wantTokens-int64(requests*estimate), sums[acc+" tokens"], "%s: tokens given back and settled", acc)
		require.Equal(t, wantRequests+int64(busyRequests), final[acc]["requests"], "%s requests counter", acc)
		require.Equal(t, wantTokens+busyTokens, final[acc]["tokens"], "%s tokens counter", acc)
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
	b.requireExact(t, accepted)
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
				req := sentRequest{Key: key, Idem: fmt.Sprintf("chaos-%s-%d", run, i), Units: map[string]int64{"requests": 1}}
				node := i % len(urls)
				sent := time.Now()
				status, out, err := call(ctx, "POST", urls[node]+"/v1/admit", serviceToken, req.body())
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
				r.res.record(req, status, out)
				r.answeredBy[node]++
				if status >= 500 {
					r.res.FiveXX++
				}
				if status == 200 {
					r.admittedBy[node]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return r
}
