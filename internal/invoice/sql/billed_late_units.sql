-- What the late events of @org's closed period @period that live invoices billed bill now,
-- and what the org's own credit grants cover of them, per unit.
select u.unit,
       coalesce(sum(case u.unit when 'requests' then l.billable_requests when 'tokens' then l.billable_tokens
                                when 'credits' then l.billable_credits else l.billable_cost_micros end), 0)::bigint,
       coalesce((select sum(c.covered)
                 from finance_late_events lc
                 join credits_covered c on c.event_id = lc.event_id and c.billing_period = lc.billing_period
                 where lc.org = @org and lc.billing_period = @period and lc.billed_on is not null and c.unit = u.unit), 0)::bigint
from (values ('requests'), ('tokens'), ('credits'), ('cost_micros')) as u (unit)
left join finance_late_events l on l.org = @org and l.billing_period = @period and l.billed_on is not null
group by u.unit
