package chaos_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/admission"
)

// Scenario 14: Redis Cluster with a replica per master, a master SIGKILLed under load. The
// cluster is the scenario's own (3 masters, 3 replicas, AOF appendfsync always,
// cluster-node-timeout 1 s); admit reaches it through REDIS_CLUSTER_ADDRS. The master
// killed serves the shard of three orgs: a rate-only one (fail-open while its shard has no
// master), one with a quota (503 then; its callers retry with the same idempotency key)
// and one whose small quota was spent before the kill. A fourth org, with a quota, lives on
// another master. The replica is promoted and the same admit process (not restarted)
// admits the quota org again through it; its relay drains the promoted master's outbox by
// itself. Every id answered 200 is one row holding what its caller sent; the spent quota
// still refuses after the failover; reconcile and reconcile verify pass; the killed node
// rejoins as a replica.
func TestRedisClusterFailover(t *testing.T) {
	// recoverWithin bounds the wait from the promotion to the killed shard's first 200,
	// and from any admission after it to its row: a few seconds of backoff and slot-map
	// reload, with room for a busy machine.
	const recoverWithin = 15 * time.Second
	t.Parallel()
	sc := begin(t, "14 Redis Cluster failover")
	cluster := testenv.StartRedisCluster(t, 3, 1)
	// REDIS_URL names no server: with REDIS_CLUSTER_ADDRS only its scheme and credentials
	// count.
	s := newStack(t, options{RedisURL: "redis://cluster-named-nodes:6379/0",
		RedisEnv: []string{"REDIS_CLUSTER_ADDRS=" + strings.Join(cluster.Addrs(), ",")}})

	// The orgs' names are picked so that their shards' hash tags land where wanted.
	keys := admission.Keys{Shards: admission.DefaultShards}
	masterOf := func(org string) string { return cluster.MasterOf("{" + strconv.Itoa(keys.Shard(org)) + "}") }
	victim := masterOf("chaos-quota")
	orgOn := func(base string, onVictim bool) string {
		for i := 0; ; i++ {
			org := fmt.Sprintf("%s-%d", base, i)
			if (masterOf(org) == victim) == onVictim {
				return org
			}
		}
	}
	big := map[string]any{"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": 100_000_000}}
	const capQuota = 50
	capped := orgOn("chaos-cap", true)
	rateOnly := s.account(orgOn("chaos-rate", true), "org", "", "enterprise", enterpriseRate)
	quota := s.account("chaos-quota", "org", "", "enterprise", big)
	other := s.account(orgOn("chaos-other", false), "org", "", "enterprise", big)
	capKey := s.account(capped, "org", "", "enterprise", map[string]any{
		"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": capQuota}})

	// The capped org spends its quota before the kill.
	capBefore := s.load(loadSpec{Requests: capQuota + 20, Workers: 4, Keys: []string{capKey}, Units: map[string]int64{"requests": 1}})
	require.Equal(t, capQuota, capBefore.Status[200], "the capped org is admitted up to its quota: %v", capBefore.Status)

	l := s.startLoad(loadSpec{Workers: 8, Keys: []string{rateOnly, quota, other}, Retry5xx: true, Deadline: 4 * time.Minute}, 400)
	l.waitAdmitted(t, 400, 2*time.Minute)
	cluster.KillMaster(victim)
	killedAt := time.Now()
	promoted, err := cluster.WaitPromotion(testenv.Context(t, time.Minute), victim)
	require.NoError(t, err)
	promotedAt := time.Now()
	// Admission goes on through the promoted replica: the quota org, which needs Redis,
	// gets 200s again from the same admit process.
	l.waitAdmitted(t, l.admitted.Load()+pick[int64](400, 4_000), 2*time.Minute)
	res, answers := l.finish(t)
	capAfter := s.load(loadSpec{Requests: 20, Workers: 4, Keys: []string{capKey}, Units: map[string]int64{"requests": 1}})

	var quotaAfter int
	firstQuota := time.Duration(-1) // from the promotion to the quota org's first 200
	for _, a := range answers {
		if a.key == 1 && a.status == 200 && a.sent.After(promotedAt) {
			quotaAfter++
			if d := a.answered.Sub(promotedAt); firstQuota < 0 || d < firstQuota {
				firstQuota = d
			}
		}
	}

	// The books are final once the relay has sent and acknowledged every entry of every
	// master's outbox and the meter has committed the topic's end: what is missing then
	// was lost, not late.
	ctx := testenv.Context(t, 10*time.Minute)
	drainedAt := time.Now()
	for _, m := range cluster.Masters() {
		rdb := redis.NewClient(&redis.Options{Addr: m, MaxRetries: -1})
		waitDrained(ctx, t, rdb, 3*time.Minute)
		_ = rdb.Close()
	}
	drained := time.Since(drainedAt)
	s.waitMetered(ctx, 3*time.Minute)
	b := s.waitBooks(0, capBefore, res, capAfter)
	// The relay of the same admit reads the promoted master's outbox: the quota org's
	// first row of an admission after the promotion, and the longest any of them waited
	// between Redis and PostgreSQL.
	var relayFirst, relayLag time.Duration
	require.NoError(t, s.db.QueryRow(ctx, `select coalesce(min(ingest_time) - $2, '0'), coalesce(max(ingest_time - event_time), '0')
from usage_events where org = $1 and event_time > $2`, s.keys[quota].account, promotedAt).Scan(&relayFirst, &relayLag))
	sc.fill(b, capBefore, res, capAfter)
	code, out := s.reconcile(nil)
	verifyCode, verifyOut := s.reconcile(nil, "verify")
	restartAt := time.Now()
	cluster.Restart(victim)
	rejoined := time.Since(restartAt)
	sc.Note = fmt.Sprintf("master %s SIGKILLed, replica %s promoted %s later; quota org's first 200 after the promotion in %s (%d after it); "+
		"its first row after the promotion %s after it (longest wait Redis → row %s); outboxes drained %s after the load; final answers %v, %d 5xx retried; %d lost, %d duplicated; "+
		"quota spent before the kill admitted %d of 20 after it; reconcile exit %d, verify exit %d; killed node back as a replica in %s",
		victim, promoted, promotedAt.Sub(killedAt).Round(time.Millisecond), firstQuota.Round(time.Millisecond), quotaAfter,
		relayFirst.Round(time.Millisecond), relayLag.Round(time.Millisecond), drained.Round(time.Millisecond), res.Status, res.FiveXX, b.Lost, b.Duplicated, capAfter.Status[200], code, verifyCode,
		rejoined.Round(time.Millisecond))
	t.Log(sc.Note)

	require.Positive(t, quotaAfter, "the quota org is admitted through Redis after the promotion, admit not restarted")
	// By itself, and soon: go-redis alone would notice the promotion at its next periodic
	// slot-map reload, up to a minute later (config.ClusterStateReload).
	require.Less(t, firstQuota, recoverWithin, "admission of the killed master's shard resumes soon after the promotion")
	require.Less(t, relayLag, recoverWithin, "the relay reads the promoted master's outbox soon after the promotion")
	require.Equal(t, res.Requests, res.Status[200], "every request is admitted in the end")
	require.Zero(t, res.Mismatched, "no retry of an admitted request got another event id")
	b.requireExact(t, len(capBefore.Admitted)+len(res.Admitted)+len(capAfter.Admitted))
	require.Zero(t, capAfter.Status[200], "the quota spent before the kill refuses after the failover")
	require.Equal(t, 0, code, "reconcile:\n%s", out)
	require.Equal(t, 0, verifyCode, "reconcile verify:\n%s", verifyOut)
}
