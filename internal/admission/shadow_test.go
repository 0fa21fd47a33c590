package admission_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

// shadowDecide takes a decision of pol in shadow mode (or not).
func (b *testBundle) shadowDecide(t *testing.T, pol policy.Resolved, units map[policy.Unit]int64, shadow bool) admission.Decision {
	t.Helper()
	d, err := b.adm.Decide(testenv.Context(t, 10*time.Second), admission.Request{
		EventID: b.adm.NewEventID(pol.Org), Units: units, Policy: pol, Source: "test", Shadow: shadow})
	require.NoError(t, err)
	return d
}

// shadowRefusals returns the shadow_refusal of each usage.admitted event of the outbox.
func (b *testBundle) shadowRefusals(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, ce := range b.outbox(t, b.org) {
		if ce.Type != event.TypeAdmitted {
			continue
		}
		var a event.Admitted
		require.NoError(t, json.Unmarshal(ce.Data, &a))
		out = append(out, a.ShadowRefusal)
	}
	return out
}

// Shadow mode, rate limits: every request is admitted; those the bucket would refuse say
// so, take no capacity (the bucket is as the enforced requests left it), and are billed:
// each is an event, its quota charged.
func TestShadowRateLimit(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		org := policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(bucket(0.001, 2), 1000, policy.Month)}}
		pol := tree(org)
		one := map[policy.Unit]int64{policy.Requests: 1}
		var shadowed []*admission.Shadow
		for range 5 {
			d := b.shadowDecide(t, pol, one, true)
			require.Equal(t, admission.Allow, d.Result)
			shadowed = append(shadowed, d.Shadow)
		}
		require.Nil(t, shadowed[0])
		require.Nil(t, shadowed[1])
		for _, sh := range shadowed[2:] {
			require.NotNil(t, sh)
			require.Equal(t, admission.RateLimited, sh.Result)
			require.Equal(t, &admission.Blocker{Account: b.org, Level: policy.Org, Unit: "requests"}, sh.Blocked)
			require.Positive(t, sh.RetryAfter)
		}
		require.Equal(t, []string{"", "", "rate_limited", "rate_limited", "rate_limited"}, b.shadowRefusals(t))
		used, err := b.rdb.Get(testenv.Context(t, time.Second), b.keys.Quota(b.org, b.org, policy.Requests, period.MonthLabel(time.Now().UTC()))).Int64()
		require.NoError(t, err)
		require.EqualValues(t, 5, used, "every admitted request is billed")

		// Enforced: the bucket is as two requests left it (empty), not five deep in debt:
		// the shadowed ones took nothing. (A bucket five deep would say the same "refused";
		// its remaining and reset would not.)
		d := b.shadowDecide(t, pol, one, false)
		require.Equal(t, admission.RateLimited, d.Result)
		require.Less(t, d.RetryAfter, 1001*time.Second, "one request's emission interval (1000 s), not three more")
	})
}

// Shadow mode, quotas and credits: past its quota a request is admitted, flagged
// quota_exceeded and billed past the quota; a balance too small is flagged
// insufficient_balance and drawn nothing (no overdraft), while one that covers it is drawn.
func TestShadowQuotaAndCredits(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		now := time.Now()
		b.grant(t, b.org, policy.Credits, grantID(1), 10, 0, now.Add(-time.Hour), time.Time{})
		org := withCredits(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(policy.Limit{}, 2, policy.Month)}}, policy.Credits)
		pol := tree(org)
		units := map[policy.Unit]int64{policy.Requests: 1, policy.Credits: 6}
		d1 := b.shadowDecide(t, pol, units, true)                                                        // quota 1/2, balance 10 → 4
		d2 := b.shadowDecide(t, pol, units, true)                                                        // quota 2/2, balance 4 < 6: nothing drawn
		d3 := b.shadowDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1, policy.Credits: 3}, true) // quota 3 > 2, balance 4 → 1
		for _, d := range []admission.Decision{d1, d2, d3} {
			require.Equal(t, admission.Allow, d.Result)
		}
		require.Nil(t, d1.Shadow)
		require.Equal(t, admission.InsufficientBalance, d2.Shadow.Result)
		require.Equal(t, admission.QuotaExceeded, d3.Shadow.Result)
		require.Equal(t, map[string]int64{grantID(1): 1}, b.remaining(t, b.org, policy.Credits), "drawn 6 and 3, not the 6 it did not have")
		require.Equal(t, map[string]int64{b.org + ":credits:" + grantID(1): 9}, b.draws(t))
		require.Equal(t, []string{"", "insufficient_balance", "quota_exceeded"}, b.shadowRefusals(t))
		used, err := b.rdb.Get(testenv.Context(t, time.Second), b.keys.Quota(b.org, b.org, policy.Requests, period.MonthLabel(time.Now().UTC()))).Int64()
		require.NoError(t, err)
		require.EqualValues(t, 3, used, "billed past the quota")

		// Not in shadow mode, the same request is refused.
		require.Equal(t, admission.QuotaExceeded, b.shadowDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1}, false).Result)
	})
}

// Shadow mode draws credits all-or-nothing too: a balance that does not cover the request
// leaves the others undrawn.
func TestShadowDrawsAllOrNothing(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		now := time.Now()
		team := b.org + "-team"
		b.grant(t, b.org, policy.Credits, grantID(1), 100, 0, now.Add(-time.Hour), time.Time{})
		b.grant(t, team, policy.Credits, grantID(2), 2, 0, now.Add(-time.Hour), time.Time{})
		pol := tree(withCredits(policy.Level{Account: b.org, Kind: policy.Org}, policy.Credits),
			withCredits(policy.Level{Account: team, Kind: policy.Team}, policy.Credits))
		d := b.shadowDecide(t, pol, map[policy.Unit]int64{policy.Credits: 5}, true)
		require.Equal(t, admission.Allow, d.Result)
		require.Equal(t, admission.InsufficientBalance, d.Shadow.Result)
		require.Equal(t, team, d.Shadow.Blocked.Account)
		require.Equal(t, map[string]int64{grantID(1): 100}, b.remaining(t, b.org, policy.Credits), "the org's balance is not drawn")
		require.Equal(t, map[string]int64{grantID(2): 2}, b.remaining(t, team, policy.Credits))
		require.Empty(t, b.draws(t))
	})
}
