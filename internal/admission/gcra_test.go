package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// The token bucket kept as a GCRA theoretical arrival time behaves as the bucket of
// tokens it replaced: a burst of `burst` units at once, then `rate` units per second; a
// request is refused with the time until enough units are back (never, -1 ms, when it
// asks for more than the burst); the RateLimit state is the units left and the time until
// the bucket is full; the longest wait of any level wins.
func TestTokenBucketSemantics(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		team := b.org + "-team"
		pol := tree(
			policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
				policy.Requests: bucket(1.0/3600, 5), // one an hour, burst 5
				policy.Tokens:   bucket(1000, 10),    // 1000/s, burst 10
			}},
			policy.Level{Account: team, Kind: policy.Team, Limits: map[policy.Unit]policy.Limit{
				policy.Requests: bucket(1.0/7200, 3), // one per two hours, burst 3
			}},
		)
		one := map[policy.Unit]int64{policy.Requests: 1}
		for i := range 3 {
			d := b.mustDecide(t, pol, one)
			require.Equal(t, admission.Allow, d.Result, "request %d of the team's burst", i+1)
			org, tm := d.Limits[0], d.Limits[1]
			require.Equal(t, b.org, org.Account)
			require.Equal(t, int64(5-1-i), org.Remaining, "org bucket after %d", i+1)
			require.Equal(t, int64(3-1-i), tm.Remaining, "team bucket after %d", i+1)
			require.Equal(t, int64(5), org.Limit)
			require.Equal(t, 5*time.Hour, org.Window, "time for an empty bucket to fill")
			require.InDelta(t, float64(time.Duration(i+1)*time.Hour), float64(org.Reset), float64(time.Second), "until full")
			require.InDelta(t, float64(time.Duration(i+1)*2*time.Hour), float64(tm.Reset), float64(time.Second))
		}
		// The team is empty (next unit in ~2h), the org has 2 left: the team blocks.
		d := b.mustDecide(t, pol, one)
		require.Equal(t, admission.RateLimited, d.Result)
		require.Equal(t, &admission.Blocker{Account: team, Level: policy.Team, Unit: "requests"}, d.Blocked)
		require.InDelta(t, float64(2*time.Hour), float64(d.RetryAfter), float64(time.Second))
		require.Equal(t, int64(2), d.Limits[0].Remaining, "a refusal consumes nothing")

		// 3 at once: the org (2 left, one more in ~1h) and the team (0 left, 3 more in ~6h)
		// both refuse; the longest wait wins.
		d = b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 3})
		require.Equal(t, admission.RateLimited, d.Result)
		require.Equal(t, team, d.Blocked.Account)
		require.InDelta(t, float64(6*time.Hour), float64(d.RetryAfter), float64(time.Second))

		// More than the burst: never.
		d = b.mustDecide(t, pol, map[policy.Unit]int64{policy.Tokens: 11})
		require.Equal(t, admission.RateLimited, d.Result)
		require.Equal(t, "tokens", d.Blocked.Unit)
		require.Equal(t, -time.Millisecond, d.RetryAfter)

		// Refill: the tokens bucket (10/s, burst 10) emptied is refused for up to 1 s, then
		// admits again. (At 1000/s its 10 ms passed between two calls on a loaded machine.)
		tokens := tree(policy.Level{Account: b.org + "-t", Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Tokens: bucket(10, 10)}})
		ten := map[policy.Unit]int64{policy.Tokens: 10}
		require.Equal(t, admission.Allow, b.mustDecide(t, tokens, ten).Result)
		d = b.mustDecide(t, tokens, ten)
		require.Equal(t, admission.RateLimited, d.Result)
		require.Greater(t, d.RetryAfter, time.Duration(0))
		require.LessOrEqual(t, d.RetryAfter, time.Second)
		ctx := testenv.Context(t, 10*time.Second)
		for {
			time.Sleep(d.RetryAfter)
			d = b.mustDecide(t, tokens, ten)
			if d.Result == admission.Allow {
				break
			}
			require.NoError(t, ctx.Err())
		}
		require.Equal(t, int64(0), d.Limits[0].Remaining)
	})
}
