-- Credit corrections (docs/credits.md "Settlement"): per request, account and unit, what
-- it drew from the account's grants beyond what it bills (billable_events: all of it when
-- it bills nothing, a 5xx or a void; the difference when the outcome reports fewer actual
-- units) is given back to the grants it drew from, from the highest grant id down, less
-- what was given back before. One row per draw and kind; a row already recorded (the
-- unique key) is not recorded again.
with draws as (
    select c.event_id, c.grant_id, c.org, c.account, c.unit, c.units,
           case c.unit when 'requests' then b.billable_requests when 'tokens' then b.billable_tokens
                       when 'credits' then b.billable_credits else b.billable_cost_micros end as billable,
           b.refunded,
           coalesce((select sum(a.units) from credit_adjustments a
                     where a.event_id = c.event_id and a.grant_id = c.grant_id and a.kind in ('refund', 'settle')), 0) as given
    from credit_consumptions c
    join billable_events b on b.event_id = c.event_id and b.billing_period = c.billing_period
    where c.billing_period >= @since
),
spread as (
    select *,
           sum(units) over (partition by event_id, account, unit) as drawn,
           sum(units) over (partition by event_id, account, unit order by grant_id desc
                            rows between unbounded preceding and current row) as upto
    from draws
)
select event_id, grant_id, org, account, unit,
       case when refunded then 'refund' else 'settle' end as kind,
       least(units, greatest(0, (drawn - billable) - (upto - units))) - given as give
from spread
where least(units, greatest(0, (drawn - billable) - (upto - units))) - given > 0
order by event_id, grant_id
