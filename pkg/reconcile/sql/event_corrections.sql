-- The events of the open months (billing period from @since), not admitted fail-open, that
-- still need a period move (charged to another month than their event time's) or a refund
-- or settlement (a 5xx outcome, reported units, a void), with what computing them needs.
--
-- Each event looks up its outcome by key (usage_outcomes is not partitioned: joined as a
-- table, PostgreSQL hashes every outcome ever written; the LIMIT, a no-op on the key, keeps
-- it a lookup) and its corrections in adjustments_event_key.
select e.event_id, e.org, e.account, e.charged_period, e.billing_period, e.event_time,
       array[e.requests, e.tokens, e.credits, e.cost_micros],
       o.status, array[o.requests, o.tokens, o.credits, o.cost_micros],
       exists (select 1 from adjustments a where a.kind = 'period_move' and a.source_event = e.event_id),
       exists (select 1 from adjustments a where a.kind in ('refund_5xx', 'refund_void', 'settle_tokens') and a.source_event = e.event_id),
       v.reason
from usage_events e
left join lateral (select * from usage_outcomes o where o.event_id = e.event_id limit 1) o on true
left join usage_voids v on v.event_id = e.event_id
where e.billing_period >= @since and not e.fail_open
  and ((e.charged_period <> e.billing_period
        and not exists (select 1 from adjustments a where a.kind = 'period_move' and a.source_event = e.event_id))
    or ((o.status >= 500 or num_nonnulls(o.requests, o.tokens, o.credits, o.cost_micros) > 0 or v.event_id is not null)
        and not exists (select 1 from adjustments a where a.kind in ('refund_5xx', 'refund_void', 'settle_tokens') and a.source_event = e.event_id)))
order by e.event_time, e.event_id
