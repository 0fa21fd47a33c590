package billinglog_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/billinglog"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

// A decision voided because nobody was told it (the caller hung up), whose admission the
// meter has written to the billing log and whose void it has not yet: a retry with the
// same idempotency key is decided afresh. Answering it from the billing log would tell the
// caller 200 for an event the books then void (chaos scenario 10 caught it: told 200, not
// billed).
func TestReplayOfAVoidedDecisionIsDecidedAfresh(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const hot = time.Minute
	rdb := testenv.Redis(t)
	adm := admission.New(rdb, admission.Options{KeyPrefix: testenv.Prefix(t) + "mg",
		IdempotencyLog: billinglog.New(b.pool, billinglog.Options{}), IdempotencyHot: hot})
	pol := policy.Resolved{Org: b.org, Path: []policy.Level{{Account: b.org, Kind: policy.Org,
		Limits: map[policy.Unit]policy.Limit{policy.Requests: policy.Limit{Limit: 100, WindowS: 1}.Normalize()}}}}
	request := func(key string) admission.Request {
		return admission.Request{EventID: adm.NewEventID(b.org), IdempotencyKey: key,
			Units: map[policy.Unit]int64{policy.Requests: 1}, Policy: pol, Source: "test"}
	}

	for _, dropped := range []bool{false, true} {
		key := fmt.Sprintf("order-%v", dropped)
		hungUp := request(key)
		first, err := adm.Decide(b.ctx, hungUp)
		require.NoError(t, err)
		require.Equal(t, admission.Allow, first.Result)
		voided, err := adm.Void(b.ctx, admission.Void{Request: hungUp, Reason: event.VoidCallerGone})
		require.NoError(t, err)
		require.True(t, voided)
		// The meter has the admission, not yet its void (it is behind it in the outbox).
		_, err = b.pool.Exec(b.ctx, `select usage_events_partition($1::date)`, period.MonthStart(first.Time))
		require.NoError(t, err)
		_, err = b.pool.Exec(b.ctx, `
insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind, path,
    idempotency_key, source, requests, tokens, credits, cost_micros, kafka_partition, kafka_offset)
values ($1, $2, $3, $2, $4, $4, 'org', array[$4], $5, 'test', 1, 0, 0, 0, 0, 0)`,
			first.EventID, period.MonthStart(first.Time), first.Time, b.org, key)
		require.NoError(t, err)
		if dropped {
			// The janitor dropped the hot bucket (a void just after a bucket's end, the mark
			// past it): only the void mark in Redis says the logged admission was voided.
			shard := adm.Keys().Shard(b.org)
			require.NoError(t, rdb.Del(b.ctx, adm.Keys().IdempotencyBucket(shard, first.Time, hot)).Err())
		}

		retry, err := adm.Decide(b.ctx, request(key))
		require.NoError(t, err, key)
		require.Equal(t, admission.Allow, retry.Result, key)
		require.False(t, retry.Replayed, "%s: a voided decision is not replayed, from Redis or from the billing log", key)
		require.NotEqual(t, first.EventID, retry.EventID, key)
		again, err := adm.Decide(b.ctx, request(key))
		require.NoError(t, err, key)
		require.True(t, again.Replayed, "%s: the fresh decision is the key's now", key)
		require.Equal(t, retry.EventID, again.EventID, key)
	}
}
