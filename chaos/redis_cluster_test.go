package chaos_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
)

// Scenario 14: Redis Cluster with replicas, a master SIGKILLed under load. The cluster is
// the scenario's own (3 masters with 2 replicas each, AOF appendfsync always,
// cluster-node-timeout 1 s); admit reaches it through REDIS_CLUSTER_ADDRS and answers a
// decision only once a replica holds it (ADMIT_REDIS_WAIT_REPLICAS=1; two replicas per
// master, so that the promoted one still has a replica to wait for). The master killed
// serves the shard of three orgs: a rate-only one (fail-open while its shard has no
// master), one with a quota (503 then; its callers retry with the same idempotency key)
// and one whose small quota was spent before the kill. A fourth org, with a quota, lives
// on another master. A replica is promoted and the same admit process (not restarted)
// admits the quota org again through it; its relay drains the promoted master's outbox by
// itself, soon (admission within 15 s of the promotion, nothing left pending). Every id
// answered 200 is one row holding what its caller sent, and none is voided; a row no
// caller was told must be voided (a decision answered 503 because no replica acknowledged
// it in time); the spent quota still refuses after the failover; reconcile and reconcile
// verify pass; the killed node rejoins as a replica.
//
// The kill is run twice: with the replicas in sync, and with both replicas' links cut
// 500 ms before it, so that the promoted replica lacks the master's last writes. The full
// form also runs the second without WAIT and prints what it lost, without asserting it.
func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	sc := begin(t, "14 Redis Cluster failover")
	variants := []clusterFailover{{name: "in sync", wait: true}, {name: "replicas behind", wait: true, behind: true}}
	if full {
		variants = append(variants, clusterFailover{name: "replicas behind, no WAIT", behind: true})
	}
	var notes []string
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			v.run(t)
			notes = append(notes, v.note())
			if !v.wait {
				// Measured, not asserted: without WAIT the promoted replica may lack
				// events told 200 (lost), never duplicates.
				require.Zero(t, v.books.Duplicated, "duplicated")
				return
			}
			sc.fill(v.books, v.loads...) // the scoreboard's row: the runs with the guarantee
			v.books.requireExact(t, v.admitted())
			require.Zero(t, v.capAfter, "the quota spent before the kill refuses after the failover")
			require.Equal(t, 0, v.reconcileCode, "reconcile:\n%s", v.reconcileOut)
			require.Equal(t, 0, v.verifyCode, "reconcile verify:\n%s", v.verifyOut)
		})
	}
	sc.Note = strings.Join(notes, "; ")
}

// recoverWithin bounds the wait from the promotion to the killed shard's first 200, and
// from any admission after it to its row: slot-map reload (config.ClusterStateReload), a
// replica's resync and the relay's backoff, with room for a busy machine.
const recoverWithin = 15 * time.Second

// clusterFailover is one kill of a master of a private cluster under load, and what it
// cost.
type clusterFailover struct {
	name   string
	wait   bool // ADMIT_REDIS_WAIT_REPLICAS=1
	behind bool // the killed master's replicas cut off 500 ms before the kill

	killed, promoted string
	promotion        time.Duration // SIGKILL to the replica serving the slots
	firstQuota       time.Duration // promotion to the quota org's first 200
	quotaAfter       int           // the quota org's 200s sent after the promotion
	relayFirst       time.Duration // promotion to the quota org's first row admitted after it
	relayLag         time.Duration // longest event time to row of those rows
	rejoined         time.Duration // restart of the killed node to an in-sync replica
	drained          time.Duration // end of the load to every outbox relayed and acknowledged
	notReplicated    int           // script calls short of a replica's acknowledgement (WAIT)
	failOpen         int           // rate-only admissions written straight to Kafka
	loads            []*loadResult
	res              *loadResult // the load through the kill
	books            books
	odd              []string // the rows told 200 and voided, and those told to nobody not voided
	capAfter         int      // 200s of the spent quota's org after the kill (of 20)
	// exits of reconcile and reconcile verify.
	reconcileCode, verifyCode int
	reconcileOut, verifyOut   string
}

func (v *clusterFailover) admitted() int {
	n := 0
	for _, l := range v.loads {
		n += len(l.Admitted)
	}
	return n
}

func (v *clusterFailover) note() string {
	return fmt.Sprintf("%s: %s SIGKILLed, %s promoted %s later; the quota org's first 200 %s after the promotion (%d after it), "+
		"its first row %s after it (longest Redis → row %s); outboxes drained %s after the load; final answers %v, %d 5xx retried (%d calls not replicated in time, %d fail-open); %d admitted, %d lost, "+
		"%d duplicated, %d voided rows told to nobody; spent quota admitted %d of 20 after the kill; reconcile exit %d, "+
		"verify exit %d; killed node an in-sync replica %s after its restart",
		v.name, v.killed, v.promoted, v.promotion.Round(time.Millisecond), v.firstQuota.Round(time.Millisecond), v.quotaAfter,
		v.relayFirst.Round(time.Millisecond), v.relayLag.Round(time.Millisecond), v.drained.Round(time.Millisecond), v.res.Status, v.res.FiveXX, v.notReplicated, v.failOpen, v.admitted(),
		v.books.Lost, v.books.Duplicated, v.books.Voided, v.capAfter, v.reconcileCode, v.verifyCode, v.rejoined.Round(time.Millisecond))
}

func (v *clusterFailover) run(t *testing.T) {
	cluster := private.StartRedisCluster(t, 3, 2)
	var admitEnv []string
	if v.wait {
		admitEnv = []string{"ADMIT_REDIS_WAIT_REPLICAS=1"}
	}
	// REDIS_URL names no server: the binaries refuse one beside REDIS_CLUSTER_ADDRS.
	s := newStack(t, options{AdmitEnv: admitEnv,
		RedisEnv: []string{"REDIS_URL=", "REDIS_CLUSTER_ADDRS=" + strings.Join(cluster.Addrs(), ",")}})

	// The orgs' names are picked so that their shards' hash tags land where wanted.
	keys := keyspace.Keys{Shards: keyspace.DefaultShards}
	masterOf := func(org string) string { return cluster.MasterOf("{" + strconv.Itoa(keys.Shard(org)) + "}") }
	v.killed = masterOf("chaos-quota")
	orgOn := func(base string, onKilled bool) string {
		for i := 0; ; i++ {
			org := fmt.Sprintf("%s-%d", base, i)
			if (masterOf(org) == v.killed) == onKilled {
				return org
			}
		}
	}
	big := map[string]any{"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": 100_000_000}}
	const capQuota = 50
	rateOnly := s.account(orgOn("chaos-rate", true), "org", "", "enterprise", enterpriseRate)
	quota := s.account("chaos-quota", "org", "", "enterprise", big)
	other := s.account(orgOn("chaos-other", false), "org", "", "enterprise", big)
	capped := s.account(orgOn("chaos-cap", true), "org", "", "enterprise", map[string]any{
		"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": capQuota}})

	// The capped org spends its quota before the kill.
	capBefore := s.load(loadSpec{Requests: capQuota + 20, Workers: 4, Keys: []string{capped}, Units: map[string]int64{"requests": 1}})
	require.Equal(t, capQuota, capBefore.Status[200], "the capped org is admitted up to its quota: %v", capBefore.Status)

	l := s.startLoad(loadSpec{Workers: 8, Keys: []string{rateOnly, quota, other}, Retry5xx: true, Deadline: 4 * time.Minute}, 400)
	l.waitAdmitted(t, 400, 2*time.Minute)
	restore := func() {}
	if v.behind {
		restore = cluster.CutReplicas(v.killed)
		t.Logf("replicas of %s cut at %s", v.killed, time.Now().Format(time.StampMicro))
		time.Sleep(500 * time.Millisecond) // the load goes on; no replica takes its writes
	}
	cluster.KillMaster(v.killed)
	killedAt := time.Now()
	t.Logf("%s killed at %s", v.killed, killedAt.Format(time.StampMicro)) // to read the odd rows' times against
	restore()                                                             // the other replica may link to the promoted one
	promoted, err := cluster.WaitPromotion(testenv.Context(t, time.Minute), v.killed)
	require.NoError(t, err)
	promotedAt := time.Now()
	v.promoted, v.promotion = promoted, promotedAt.Sub(killedAt)
	// Admission goes on through the promoted replica: the quota org, which needs Redis,
	// gets 200s again from the same admit process.
	l.waitAdmitted(t, l.admitted.Load()+pick[int64](400, 4_000), 2*time.Minute)
	res, answers := l.finish(t)
	capAfter := s.load(loadSpec{Requests: 20, Workers: 4, Keys: []string{capped}, Units: map[string]int64{"requests": 1}})
	v.res, v.capAfter = res, capAfter.Status[200]
	v.loads = []*loadResult{capBefore, res, capAfter}

	v.firstQuota = -1
	for _, a := range answers {
		if a.key == 1 && a.status == 200 && a.sent.After(promotedAt) {
			v.quotaAfter++
			if d := a.answered.Sub(promotedAt); v.firstQuota < 0 || d < v.firstQuota {
				v.firstQuota = d
			}
		}
	}

	// The books are final once the relay has sent and acknowledged every entry of every
	// master's outbox and the meter has committed the topic's end: what is missing then
	// was lost, not late.
	ctx := testenv.Context(t, 10*time.Minute)
	drainFrom := time.Now()
	// admit retries the voids Redis did not take (a dead master, no replica in time) in the
	// background, with backoff: they are part of the books.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		m := scrapeMetrics(t, s.admits[0].URL())
		if metricSum(m, "metergate_admit_voids_pending") == 0 {
			v.notReplicated = int(metricSum(m, "metergate_admit_not_replicated_total"))
			v.failOpen = int(metricSum(m, "metergate_admit_fail_open_total"))
			break
		}
		require.False(t, time.Now().After(deadline), "admit still retries voids a minute after the load")
	}
	for _, m := range cluster.Masters() {
		rdb := redis.NewClient(&redis.Options{Addr: m, MaxRetries: -1})
		waitDrained(ctx, t, rdb, s.prefix+"*", 3*time.Minute)
		_ = rdb.Close()
	}
	v.drained = time.Since(drainFrom)
	s.waitMetered(ctx, 3*time.Minute)
	v.books = s.waitBooks(0, v.loads...)
	v.odd = s.oddRows(ctx, v.loads...)
	// The relay of the same admit reads the promoted master's outbox: the quota org's
	// first row of an admission after the promotion, and the longest any of them waited
	// between Redis and PostgreSQL.
	require.NoError(t, s.db.QueryRow(ctx, `select coalesce(min(ingest_time) - $2, '0'), coalesce(max(ingest_time - event_time), '0')
from usage_events where org = $1 and event_time > $2`, s.keys[quota].account, promotedAt).Scan(&v.relayFirst, &v.relayLag))
	v.reconcileCode, v.reconcileOut = s.reconcile(nil)
	v.verifyCode, v.verifyOut = s.reconcile(nil, "verify")
	restartAt := time.Now()
	cluster.Restart(v.killed)
	v.rejoined = time.Since(restartAt)
	t.Log(v.note())
	for _, o := range v.odd {
		t.Log(o)
	}

	require.Positive(t, v.quotaAfter, "the quota org is admitted through Redis after the promotion, admit not restarted")
	// By itself, and soon: go-redis alone would notice the promotion at its next periodic
	// slot-map reload, up to a minute later.
	require.Less(t, v.firstQuota, recoverWithin, "admission of the killed master's shard resumes soon after the promotion")
	require.Less(t, v.relayLag, recoverWithin, "the relay reads the promoted master's outbox soon after the promotion")
	// Entries the relay read and acknowledged on the killed master whose acknowledgement
	// did not reach the replica are pending again on the promoted one: read again at once,
	// not at the claim 30 s later.
	require.Less(t, v.drained, recoverWithin, "the relay leaves nothing pending on the promoted master")
	require.Equal(t, res.Requests, res.Status[200], "every request is admitted in the end")
	require.Zero(t, res.Mismatched, "no retry of an admitted request got another event id")
}

// oddRows describes the stack's rows (warm-up rows aside) that books counts as lost or
// duplicated for being voided or not: ids told 200 and voided (a caller told 200 for what
// bills nothing), and ids told to nobody and not voided.
func (s *stack) oddRows(ctx context.Context, loads ...*loadResult) (odd []string) {
	s.t.Helper()
	var ids, warm []string
	toldAs := map[string]string{} // idempotency key → event id told
	for _, l := range loads {
		for idem, id := range l.Admitted {
			ids = append(ids, id)
			toldAs[idem] = id
		}
	}
	for id := range s.warm {
		warm = append(warm, id)
	}
	rows, err := s.db.Query(ctx, `select e.event_id, coalesce(e.idempotency_key, ''), e.event_time, e.ingest_time,
  v.event_id is not null, coalesce(v.attempt, ''), coalesce(v.void_time, 'epoch'), coalesce(v.ingest_time, 'epoch')
from usage_events e left join usage_voids v using (event_id)
where (e.event_id = any($1) and v.event_id is not null)
   or (not e.event_id = any($1) and not e.event_id = any($2) and v.event_id is null)`, ids, warm)
	require.NoError(s.t, err)
	for rows.Next() {
		var id, idem, attempt string
		var eventTime, ingest, voidTime, voidIngest time.Time
		var voided bool
		require.NoError(s.t, rows.Scan(&id, &idem, &eventTime, &ingest, &voided, &attempt, &voidTime, &voidIngest))
		what := "told to nobody, not voided"
		if voided {
			what = fmt.Sprintf("told 200 and voided (attempt %s, void time %s, void ingested %s)", attempt,
				voidTime.Format(time.StampMicro), voidIngest.Format(time.StampMicro))
		}
		odd = append(odd, fmt.Sprintf("%s (idempotency key %s, told %s): event time %s, ingested %s; %s", id, idem, toldAs[idem],
			eventTime.Format(time.StampMicro), ingest.Format(time.StampMicro), what))
	}
	require.NoError(s.t, rows.Err())
	return odd
}
