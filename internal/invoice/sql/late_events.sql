-- The late events not billed yet (nor held: their period's invoice is void, not reissued) of
-- the closed periods before @period (finance_late_events:
-- flagged late by the meter, or ingested after their period's close), with what of each
-- unit the org's own credit grants covered (credits_covered).
select l.event_id, l.billing_period, l.org, l.account_path,
       l.billable_requests, l.billable_tokens, l.billable_credits, l.billable_cost_micros,
       c.requests, c.tokens, c.credits, c.cost_micros
from finance_late_events l
cross join lateral (
    select coalesce(sum(covered) filter (where unit = 'requests'), 0)::bigint as requests,
           coalesce(sum(covered) filter (where unit = 'tokens'), 0)::bigint as tokens,
           coalesce(sum(covered) filter (where unit = 'credits'), 0)::bigint as credits,
           coalesce(sum(covered) filter (where unit = 'cost_micros'), 0)::bigint as cost_micros
    from credits_covered c where c.event_id = l.event_id and c.billing_period = l.billing_period) c
where l.billed_on is null and not l.held and l.billing_period < @period
order by l.billing_period, l.org, l.account_path, l.event_id
