-- The events of the open months (billing period from @since), not admitted fail-open, that
-- still need a period move (charged to another month than their event time's) or a refund
-- or settlement (they bill other units than were admitted: billable_events,
-- migrations/00009_billable.sql), with what computing them needs.
--
-- billable_events looks up each event's outcome by key; the corrections are looked up in
-- adjustments_event_key.
select b.event_id, b.org, b.account, b.charged_period, b.billing_period, b.event_time,
       array[b.requests, b.tokens, b.credits, b.cost_micros],
       array[b.billable_requests, b.billable_tokens, b.billable_credits, b.billable_cost_micros],
       b.refunded, b.outcome_status, b.void_reason,
       exists (select 1 from adjustments a where a.kind = 'period_move' and a.source_event = b.event_id),
       exists (select 1 from adjustments a where a.kind in ('refund_5xx', 'refund_void', 'settle_tokens') and a.source_event = b.event_id)
from billable_events b
where b.billing_period >= @since and not b.fail_open
  and ((b.charged_period <> b.billing_period
        and not exists (select 1 from adjustments a where a.kind = 'period_move' and a.source_event = b.event_id))
    or ((b.billable_requests, b.billable_tokens, b.billable_credits, b.billable_cost_micros)
          <> (b.requests, b.tokens, b.credits, b.cost_micros)
        and not exists (select 1 from adjustments a where a.kind in ('refund_5xx', 'refund_void', 'settle_tokens') and a.source_event = b.event_id)))
order by b.event_time, b.event_id
