-- What account @account and the accounts below it used per UTC day from @since until
-- before @until, from the
-- billing log: the units of each admission's outcome where one was reported, else those
-- admitted; voided admissions left out. billing_period bounds the partitions read.
select (date_trunc('day', e.event_time at time zone 'UTC'))::date as day,
       sum(coalesce(o.requests, e.requests))::bigint, sum(coalesce(o.tokens, e.tokens))::bigint,
       sum(coalesce(o.credits, e.credits))::bigint, sum(coalesce(o.cost_micros, e.cost_micros))::bigint
from usage_events e
left join usage_outcomes o on o.event_id = e.event_id
where e.path @> array[@account::text]
  and e.billing_period >= date_trunc('month', @since::timestamptz at time zone 'UTC')::date
  and e.event_time >= @since
  and e.event_time < @until
  and not exists (select 1 from usage_voids v where v.event_id = e.event_id)
group by 1
order by 1
