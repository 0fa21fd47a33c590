-- The corrections reconcile made for event @event_id: to quota counters (adjustments) and
-- by amendments of its closed month.
select 'adjustment: ' || a.kind, a.account || ' ' || a.unit || ' ' || to_char(a.period, 'YYYY-MM-DD'), a.amount, a.created_at,
       a.applied_at is not null, a.reason
from adjustments a
where a.source_event = @event_id
union all
select 'amendment ' || m.id, m.reason, 0, m.amended_at, true, 'by ' || m.amended_by
from amendment_events ae
join amendments m on m.id = ae.amendment_id
where ae.event_id = @event_id
order by 4
