package chaos_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/failover"
	"github.com/metergate/metergate/internal/testenv/private"
)

// Scenario 13: Redis Sentinel, the primary SIGKILLed under load while its replica lags.
// admit reaches Redis only through the sentinels (REDIS_SENTINEL_ADDRS); they promote the
// replica and admit follows by itself, without a restart. Two orgs take the load: a
// rate-only one (fail-open while no primary answers) and one with a quota (503 while no
// primary answers; the callers retry with the same idempotency key, as a caller that must
// get an answer does). A third org spent its quota before the kill.
//
// Replication is asynchronous: the primary drops its replicas' links and is killed 50 ms
// later, so the replica that is promoted lacks the primary's last writes. With
// ADMIT_REDIS_WAIT_REPLICAS=1 no decision was answered before a replica held it (the
// others were answered 503 and voided; the other replica keeps WAIT answered after the
// promotion): every id answered 200 is one row, holding what its
// caller sent; the spent quota still refuses; reconcile (through the sentinels too) finds
// the promoted primary's counters equal to the books. The scenario's private broker is
// stopped before the lag begins, so that the relay cannot have sent the lag window's
// events to Kafka before the kill: the same failover without the WAIT then loses them,
// and the check must see that loss.
func TestSentinelFailover(t *testing.T) {
	// Not parallel with another user of the Sentinel setup: it kills the setup's primary
	// (and testenv brings the killed server back as a replica when each run ends).
	sc := begin(t, "13 Redis Sentinel failover")
	sentinel := failover.RedisSentinel(t)
	broker := private.StartBroker(t)
	var notes []string
	for _, wait := range []bool{true, false} {
		name := map[bool]string{true: "wait", false: "no-wait"}[wait]
		t.Run(name, func(t *testing.T) {
			f := runSentinelFailover(t, sentinel, broker, wait)
			notes = append(notes, f.note)
			if !wait {
				// Without the WAIT the entries written in the lag window were on the
				// primary alone: the check must see them lost.
				require.Positive(t, f.books.Lost, "without WAIT the lag window's events are lost, and counted")
				return
			}
			sc.fill(f.books, f.loads...)
			require.Positive(t, f.quotaAfter, "the quota org is admitted through Redis after the promotion, admit not restarted")
			require.Equal(t, f.res.Requests, f.res.Status[200], "every request is admitted in the end")
			f.books.requireExact(t, len(f.res.Admitted)+len(f.capBefore.Admitted)+len(f.capAfter.Admitted))
			require.Zero(t, f.res.Mismatched, "no retry of a request told 200 got another event id")
			require.Zero(t, len(f.capAfter.Admitted), "the quota spent before the failover still refuses after it: %v", f.capAfter.Status)
			require.Zero(t, len(f.capReconciled.Admitted), "and after reconcile: %v", f.capReconciled.Status)
			require.Equal(t, 0, f.reconcileCode, "reconcile:\n%s", f.reconcileOut)
			require.Equal(t, 0, f.verifyCode, "reconcile verify:\n%s", f.verifyOut)
		})
	}
	sc.Note = strings.Join(notes, "; ")
}

// sentinelFailover is what one failover cost.
type sentinelFailover struct {
	res                                *loadResult
	capBefore, capAfter, capReconciled *loadResult
	loads                              []*loadResult
	books                              books
	quotaAfter                         int // the quota org's 200s sent after the promotion
	reconcileCode, verifyCode          int
	reconcileOut, verifyOut            string
	note                               string
}

func runSentinelFailover(t *testing.T, sentinel failover.Sentinel, broker *private.Broker, wait bool) *sentinelFailover {
	ctx := testenv.Context(t, 10*time.Minute)
	replicas, err := sentinel.Replicas(ctx)
	require.NoError(t, err)
	for _, replica := range replicas { // in sync (after an earlier run's restart too)
		require.NoError(t, private.WaitReplicaInSync(testenv.Context(t, time.Minute), replica))
	}
	admitEnv := []string{}
	if wait {
		admitEnv = append(admitEnv, "ADMIT_REDIS_WAIT_REPLICAS=1")
	}
	s := newStack(t, options{RedisEnv: sentinel.Env(), AdmitEnv: admitEnv, Brokers: []string{broker.Addr()}})
	rateOnly := s.account("chaos-rate", "org", "", "enterprise", enterpriseRate)
	quota := s.account("chaos-quota", "org", "", "enterprise", map[string]any{
		"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": 100_000_000}})
	const capQuota = 50
	capped := s.account("chaos-cap", "org", "", "enterprise", map[string]any{
		"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": capQuota}})
	f := &sentinelFailover{}
	f.capBefore = s.load(loadSpec{Requests: capQuota + 20, Workers: 4, Keys: []string{capped}, Units: map[string]int64{"requests": 1}})
	require.Equal(t, capQuota, f.capBefore.Status[200], "the capped org is admitted up to its quota: %v", f.capBefore.Status)

	l := s.startLoad(loadSpec{Workers: 8, Keys: []string{rateOnly, quota}, Retry5xx: true, Deadline: 4 * time.Minute}, 400)
	l.waitAdmitted(t, 400, 2*time.Minute)
	broker.Stop() // the relay can no longer send: what is admitted from now on is in Redis alone
	l.waitAdmitted(t, l.admitted.Load()+100, 2*time.Minute)
	// The replicas fall behind: the primary drops their links and dies 50 ms later, its
	// last writes on no replica.
	killed := sentinel.KillPrimaryCut(t, 50*time.Millisecond)
	killedAt := time.Now()
	promoted, err := sentinel.WaitPromotion(testenv.Context(t, time.Minute), killed)
	require.NoError(t, err)
	promotedAt := time.Now()
	// Admission goes on through the promoted primary: the quota org, which needs Redis,
	// gets 200s again from the same admit process.
	l.waitAdmitted(t, l.admitted.Load()+pick[int64](400, 4_000), 2*time.Minute)
	broker.Start()
	res, answers := l.finish(t)
	f.res = res

	firstQuota := time.Duration(-1) // from the promotion to the quota org's first 200
	for _, a := range answers {
		if a.key == 1 && a.status == 200 && a.sent.After(promotedAt) {
			f.quotaAfter++
			if d := a.answered.Sub(promotedAt); firstQuota < 0 || d < firstQuota {
				firstQuota = d
			}
		}
	}
	// The spent quota, on the promoted primary: refused before reconcile runs (what the
	// replica held) and after it.
	f.capAfter = s.load(loadSpec{Requests: 20, Workers: 4, Keys: []string{capped}, Units: map[string]int64{"requests": 1}})
	f.loads = []*loadResult{res, f.capBefore, f.capAfter}
	// The books are final once the relay has sent and acknowledged every entry the promoted
	// primary holds and the meter has committed every message: what is missing then was
	// lost, not late.
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinel.Master, SentinelAddrs: sentinel.Addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	waitDrained(ctx, t, rdb, s.prefix+"*", 3*time.Minute)
	s.waitMetered(ctx, 3*time.Minute)
	// reconcile too reaches Redis through the sentinels, on the promoted primary: it
	// restores what the replica missed, and then the counters equal the books.
	f.reconcileCode, f.reconcileOut = s.reconcile(nil)
	drift := -1
	if m := regexp.MustCompile(`drift_found=(\d+)`).FindStringSubmatch(f.reconcileOut); m != nil {
		drift, _ = strconv.Atoi(m[1])
	}
	f.verifyCode, f.verifyOut = s.reconcile(nil, "verify")
	f.capReconciled = s.load(loadSpec{Requests: 20, Workers: 4, Keys: []string{capped}, Units: map[string]int64{"requests": 1}})
	f.loads = append(f.loads, f.capReconciled)
	waitDrained(ctx, t, rdb, s.prefix+"*", 3*time.Minute)
	s.waitMetered(ctx, 3*time.Minute)
	f.books = s.waitBooks(0, f.loads...)
	name := "WAIT 1"
	if !wait {
		name = "no WAIT"
	}
	f.note = fmt.Sprintf("%s: broker stopped, primary %s SIGKILLed 50 ms after its replicas' links dropped, %s promoted %s later; "+
		"quota org's first 200 after the promotion in %s (%d after it); %d admitted, %d lost, %d duplicated, %d voided rows of 503s; final answers %v, %d 5xx retried; "+
		"spent quota admitted %d after the failover, %d after reconcile; reconcile exit %d (drift_found=%d), verify exit %d",
		name, killed, promoted, promotedAt.Sub(killedAt).Round(time.Millisecond), firstQuota.Round(time.Millisecond), f.quotaAfter,
		len(res.Admitted), f.books.Lost, f.books.Duplicated, f.books.Voided, res.Status, res.FiveXX,
		len(f.capAfter.Admitted), len(f.capReconciled.Admitted), f.reconcileCode, drift, f.verifyCode)
	t.Log(f.note)
	return f
}
