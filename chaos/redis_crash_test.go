package chaos_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
)

// Scenario 12: Redis killed (SIGKILL, no draining first) under load while the outbox holds
// events the relay has not sent, and started again from its append-only file. The stack's
// private Kafka broker is stopped first, so the relay (inside admit) is stuck retrying a
// batch and every admission since is an undrained outbox entry when Redis dies. Admit is
// killed with it (as when their host dies), so the batch the relay held in memory is gone
// too: what reaches Kafka afterwards is what Redis recovered. The load goes on through the
// crash (callers retry 503s and refused connections with the same idempotency key), then
// the broker comes back and the backlog drains.
//
// The guarantee is measured with `appendfsync always`: Redis writes and fsyncs the AOF
// before it answers the script, so an event admit answered 200 for survives the crash,
// with its counter charge and its idempotency record. The same crash is run with
// `appendfsync everysec` and with no persistence and what they lost is printed in the
// row's note, not asserted to be 0: without persistence every undrained entry (and every
// counter) is gone although its caller was told 200 — the check must see that loss.
// A quota exhausted before the crash must still refuse after it; `reconcile verify` must
// pass.
func TestRedisKilledMidOutbox(t *testing.T) {
	t.Parallel()
	sc := begin(t, "12 Redis killed mid-outbox")
	broker := private.StartBroker(t)

	var always *redisCrash
	notes := []string{}
	// The short form (make test) crashes with the guarantee and without persistence, whose
	// loss the check must see; the full form measures everysec too.
	for _, fsync := range pick([]string{"always", ""}, []string{"always", "everysec", ""}) {
		name := fsync
		if name == "" {
			name = "none"
		}
		t.Run(name, func(t *testing.T) {
			c := runRedisCrash(t, broker, fsync)
			notes = append(notes, c.note())
			switch fsync {
			case "always":
				always = c
				c.books.requireExact(t, c.admitted())
				require.Zero(t, c.capAfter, "the exhausted quota admits nothing after the restart: its counter survived")
				require.Equal(t, 0, c.verifyBefore, "reconcile verify right after the crash:\n%s", c.verifyOut)
				require.Zero(t, c.drift, "reconcile finds no counter below its rows")
			case "":
				// No persistence: the undrained entries die with Redis. The check sees it.
				require.Positive(t, c.books.Lost, "without persistence the undrained events are lost, and counted")
			}
			require.Equal(t, 0, c.reconcileCode, "reconcile:\n%s", c.reconcileOut)
			require.Equal(t, 0, c.verifyAfter, "reconcile verify after reconcile")
		})
	}
	if always != nil {
		sc.fill(always.books, always.loads...)
	}
	sc.Note = strings.Join(notes, "; ")
}

// redisCrash is what one crash of a private Redis under load cost.
type redisCrash struct {
	fsync     string // appendfsync, "" for no persistence
	undrained int64  // outbox entries just before the kill
	restored  int64  // outbox entries once Redis was back
	loads     []*loadResult
	books     books
	// capAfter counts requests of the org whose quota was exhausted before the crash
	// admitted after it.
	capAfter, capQuota int
	// exits of reconcile verify before reconcile, reconcile, verify after it.
	verifyBefore, reconcileCode, verifyAfter int
	drift                                    int // reconcile's drift_found
	verifyOut, reconcileOut                  string
	down                                     time.Duration // SIGKILL to PING answered
}

func (c *redisCrash) admitted() int {
	n := 0
	for _, l := range c.loads {
		n += len(l.Admitted)
	}
	return n
}

func (c *redisCrash) note() string {
	name := "AOF " + c.fsync
	if c.fsync == "" {
		name = "no persistence"
	}
	return fmt.Sprintf("%s: %d undrained outbox entries at the kill, %d after the restart (down %s); %d admitted, "+
		"%d lost, %d duplicated; quota exhausted before the crash admitted %d of %d after it; verify exit %d, "+
		"reconcile exit %d (drift_found=%d), verify exit %d",
		name, c.undrained, c.restored, c.down.Round(time.Millisecond), c.admitted(), c.books.Lost, c.books.Duplicated,
		c.capAfter, c.capQuota, c.verifyBefore, c.reconcileCode, c.drift, c.verifyAfter)
}

// runRedisCrash runs the crash on a stack of its own with a private Redis of the given
// appendfsync ("" for none) and the shared private broker, and returns what it cost.
func runRedisCrash(t *testing.T, broker *private.Broker, fsync string) *redisCrash {
	var rs *private.RedisServer
	if fsync == "" {
		rs = private.StartRedis(t)
	} else {
		rs = private.StartRedisAOF(t, fsync)
	}
	s := newStack(t, options{RedisURL: rs.URL(), Brokers: []string{broker.Addr()}})
	c := &redisCrash{fsync: fsync, capQuota: 50}
	// Both orgs have a quota, so that no admission takes the fail-open path while Redis
	// is down: every 200 went through the script and its outbox entry.
	quota := s.account("chaos-quota", "org", "", "enterprise", map[string]any{
		"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": 100_000_000}})
	team := s.account("chaos-team", "team", "chaos-quota", "", map[string]any{})
	capped := s.account("chaos-cap", "org", "", "enterprise", map[string]any{
		"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": c.capQuota}})
	keys := []string{quota, team}
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := testenv.Context(t, 10*time.Minute)

	// The capped org spends its quota before the crash.
	capBefore := s.load(loadSpec{Requests: c.capQuota + 20, Workers: 4, Keys: []string{capped}, Units: map[string]int64{"requests": 1}})
	require.Equal(t, c.capQuota, capBefore.Status[200], "the capped org is admitted up to its quota: %v", capBefore.Status)
	c.loads = append(c.loads, capBefore)

	l := s.startLoad(loadSpec{Workers: 8, Keys: keys, Retry5xx: true, Deadline: 6 * time.Minute}, 400)
	l.waitAdmitted(t, 200, 2*time.Minute)
	broker.Stop() // the relay can no longer send: the outbox fills
	l.waitAdmitted(t, l.admitted.Load()+int64(pick(400, 2_000)), 2*time.Minute)
	c.undrained = outboxLen(ctx, t, rdb)
	killed := time.Now()
	rs.Stop()          // SIGKILL
	s.admits[0].Kill() // and the relay with its batch in memory: only what Redis kept is left
	rs.Start()
	c.down = time.Since(killed)
	s.admits[0].Start()
	c.restored = outboxLen(ctx, t, rdb)
	l.waitAdmitted(t, l.admitted.Load()+200, 2*time.Minute) // admissions resume
	res, _ := l.finish(t)
	c.loads = append(c.loads, res)
	capAfter := s.load(loadSpec{Requests: 20, Workers: 4, Keys: []string{capped}, Units: map[string]int64{"requests": 1}})
	c.capAfter = capAfter.Status[200]
	c.loads = append(c.loads, capAfter)
	broker.Start()

	// The books are final once the relay has sent and acknowledged every entry Redis holds
	// and the meter has committed every message of the topic (it commits after the rows):
	// what is missing then was lost, not late.
	waitDrained(ctx, t, rdb, "*", 3*time.Minute)
	s.waitMetered(ctx, 3*time.Minute)
	c.books = s.waitBooks(0, c.loads...)
	c.verifyBefore, c.verifyOut = s.reconcile(nil, "verify")
	c.reconcileCode, c.reconcileOut = s.reconcile(nil)
	c.drift = -1
	if m := regexp.MustCompile(`drift_found=(\d+)`).FindStringSubmatch(c.reconcileOut); m != nil {
		c.drift, _ = strconv.Atoi(m[1])
	}
	c.verifyAfter, _ = s.reconcile(nil, "verify")
	t.Log(c.note())
	require.Zero(t, res.Mismatched, "no retry of an admitted request got another event id")
	return c
}

// outboxStream matches the key of a shard's outbox stream (keyspace.Keys.Outboxes), and
// not the other streams beside it (an org's refusal log, <prefix>{N}:r:<org>).
var outboxStream = regexp.MustCompile(`\{[0-9]+\}:(batches|events)$`)

// outboxLen is the number of entries in the outbox streams of a private Redis.
func outboxLen(ctx context.Context, t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	var n int64
	iter := rdb.ScanType(ctx, 0, "*", 100, "stream").Iterator()
	for iter.Next(ctx) {
		if !outboxStream.MatchString(iter.Val()) {
			continue
		}
		l, err := rdb.XLen(ctx, iter.Val()).Result()
		require.NoError(t, err)
		n += l
	}
	require.NoError(t, iter.Err())
	return n
}

// waitDrained polls until every consumer group of every outbox stream whose key matches
// match has nothing pending and nothing left to read: the relay sent and acknowledged it
// all.
func waitDrained(ctx context.Context, t *testing.T, rdb *redis.Client, match string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		left, last := int64(0), ""
		iter := rdb.ScanType(ctx, 0, match, 100, "stream").Iterator()
		for iter.Next(ctx) {
			if !outboxStream.MatchString(iter.Val()) {
				continue
			}
			groups, err := rdb.XInfoGroups(ctx, iter.Val()).Result()
			require.NoError(t, err)
			if len(groups) == 0 {
				left++
				last = iter.Val() + ": no consumer group"
			}
			for _, g := range groups {
				if g.Pending > 0 || g.Lag != 0 {
					left++
					last = fmt.Sprintf("%s: group %s pending %d lag %d", iter.Val(), g.Name, g.Pending, g.Lag)
				}
			}
		}
		require.NoError(t, iter.Err())
		if left == 0 {
			return
		}
		require.False(t, time.Now().After(deadline), "the outbox is not drained after %s (%s)", within, last)
		time.Sleep(100 * time.Millisecond)
	}
}

// waitMetered polls until the stack's meter group has committed the end offset of every
// partition of the stack's topic: every message sent so far is a row (or a dead letter).
func (s *stack) waitMetered(ctx context.Context, within time.Duration) {
	s.t.Helper()
	group := ""
	for _, kv := range s.meters[0].env {
		if v, ok := strings.CutPrefix(kv, "METER_GROUP="); ok {
			group = v
		}
	}
	require.NotEmpty(s.t, group, "the meter's group")
	client := &kafka.Client{Addr: kafka.TCP(s.brokers...), Timeout: 5 * time.Second}
	deadline := time.Now().Add(within)
	for {
		behind, err := groupLag(ctx, client, s.topic, group)
		if err == nil && behind == 0 {
			return
		}
		require.False(s.t, time.Now().After(deadline), "the meter has not committed the topic's end after %s: %d behind, %v", within, behind, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// groupLag is how many messages of topic group has not committed.
func groupLag(ctx context.Context, client *kafka.Client, topicName, group string) (int64, error) {
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topicName}})
	if err != nil {
		return 0, fmt.Errorf("metadata: %w", err)
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		return 0, fmt.Errorf("metadata of %s: %v", topicName, meta.Topics)
	}
	var parts []int
	var last []kafka.OffsetRequest
	for _, p := range meta.Topics[0].Partitions {
		parts = append(parts, p.ID)
		last = append(last, kafka.LastOffsetOf(p.ID))
	}
	ends, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topicName: last}})
	if err != nil {
		return 0, fmt.Errorf("list offsets: %w", err)
	}
	committed, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topicName: parts}})
	if err != nil {
		return 0, fmt.Errorf("offset fetch: %w", err)
	}
	at := map[int]int64{}
	for _, p := range committed.Topics[topicName] {
		if p.Error != nil {
			return 0, fmt.Errorf("offset fetch of partition %d: %w", p.Partition, p.Error)
		}
		at[p.Partition] = p.CommittedOffset
	}
	var behind int64
	for _, p := range ends.Topics[topicName] {
		if p.Error != nil {
			return 0, fmt.Errorf("end offset of partition %d: %w", p.Partition, p.Error)
		}
		if p.LastOffset > 0 {
			behind += p.LastOffset - max(at[p.Partition], 0)
		}
	}
	return behind, nil
}
