package chaos_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

// Scenario 12: Redis Sentinel, the primary SIGKILLed under load. admit reaches Redis only
// through the sentinels (REDIS_SENTINEL_ADDRS); they promote the replica and admit follows
// by itself, without a restart. Two orgs: a rate-only one (fail-open while no primary
// answers) and one with a quota (503 while no primary answers; the callers retry with the
// same idempotency key, as a caller that must get an answer does). Every id answered 200
// is one row, holding what its caller sent, and reconcile (through the sentinels too) finds
// the promoted primary's counters equal to the books.
func TestSentinelFailover(t *testing.T) {
	// Not parallel with another user of the Sentinel setup: it kills the setup's primary
	// (and testenv brings the killed server back as a replica when the test ends).
	sc := begin(t, "13 Redis Sentinel failover")
	sentinel := testenv.RedisSentinel(t)
	s := newStack(t, options{RedisEnv: sentinel.Env()})
	rateOnly := s.account("chaos-rate", "org", "", "enterprise", enterpriseRate)
	quota := s.account("chaos-quota", "org", "", "enterprise", map[string]any{
		"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": 100_000_000}})
	keys := []string{rateOnly, quota}

	l := s.startLoad(loadSpec{Workers: 8, Keys: keys, Retry5xx: true, Deadline: 4 * time.Minute}, 400)
	l.waitAdmitted(t, 400, 2*time.Minute)
	killed := sentinel.KillPrimary(t)
	killedAt := time.Now()
	promoted, err := sentinel.WaitPromotion(testenv.Context(t, time.Minute), killed)
	require.NoError(t, err)
	promotedAt := time.Now()
	// Admission goes on through the promoted primary: the quota org, which needs Redis,
	// gets 200s again from the same admit process.
	l.waitAdmitted(t, l.admitted.Load()+pick[int64](400, 4_000), 2*time.Minute)
	res, answers := l.finish(t)

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
	b := s.waitBooks(3*time.Minute, res)
	sc.fill(b, res)
	// reconcile too reaches Redis through the sentinels, on the promoted primary: the
	// counters there equal the books.
	code, out := s.reconcile(nil)
	verifyCode, verifyOut := s.reconcile(nil, "verify")
	sc.Note = fmt.Sprintf("primary %s SIGKILLed, %s promoted %s later; quota org's first 200 after the promotion in %s (%d after it); "+
		"final answers %v, %d 5xx retried; reconcile exit %d, verify exit %d",
		killed, promoted, promotedAt.Sub(killedAt).Round(time.Millisecond), firstQuota.Round(time.Millisecond), quotaAfter, res.Status, res.FiveXX,
		code, verifyCode)

	require.Positive(t, quotaAfter, "the quota org is admitted through Redis after the promotion, admit not restarted")
	require.Equal(t, res.Requests, res.Status[200], "every request is admitted in the end")
	b.requireExact(t, res.Requests)
	require.Equal(t, 0, code, "reconcile:\n%s", out)
	require.Equal(t, 0, verifyCode, "reconcile verify:\n%s", verifyOut)
}
