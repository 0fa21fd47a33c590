package admission_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

// voids returns the usage.voided events of the org's outbox.
func (b *testBundle) voids(t *testing.T) []event.Voided {
	t.Helper()
	var out []event.Voided
	for _, ev := range b.outbox(t, b.org) {
		if ev.Type != event.TypeVoided {
			continue
		}
		var v event.Voided
		require.NoError(t, json.Unmarshal(ev.Data, &v))
		require.Equal(t, v.EventID+event.VoidSuffix, ev.ID)
		require.Equal(t, b.org, ev.Subject)
		out = append(out, v)
	}
	return out
}

func (b *testBundle) request(pol policy.Resolved, idem string) admission.Request {
	return admission.Request{EventID: b.adm.NewEventID(pol.Org), IdempotencyKey: idem,
		Units: map[policy.Unit]int64{policy.Requests: 1}, Policy: pol, Source: "test"}
}

func (b *testBundle) void(t *testing.T, r admission.Request, reason string) bool {
	t.Helper()
	voided, err := b.adm.Void(testenv.Context(t, 10*time.Second), admission.Void{Request: r, Reason: reason})
	require.NoError(t, err)
	return voided
}

// A request nobody was told the decision of is voided: its usage.voided event goes into the
// outbox (the meter records it, reconcile refunds it) and its concurrency leases are freed.
func TestVoidReleasesLeasesAndRecordsTheVoid(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{leaseTTL: time.Minute}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Concurrency: 1, Limits: map[policy.Unit]policy.Limit{}})
		r := b.request(pol, "")
		d, err := b.adm.Decide(testenv.Context(t, 10*time.Second), r)
		require.NoError(t, err)
		require.Equal(t, admission.Allow, d.Result)
		require.Equal(t, admission.RateLimited, b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1}).Result,
			"the one slot is held")

		require.True(t, b.void(t, r, event.VoidCallerGone))
		require.Equal(t, []event.Voided{{EventID: r.EventID, Attempt: r.EventID, Reason: event.VoidCallerGone}}, b.voids(t))
		require.Equal(t, admission.Allow, b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1}).Result,
			"the void released the slot")

		// Voiding again appends the same event (the meter keeps one) and frees nothing more.
		require.True(t, b.void(t, r, event.VoidCallerGone))
		require.Len(t, b.voids(t), 2)
		require.Equal(t, admission.RateLimited, b.mustDecide(t, pol, map[policy.Unit]int64{policy.Requests: 1}).Result)
	})
}

// A decision answered to several requests (the first, and replays by its idempotency key)
// is void only once every one of them was voided: one replay told 200 bills it. After that,
// the key decides afresh instead of replaying a decision that bills nothing.
func TestVoidOfAReplayedDecision(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(bucket(100, 100), 1000, policy.Month)}})
		ctx := testenv.Context(t, 10*time.Second)
		first := b.request(pol, "idem-1")
		d1, err := b.adm.Decide(ctx, first)
		require.NoError(t, err)
		retry := b.request(pol, "idem-1")
		d2, err := b.adm.Decide(ctx, retry)
		require.NoError(t, err)
		require.True(t, d2.Replayed)
		require.Equal(t, d1.EventID, d2.EventID)

		require.False(t, b.void(t, retry, event.VoidCallerGone), "the first request may have been told 200")
		require.Empty(t, b.voids(t))
		d3, err := b.adm.Decide(ctx, b.request(pol, "idem-1"))
		require.NoError(t, err)
		require.True(t, d3.Replayed, "the decision stands while one request answered with it is not voided")

		require.False(t, b.void(t, first, event.VoidUnavailable), "d3's request was told 200")
		require.Empty(t, b.voids(t), "d3's request was told 200: the decision bills")

		// Now a decision whose every request was voided.
		lone := b.request(pol, "idem-2")
		dl, err := b.adm.Decide(ctx, lone)
		require.NoError(t, err)
		again := b.request(pol, "idem-2")
		_, err = b.adm.Decide(ctx, again)
		require.NoError(t, err)
		require.False(t, b.void(t, lone, event.VoidCallerGone))
		require.True(t, b.void(t, again, event.VoidCallerGone))
		require.Equal(t, []event.Voided{{EventID: dl.EventID, Attempt: again.EventID, Reason: event.VoidCallerGone}}, b.voids(t),
			"the decision's own event id is voided, by the last request answered with it")
		fresh, err := b.adm.Decide(ctx, b.request(pol, "idem-2"))
		require.NoError(t, err)
		require.Equal(t, admission.Allow, fresh.Result)
		require.False(t, fresh.Replayed, "a voided decision is not replayed")
		require.NotEqual(t, dl.EventID, fresh.EventID)
	})
}

// A void that Redis runs before the script call of its request (the call was still queued
// behind a stall when admit gave up on it) voids that request's decision too: a replay of
// it decides afresh.
func TestVoidBeforeTheDecision(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: bucket(100, 100)}})
		ctx := testenv.Context(t, 10*time.Second)
		late := b.request(pol, "idem-late")
		require.True(t, b.void(t, late, event.VoidUnavailable))
		d, err := b.adm.Decide(ctx, late) // the queued call runs after the void
		require.NoError(t, err)
		require.Equal(t, late.EventID, d.EventID)
		require.Equal(t, []event.Voided{{EventID: late.EventID, Attempt: late.EventID, Reason: event.VoidUnavailable}}, b.voids(t))

		retry, err := b.adm.Decide(ctx, b.request(pol, "idem-late"))
		require.NoError(t, err)
		require.False(t, retry.Replayed, "the late decision was voided: not answered again")
		require.NotEqual(t, late.EventID, retry.EventID)
	})
}

// The usage.voided event the script writes is the one admit writes straight to Kafka when
// Redis cannot take the void (VoidedEvent), field for field (the script writes the time's
// microseconds in full).
func TestVoidedEventIsJSON(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		pol := tree(policy.Level{Account: b.org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{}})
		r := b.request(pol, "")
		r.Source = `node "1"`
		require.True(t, b.void(t, r, event.VoidCallerGone))
		entries, err := b.rdb.XRange(testenv.Context(t, 10*time.Second), b.keys.Outbox(b.keys.Shard(b.org)), "-", "+").Result()
		require.NoError(t, err)
		require.Len(t, entries, 1)
		raw := entries[0].Values["v"].(string)
		var got event.CloudEvent
		require.NoError(t, json.Unmarshal([]byte(raw), &got))
		want, err := admission.VoidedEvent(r, r.EventID, event.VoidCallerGone, got.Time)
		require.NoError(t, err)
		wantJSON, err := json.Marshal(want)
		require.NoError(t, err)
		gotJSON, err := json.Marshal(got)
		require.NoError(t, err)
		require.Equal(t, string(wantJSON), string(gotJSON))
	})
}
