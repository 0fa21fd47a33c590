package chaos_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/failover"
)

// Scenarios 15 and 16: the 3-node Kafka cluster (`make up-kafka-cluster`: replication 3,
// min.insync.replicas 2) loses brokers under load. The stack's topic has three replicas of
// each partition there; the relay produces with acks=all. Both scenarios kill nodes of the
// shared cluster: they are not parallel, and failover.KafkaCluster hands the cluster to one
// test at a time and leaves it whole and in sync when the test ends.

// clusterOrgs is how many rate-only orgs the load spreads over: the topic is keyed by org,
// so that many orgs put events on most of the partitions, whoever leads them.
const clusterOrgs = 12

// clusterWorkers is the number of callers of the scenarios' loads.
const clusterWorkers = 8

// clusterStack is a stack on the Kafka cluster: 6 partitions of 3 replicas, clusterOrgs
// rate-only orgs (admission never needs Kafka, nor fails open: Redis is up).
func clusterStack(t *testing.T, cluster *failover.BrokerCluster) (*stack, []string) {
	t.Helper()
	s := newStack(t, options{Brokers: cluster.Addrs, Partitions: 6, Replication: 3})
	keys := make([]string, clusterOrgs)
	for i := range keys {
		keys[i] = s.account(fmt.Sprintf("chaos-org-%d", i), "org", "", "enterprise", enterpriseRate)
	}
	return s, keys
}

// Scenario 15: the broker leading the most partitions of the stack's topic SIGKILLed under
// load and started again 15 s later (the full form and the short one alike). The other two
// elect new leaders; the relay (inside admit) and the meter, never restarted, follow them:
// an event admitted after the kill lands on a partition the killed node led while it is
// down, and once it is back every id answered 200 is one row with its caller's account
// and units. (The topic is keyed by org: the victim is the node leading the most of the
// partitions that hold rows before the kill.) When the killed
// node was also the active controller, fencing it and moving its partitions can take most
// of the 15 s (broker.session.timeout.ms is 9 s): the broker then stays down until the
// first event admitted after the kill has landed (at most 2 minutes), so that it is the
// relay and the meter that recovered, not the broker that came back; the note says when.
func TestKafkaLeaderKilled(t *testing.T) {
	sc := begin(t, "15 Kafka leader broker killed")
	cluster := failover.KafkaCluster(t)
	s, keys := clusterStack(t, cluster)
	admit, meter := s.admits[0].p, s.meters[0].p
	ctx := testenv.Context(t, 10*time.Minute)
	gap := 15 * time.Second

	l := s.startLoad(loadSpec{Workers: clusterWorkers, Keys: keys, Retry5xx: true, Deadline: 6 * time.Minute}, 200)
	l.waitAdmitted(t, 200, 2*time.Minute)
	// The partitions the orgs' events go to: those holding rows once 200 of the load are.
	for s.rowsOf(ctx, subtract(l.admittedIDs(), nil)) < 200 {
		require.NoError(t, ctx.Err(), "200 rows of the load before the kill")
		time.Sleep(50 * time.Millisecond)
	}
	used := s.partitionsWithRows(ctx)
	before, err := cluster.Leaders(ctx, s.topic)
	require.NoError(t, err)
	victim := mostLeader(only(before, used))
	lost := only(before, used)[victim] // the partitions with traffic that lose their leader
	require.NotEmpty(t, lost, "a node leads a partition with rows: %v, rows on %v", before, used)
	admittedBefore := l.admittedIDs()
	cluster.Kill(victim)
	killed := time.Now()

	// The other two take over the victim's partitions.
	var after map[int][]int
	for {
		after, err = cluster.Leaders(ctx, s.topic)
		if err == nil && len(after[victim]) == 0 && len(after[0]) == 0 {
			break
		}
		require.NoError(t, ctx.Err(), "the partitions of node %d got no new leader (last: %v, %v)", victim, after, err)
		time.Sleep(50 * time.Millisecond)
	}
	moved := time.Since(killed)
	t.Logf("node %d killed; its partitions led by others %s later: %v", victim, moved.Round(time.Millisecond), after)
	// An event admitted after the kill lands on a partition the victim led, while it is
	// still down: the relay and the meter found the new leader (and the group its
	// coordinator) by themselves.
	firstRow := s.waitNewRow(ctx, l, admittedBefore, lost, killed, 2*time.Minute)
	require.Positive(t, firstRow, "an event admitted after the kill is a row of partitions %v within 2 minutes, node %d still down", lost, victim)
	time.Sleep(time.Until(killed.Add(gap)))
	startAt := time.Now()
	downFor := startAt.Sub(killed)
	cluster.Start(victim, s.topic)
	started := time.Since(startAt)
	l.waitAdmitted(t, l.admitted.Load()+200, 2*time.Minute) // and a load after it
	res, answers := l.finish(t)

	afterKill := 0
	for _, a := range answers {
		if a.status == 200 && a.sent.After(killed) {
			afterKill++
		}
	}
	b := s.waitBooks(4*time.Minute, res)
	sc.fill(b, res)
	sc.Note = fmt.Sprintf("node %d (leader of partitions %v of %v, those with rows %v) SIGKILLed, its partitions led by others %s later (%v); "+
		"first event admitted after the kill a row of partitions %v %s after it; node %d started again %s after the kill, serving and in sync in %s; "+
		"%d admitted after the kill; final answers %v, %d 5xx retried",
		victim, before[victim], before, used, moved.Round(time.Millisecond), after, lost, firstRow.Round(time.Millisecond),
		victim, downFor.Round(time.Millisecond), started.Round(time.Millisecond), afterKill, res.Status, res.FiveXX)

	requireSameProcess(t, s.admits[0], admit, "admit (and its relay)")
	requireSameProcess(t, s.meters[0], meter, "the meter")
	require.Positive(t, afterKill, "admissions after the kill")
	require.Equal(t, res.Requests, res.Status[200], "every request is admitted")
	b.requireExact(t, res.Requests)
}

// Scenario 16: two of the three brokers SIGKILLed under load, one after the other: every
// partition is below min.insync.replicas (or without a leader), so no acks=all write
// succeeds. Admission goes on (rate-only orgs: it never waits for Kafka), the outbox in
// Redis holds the events, and no event admitted during the outage is a row. Then both
// brokers start again: the relay sends the backlog and every id answered 200 is one row
// with its caller's account and units, the relay and the meter never restarted.
func TestKafkaBelowMinISR(t *testing.T) {
	sc := begin(t, "16 Kafka below min ISR")
	cluster := failover.KafkaCluster(t)
	s, keys := clusterStack(t, cluster)
	admit, meter := s.admits[0].p, s.meters[0].p
	ctx := testenv.Context(t, 10*time.Minute)
	rdb := s.redis()
	outage := pick(10*time.Second, 30*time.Second)

	l := s.startLoad(loadSpec{Workers: clusterWorkers, Keys: keys, Retry5xx: true, Deadline: 6 * time.Minute}, 200)
	l.waitAdmitted(t, 200, 2*time.Minute)
	leaders, err := cluster.Leaders(ctx, s.topic)
	require.NoError(t, err)
	first := mostLeader(leaders)
	second := first%3 + 1
	cluster.Kill(first)
	cluster.Kill(second)
	killed := time.Now()
	// Admissions answered from a moment after the second kill cannot have been produced
	// before it.
	time.Sleep(time.Second)
	outboxAtStart := s.outboxLen(ctx, rdb)
	idsAtStart := l.admittedIDs()
	admittedAtStart := l.admitted.Load()
	time.Sleep(time.Until(killed.Add(outage)))
	// Counted before the outbox is measured: every admission counted was in the outbox by
	// then (the script writes the entry before admit answers). At the start it was the
	// other way round, so only the callers under way then are uncounted slack.
	admittedDuring := l.admitted.Load() - admittedAtStart
	outboxAtEnd := s.outboxLen(ctx, rdb)
	during := subtract(l.admittedIDs(), idsAtStart)
	landed := s.rowsOf(ctx, during)

	up := time.Now()
	cluster.StartAll(s.topic)
	started := time.Since(up)
	l.waitAdmitted(t, l.admitted.Load()+200, 2*time.Minute)
	res, _ := l.finish(t)
	b := s.waitBooks(4*time.Minute, res)
	drained := s.outboxLen(ctx, rdb)
	sc.fill(b, res)
	sc.Note = fmt.Sprintf("nodes %d and %d SIGKILLed for %s (node 3 of 3 alone): %d admitted while they were down "+
		"(%.0f/s), outbox %d → %d entries, %d of those events a row before the restart; both back and in sync in %s; "+
		"outbox %d entries once the books were whole; final answers %v, %d 5xx retried",
		first, second, outage, admittedDuring, float64(admittedDuring)/outage.Seconds(), outboxAtStart, outboxAtEnd,
		landed, started.Round(time.Millisecond), drained, res.Status, res.FiveXX)

	requireSameProcess(t, s.admits[0], admit, "admit (and its relay)")
	requireSameProcess(t, s.meters[0], meter, "the meter")
	require.GreaterOrEqual(t, admittedDuring, int64(5*outage.Seconds()), "admissions while two brokers were down")
	// Every event admitted during the outage is still in the outbox at its end: no write
	// was acknowledged (with acks=1 the partitions node 3 leads would take theirs, and the
	// relay would acknowledge and trim them). The callers under way when the outbox was
	// first measured are the slack.
	require.GreaterOrEqual(t, outboxAtEnd-outboxAtStart, admittedDuring-int64(clusterWorkers),
		"the outbox holds every event admitted while no write could reach min.insync.replicas")
	require.Zero(t, landed, "rows for events admitted while two brokers were down (acks=all must have failed)")
	require.Equal(t, res.Requests, res.Status[200], "every request is admitted")
	b.requireExact(t, res.Requests)
}

// only keeps the partitions of leaders that are in keep.
func only(leaders map[int][]int, keep []int) map[int][]int {
	out := map[int][]int{}
	for id, ps := range leaders {
		for _, p := range ps {
			if slices.Contains(keep, p) {
				out[id] = append(out[id], p)
			}
		}
	}
	return out
}

// partitionsWithRows are the Kafka partitions the stack's rows were read from.
func (s *stack) partitionsWithRows(ctx context.Context) []int {
	s.t.Helper()
	rows, err := s.db.Query(ctx, `select distinct kafka_partition from usage_events order by 1`)
	require.NoError(s.t, err)
	ps, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(s.t, err)
	return ps
}

// mostLeader is the node leading the most partitions (the lowest id of a tie).
func mostLeader(leaders map[int][]int) int {
	best := 0
	for id := 1; id <= 3; id++ {
		if best == 0 || len(leaders[id]) > len(leaders[best]) {
			best = id
		}
	}
	return best
}

// requireSameProcess fails unless n still runs the process p, which has not exited.
func requireSameProcess(t *testing.T, n *node, p *testenv.Process, what string) {
	t.Helper()
	require.Same(t, p, n.p, "%s was restarted", what)
	_, err := p.Wait(time.Millisecond)
	require.Error(t, err, "%s exited:\n%s", what, p.Output())
}

// admittedIDs is the set of event ids of the load answered 200 so far.
func (l *runningLoad) admittedIDs() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.res.ids()
}

func subtract(a, b map[string]bool) []string {
	var out []string
	for id := range a {
		if !b[id] {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// rowsOf counts the stack's rows of ids.
func (s *stack) rowsOf(ctx context.Context, ids []string) int {
	s.t.Helper()
	var n int
	require.NoError(s.t, s.db.QueryRow(ctx, `select count(*) from usage_events where event_id = any($1)`, ids).Scan(&n))
	return n
}

// waitNewRow polls (up to within) until an event the load admitted that is not in old is a
// row read from one of partitions, and returns how long after from that was; 0 when none
// was.
func (s *stack) waitNewRow(ctx context.Context, l *runningLoad, old map[string]bool, partitions []int, from time.Time, within time.Duration) time.Duration {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		var n int
		require.NoError(s.t, s.db.QueryRow(ctx, `select count(*) from usage_events where event_id = any($1) and kafka_partition = any($2)`,
			subtract(l.admittedIDs(), old), partitions).Scan(&n))
		if n > 0 {
			return time.Since(from)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0
}

// redis is a client of the stack's Redis.
func (s *stack) redis() *redis.Client {
	s.t.Helper()
	opts, err := redis.ParseURL(s.setting("REDIS_URL"))
	require.NoError(s.t, err)
	rdb := redis.NewClient(opts)
	s.t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// setting is the value of an environment variable every binary of the stack gets.
func (s *stack) setting(name string) string {
	v := ""
	for _, kv := range s.env {
		if x, ok := strings.CutPrefix(kv, name+"="); ok {
			v = x // the last of a name is the one a process sees
		}
	}
	return v
}

// outboxLen is the number of entries in the stack's outbox streams (the streams under its
// key prefix): what the relay has not yet sent and trimmed.
func (s *stack) outboxLen(ctx context.Context, rdb *redis.Client) int64 {
	s.t.Helper()
	prefix := s.setting("ADMIT_KEY_PREFIX")
	require.NotEmpty(s.t, prefix)
	var n int64
	iter := rdb.ScanType(ctx, 0, prefix+"*", 1000, "stream").Iterator()
	for iter.Next(ctx) {
		if !outboxStream.MatchString(iter.Val()) {
			continue
		}
		l, err := rdb.XLen(ctx, iter.Val()).Result()
		require.NoError(s.t, err)
		n += l
	}
	require.NoError(s.t, iter.Err())
	return n
}
