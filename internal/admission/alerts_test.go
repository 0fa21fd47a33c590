package admission_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

// fired is a usage.threshold event of an outbox and where it was: after how many
// usage.admitted events, the last of them prev.
type fired struct {
	event.Threshold
	id     string
	before int
	prev   string
}

// thresholds returns the usage.threshold events of the org's outbox in order.
func (b *testBundle) thresholds(t *testing.T) []fired {
	t.Helper()
	var out []fired
	admitted, prev := 0, ""
	for _, ce := range b.outbox(t, b.org) {
		switch ce.Type {
		case event.TypeAdmitted:
			admitted, prev = admitted+1, ce.ID
		case event.TypeThreshold:
			f := fired{id: ce.ID, before: admitted, prev: prev}
			require.NoError(t, json.Unmarshal(ce.Data, &f.Threshold))
			out = append(out, f)
		}
	}
	return out
}

func withAlerts(lv policy.Level, alerts ...policy.Alert) policy.Level {
	lv.Alerts = alerts
	return lv
}

// decideAll sends n requests of units at once from two admit nodes and returns the
// decisions.
func (b *testBundle) decideAll(t *testing.T, pol policy.Resolved, n int, units map[policy.Unit]int64) []admission.Decision {
	t.Helper()
	nodes := []*admission.Admitter{b.adm, b.secondNode(t)}
	ctx := testenv.Context(t, 30*time.Second)
	out := make([]admission.Decision, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := nodes[i%2]
			out[i], errs[i] = node.Decide(ctx, admission.Request{EventID: node.NewEventID(b.org), Policy: pol, Source: "test", Units: units})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return out
}

// 200 requests cross a quota's 50, 80 and 100 % together, from two admit nodes: each
// threshold fires exactly once, in the outbox right after the usage event of the request
// that crossed it, which was admitted and took the counter to it.
func TestThresholdsFireOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		org := withAlerts(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Tokens: withQuota(policy.Limit{}, 1000, policy.Month)}},
			policy.Alert{Kind: policy.QuotaPercent, Unit: policy.Tokens, Period: policy.Month, Thresholds: []int64{50, 80, 100}})
		pol := tree(org)
		ds := b.decideAll(t, pol, 200, map[policy.Unit]int64{policy.Tokens: 10})
		var admittedIDs []string
		for _, d := range ds {
			if d.Result == admission.Allow {
				admittedIDs = append(admittedIDs, d.EventID)
			}
		}
		require.Len(t, admittedIDs, 100)

		got := b.thresholds(t)
		require.Len(t, got, 3, "one event per threshold")
		label := period.MonthLabel(time.Now().UTC())
		for i, want := range []int64{50, 80, 100} {
			f := got[i]
			require.Equal(t, event.ThresholdID(b.org, "tokens", fmt.Sprintf("p%d", want), label), f.id)
			require.Equal(t, event.Threshold{Org: b.org, Account: b.org, Path: []event.PathNode{{Account: b.org, Kind: "org"}},
				Unit: "tokens", Kind: "quota_percent", Threshold: want, At: want * 10, Value: want * 10, Period: label,
				EventID: f.EventID, Admitted: true}, f.Threshold)
			// 10 tokens a request: the crossing request is the want-th admitted, and its
			// usage event is the last before the threshold's.
			require.Equal(t, int(want), f.before, "fired by the request that crossed it")
			require.Equal(t, f.prev, f.EventID, "fired by the request that crossed it")
			require.Contains(t, admittedIDs, f.EventID)
		}
	})
}

// A threshold at the quota fires with the first request the quota refuses when no request
// lands on it exactly, recording the counter before it; it fires no more after that. A
// refund that takes the counter back below a threshold (reconcile's correction) does not
// fire it again, and a threshold fired last period does not hold back this period's.
func TestThresholdRefusalRefundAndPeriod(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		org := withAlerts(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Tokens: withQuota(policy.Limit{}, 100, policy.Month)}},
			policy.Alert{Kind: policy.QuotaPercent, Unit: policy.Tokens, Period: policy.Month, Thresholds: []int64{50, 100}})
		pol := tree(org)
		label := period.MonthLabel(time.Now().UTC())
		last := period.MonthLabel(time.Now().UTC().AddDate(0, -1, -1))
		ctx := testenv.Context(t, 10*time.Second)
		// Last period's marks are last period's: they hold back nothing now.
		require.NoError(t, b.rdb.HSet(ctx, b.keys.AlertMarks(b.keys.Quota(b.org, b.org, policy.Tokens, last)), "p50", 1).Err())

		tokens := map[policy.Unit]int64{policy.Tokens: 30}
		for range 3 { // 30, 60 (crosses 50), 90
			require.Equal(t, admission.Allow, b.mustDecide(t, pol, tokens).Result)
		}
		got := b.thresholds(t)
		require.Len(t, got, 1)
		require.Equal(t, event.ThresholdID(b.org, "tokens", "p50", label), got[0].id)
		require.Equal(t, int64(60), got[0].Value)

		// A refund takes the counter back below 50 %; crossing it again fires nothing.
		counter := b.keys.Quota(b.org, b.org, policy.Tokens, label)
		require.NoError(t, b.rdb.DecrBy(ctx, counter, 45).Err())               // 90 → 45: below 50 again
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, tokens).Result) // 45 → 75: crosses 50 again
		require.Len(t, b.thresholds(t), 1, "a refund does not re-arm a threshold")

		// 75 + 30 > 100: refused, and the 100 % threshold fires with it, once.
		refused := b.adm.NewEventID(b.org)
		d, err := b.adm.Decide(ctx, admission.Request{EventID: refused, Policy: pol, Source: "test", Units: tokens})
		require.NoError(t, err)
		require.Equal(t, admission.QuotaExceeded, d.Result)
		require.Equal(t, admission.QuotaExceeded, b.mustDecide(t, pol, tokens).Result)
		got = b.thresholds(t)
		require.Len(t, got, 2)
		require.Equal(t, event.ThresholdID(b.org, "tokens", "p100", label), got[1].id)
		require.Equal(t, int64(100), got[1].At)
		require.Equal(t, int64(75), got[1].Value, "the counter the refused request found")
		require.False(t, got[1].Admitted)
		require.Equal(t, refused, got[1].EventID)

		// The marks expire with the counter.
		ttlCounter, err := b.rdb.PTTL(ctx, counter).Result()
		require.NoError(t, err)
		ttlMarks, err := b.rdb.PTTL(ctx, b.keys.AlertMarks(counter)).Result()
		require.NoError(t, err)
		require.InDelta(t, ttlCounter.Seconds(), ttlMarks.Seconds(), 5)
	})
}

// A balance threshold fires when a draw takes the balance below it, once per arming grant:
// a refund that lifts the balance back above it does not re-arm it, a top-up (a later
// grant) does. A balance_percent threshold is of the units granted.
func TestBalanceThresholdsOncePerGrant(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		now := time.Now()
		b.grant(t, b.org, policy.Credits, grantID(1), 100, 0, now.Add(-time.Hour), time.Time{})
		org := withCredits(policy.Level{Account: b.org, Kind: policy.Org}, policy.Credits)
		org.Granted = map[policy.Unit]int64{policy.Credits: 100}
		org = withAlerts(org,
			policy.Alert{Kind: policy.BalanceBelow, Unit: policy.Credits, Period: policy.Month, Thresholds: []int64{30}},
			policy.Alert{Kind: policy.BalancePercent, Unit: policy.Credits, Period: policy.Month, Thresholds: []int64{10}})
		pol := tree(org)
		ds := b.decideAll(t, pol, 20, map[policy.Unit]int64{policy.Credits: 7}) // 14 fit: 100 → 2
		allowed := 0
		for _, d := range ds {
			if d.Result == admission.Allow {
				allowed++
			}
		}
		require.Equal(t, 14, allowed)
		got := b.thresholds(t)
		require.Len(t, got, 2)
		require.Equal(t, event.ThresholdID(b.org, "credits", "b30", grantID(1)), got[0].id)
		require.Equal(t, int64(100-7*11), got[0].Value, "the 11th draw takes 30 → 23")
		require.Equal(t, 11, got[0].before)
		require.Equal(t, got[0].prev, got[0].EventID)
		require.Equal(t, grantID(1), got[0].Grant)
		require.Equal(t, event.ThresholdID(b.org, "credits", "bp10", grantID(1)), got[1].id)
		require.Equal(t, int64(10), got[1].At)
		require.Equal(t, int64(100-7*13), got[1].Value, "the 13th draw takes 16 → 9")

		// A refund (reconcile's adjust) lifts the balance to 42; drawing below 30 again
		// fires nothing.
		ctx := testenv.Context(t, 10*time.Second)
		require.NoError(t, b.rdb.HIncrBy(ctx, b.keys.Grants(b.org, b.org, policy.Credits), grantID(1), 40).Err())
		for range 2 { // 42 → 35 → 28
			require.Equal(t, admission.Allow, b.mustDecide(t, pol, map[policy.Unit]int64{policy.Credits: 7}).Result)
		}
		require.Len(t, b.thresholds(t), 2, "a refund does not re-arm a threshold")

		// A top-up that leaves the balance below 30 (28 → 29) crosses nothing when drawn.
		b.grant(t, b.org, policy.Credits, grantID(3), 1, 0, now.Add(-time.Second), time.Time{})
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, map[policy.Unit]int64{policy.Credits: 1}).Result)
		require.Len(t, b.thresholds(t), 2, "nothing was crossed")

		// A top-up (a later grant) lifts it to 128: below 30 fires again, armed by it.
		b.grant(t, b.org, policy.Credits, grantID(2), 100, 0, now, time.Time{})
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, map[policy.Unit]int64{policy.Credits: 100}).Result)
		got = b.thresholds(t)
		require.Len(t, got, 3)
		require.Equal(t, event.ThresholdID(b.org, "credits", "b30", grantID(2)), got[2].id)
		require.Equal(t, int64(28), got[2].Value)
	})
}
