package admission_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// grant puts a grant into Redis as internal/credit mirrors it: remaining units and terms.
func (b *testBundle) grant(t *testing.T, account string, unit policy.Unit, id string, remaining int64, priority int, effective, expires time.Time) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	exp := int64(0)
	if !expires.IsZero() {
		exp = expires.UnixMilli()
	}
	require.NoError(t, b.rdb.HSet(ctx, b.keys.Grants(b.org, account, unit), id, remaining).Err())
	require.NoError(t, b.rdb.HSet(ctx, b.keys.GrantTerms(b.org, account, unit), id,
		fmt.Sprintf("%d|%d|%d", priority, effective.UnixMilli(), exp)).Err())
}

func (b *testBundle) remaining(t *testing.T, account string, unit policy.Unit) map[string]int64 {
	t.Helper()
	m, err := b.rdb.HGetAll(testenv.Context(t, 10*time.Second), b.keys.Grants(b.org, account, unit)).Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for k, v := range m {
		n, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
		out[k] = n
	}
	return out
}

func grantID(n int) string { return fmt.Sprintf("gr_%032x", n) }

// draws returns the credit draws the outbox's events record, "<account>:<unit>:<grant>" →
// units, summed.
func (b *testBundle) draws(t *testing.T) map[string]int64 {
	t.Helper()
	entries, err := b.rdb.XRange(testenv.Context(t, 10*time.Second), b.keys.Outbox(b.keys.Shard(b.org)), "-", "+").Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for _, e := range compactEvents(entries) {
		f := strings.Split(e, "|")
		if len(f) < 15 || f[14] == "" {
			continue
		}
		for _, d := range strings.Split(f[14], ",") {
			k, v, ok := strings.Cut(d, "=")
			require.True(t, ok, d)
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			out[k] += n
		}
	}
	return out
}

func withCredits(lv policy.Level, units ...policy.Unit) policy.Level {
	lv.Credits = units
	return lv
}

// No overdraft under concurrency: 200 requests at once, from two admit nodes, against a
// balance that covers 100 get exactly 100, and the balance ends at 0, drawn exactly by
// the events.
func TestCreditsNoOverdraft(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		now := time.Now()
		b.grant(t, b.org, policy.Credits, grantID(1), 60, 0, now.Add(-time.Hour), time.Time{})
		b.grant(t, b.org, policy.Credits, grantID(2), 40, 5, now.Add(-time.Hour), now.Add(time.Hour))
		pol := tree(withCredits(policy.Level{Account: b.org, Kind: policy.Org}, policy.Credits))
		nodes := []*admission.Admitter{b.adm, b.secondNode(t)}
		var allowed, refused atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		ctx := testenv.Context(t, 30*time.Second)
		for i := range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := nodes[i%2]
				d, err := n.Decide(ctx, admission.Request{EventID: n.NewEventID(b.org), Policy: pol, Source: "test",
					Units: map[policy.Unit]int64{policy.Requests: 1, policy.Credits: 1}})
				switch {
				case err != nil:
					errs <- err
				case d.Result == admission.Allow:
					allowed.Add(1)
				case d.Result == admission.InsufficientBalance:
					refused.Add(1)
				default:
					errs <- fmt.Errorf("unexpected %s", d.Result)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, int64(100), allowed.Load())
		require.Equal(t, int64(100), refused.Load())
		require.Equal(t, map[string]int64{grantID(1): 0, grantID(2): 0}, b.remaining(t, b.org, policy.Credits))
		label := b.org + ":credits:"
		require.Equal(t, map[string]int64{label + grantID(1): 60, label + grantID(2): 40}, b.draws(t))
	})
}

// Grants are drawn by priority, then earliest expiry, then id; a grant not yet effective
// or expired (by Redis TIME) is not drawn; a refusal names the account and unit, with the
// balance, and draws nothing.
func TestCreditsDrawOrderAndRefusal(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		now := time.Now()
		past := now.Add(-time.Hour)
		b.grant(t, b.org, policy.CostMicros, grantID(1), 10, 0, past, time.Time{})                // last: no expiry
		b.grant(t, b.org, policy.CostMicros, grantID(2), 10, 0, past, now.Add(time.Hour))         // third
		b.grant(t, b.org, policy.CostMicros, grantID(3), 10, 0, past, now.Add(time.Minute))       // second
		b.grant(t, b.org, policy.CostMicros, grantID(4), 5, 9, past, time.Time{})                 // first: priority
		b.grant(t, b.org, policy.CostMicros, grantID(5), 99, 50, now.Add(time.Hour), time.Time{}) // not yet
		b.grant(t, b.org, policy.CostMicros, grantID(6), 99, 50, past, now.Add(-time.Minute))     // expired
		pol := tree(withCredits(policy.Level{Account: b.org, Kind: policy.Org}, policy.CostMicros))

		d := b.mustDecide(t, pol, map[policy.Unit]int64{policy.CostMicros: 22})
		require.Equal(t, admission.Allow, d.Result)
		require.Equal(t, []admission.Balance{{Account: b.org, Unit: "cost_micros", Balance: 35 - 22}}, d.Balances)
		require.Equal(t, map[string]int64{grantID(1): 10, grantID(2): 3, grantID(3): 0, grantID(4): 0, grantID(5): 99, grantID(6): 99},
			b.remaining(t, b.org, policy.CostMicros))
		label := b.org + ":cost_micros:"
		require.Equal(t, map[string]int64{label + grantID(4): 5, label + grantID(3): 10, label + grantID(2): 7}, b.draws(t))

		before := b.remaining(t, b.org, policy.CostMicros)
		d = b.mustDecide(t, pol, map[policy.Unit]int64{policy.CostMicros: 14})
		require.Equal(t, admission.InsufficientBalance, d.Result)
		require.Equal(t, &admission.Blocker{Account: b.org, Level: policy.Org, Unit: "cost_micros"}, d.Blocked)
		require.Equal(t, []admission.Balance{{Account: b.org, Unit: "cost_micros", Balance: 13}}, d.Balances)
		require.Equal(t, before, b.remaining(t, b.org, policy.CostMicros), "a refusal draws nothing")
		require.Len(t, b.outbox(t, b.org), 1, "no event for the refusal")

		// A request without the unit, or with 0 of it, does not touch the balance.
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1}).Result)
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, map[policy.Unit]int64{policy.CostMicros: 0}).Result)
		require.Equal(t, before, b.remaining(t, b.org, policy.CostMicros))
	})
}

// Expiry is decided by Redis TIME: a grant drawable up to its expiry is not drawn from
// the first millisecond after it.
func TestCreditsExpireByRedisTime(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		ctx := testenv.Context(t, 20*time.Second)
		redisNow, err := b.rdb.Time(ctx).Result()
		require.NoError(t, err)
		expires := redisNow.Add(400 * time.Millisecond).Truncate(time.Millisecond) // grants' times are ms
		b.grant(t, b.org, policy.Credits, grantID(1), 1_000_000_000, 0, redisNow.Add(-time.Hour), expires)
		pol := tree(withCredits(policy.Level{Account: b.org, Kind: policy.Org}, policy.Credits))
		one := map[policy.Unit]int64{policy.Credits: 1}
		for {
			d := b.mustDecide(t, pol, one)
			if d.Result != admission.Allow {
				require.Equal(t, admission.InsufficientBalance, d.Result)
				require.False(t, d.Time.Before(expires), "refused at %s, before the expiry %s", d.Time, expires)
				break
			}
			require.True(t, d.Time.Before(expires), "drawn at %s, at or after the expiry %s", d.Time, expires)
			require.NoError(t, ctx.Err())
		}
	})
}

// All-or-nothing with every limit: a request refused by a rate limit draws nothing, one
// refused by a balance consumes no rate; balances of several levels are drawn together.
func TestCreditsAllOrNothing(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		past := time.Now().Add(-time.Hour)
		user := b.org + "-u"
		b.grant(t, b.org, policy.Tokens, grantID(1), 1000, 0, past, time.Time{})
		b.grant(t, user, policy.Tokens, grantID(2), 50, 0, past, time.Time{})
		pol := tree(
			withCredits(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: slowRequests(2)}}, policy.Tokens),
			withCredits(policy.Level{Account: user, Kind: policy.User}, policy.Tokens),
		)
		d := b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 30})
		require.Equal(t, admission.Allow, d.Result)
		require.Equal(t, int64(970), b.remaining(t, b.org, policy.Tokens)[grantID(1)])
		require.Equal(t, int64(20), b.remaining(t, user, policy.Tokens)[grantID(2)])

		// The user's balance (20) refuses 30: the org's is not drawn, the rate not taken.
		rate, err := b.rdb.HGet(testenv.Context(t, 5*time.Second), b.stateHash(), b.org+":r").Result()
		require.NoError(t, err)
		d = b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 30})
		require.Equal(t, admission.InsufficientBalance, d.Result)
		require.Equal(t, user, d.Blocked.Account)
		require.Equal(t, int64(970), b.remaining(t, b.org, policy.Tokens)[grantID(1)])
		after, err := b.rdb.HGet(testenv.Context(t, 5*time.Second), b.stateHash(), b.org+":r").Result()
		require.NoError(t, err)
		require.Equal(t, rate, after, "no rate taken")

		// The rate (burst 2) refuses the third request: no balance drawn.
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 10}).Result)
		d = b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 10})
		require.Equal(t, admission.RateLimited, d.Result)
		require.Equal(t, int64(960), b.remaining(t, b.org, policy.Tokens)[grantID(1)])
		require.Equal(t, int64(10), b.remaining(t, user, policy.Tokens)[grantID(2)])
		require.Equal(t, []admission.Balance{{Account: b.org, Unit: "tokens", Balance: -1}, {Account: user, Unit: "tokens", Balance: -1}},
			d.Balances, "not read")
	})
}

func slowRequests(burst int64) policy.Limit { return bucket(float64(burst)/3600, burst) }

// compactEvents are the compact usage events of outbox entries, in order (an entry may
// hold the events of one script call: lua/admit.lua, "Outbox").
func compactEvents(entries []redis.XMessage) []string {
	var out []string
	for _, e := range entries {
		if v, ok := e.Values["e"].(string); ok {
			out = append(out, v)
		}
		all, _ := e.Values["E"].(string)
		for all != "" {
			n, rest, _ := strings.Cut(all[1:], ":")
			size, _ := strconv.Atoi(n)
			if all[0] == 'e' {
				out = append(out, rest[:size])
			}
			all = rest[size:]
		}
	}
	return out
}
