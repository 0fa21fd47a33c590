-- What each of @accounts, with everything under it, used per UTC day from @from until
-- before @to: the rows of the view usage_daily (migration 00028), the days without usage
-- left out. The view groups every row of its two tables; this groups only the changes not
-- folded yet (a few thousand rows, scanned) and joins them to the folded days, which
-- usage_daily_totals' primary key (account, day) finds in order. Units are numeric in the
-- rollup; a day past bigint is an error here (decoding numerics costs the reader more).
with changes as (
  select account, day, sum(events)::bigint as events, sum(requests) as requests, sum(tokens) as tokens,
         sum(credits) as credits, sum(cost_micros) as cost_micros
  from usage_daily_changes
  where account = any(@accounts::text[]) and day >= @from::date and day < @to::date
  group by account, day
), totals as (
  select account, day, events, requests, tokens, credits, cost_micros
  from usage_daily_totals
  where account = any(@accounts::text[]) and day >= @from::date and day < @to::date
)
select account, day,
       coalesce(t.events, 0) + coalesce(c.events, 0),
       (coalesce(t.requests, 0) + coalesce(c.requests, 0))::bigint,
       (coalesce(t.tokens, 0) + coalesce(c.tokens, 0))::bigint,
       (coalesce(t.credits, 0) + coalesce(c.credits, 0))::bigint,
       (coalesce(t.cost_micros, 0) + coalesce(c.cost_micros, 0))::bigint
from totals t
full join changes c using (account, day)
where (coalesce(t.events, 0) + coalesce(c.events, 0), coalesce(t.requests, 0) + coalesce(c.requests, 0),
       coalesce(t.tokens, 0) + coalesce(c.tokens, 0), coalesce(t.credits, 0) + coalesce(c.credits, 0),
       coalesce(t.cost_micros, 0) + coalesce(c.cost_micros, 0)) <> (0, 0, 0, 0, 0)
order by account, day
