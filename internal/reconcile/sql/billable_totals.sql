-- The totals of the events x (billable_as_billed.sql or billable_as_corrected.sql, which
-- this follows): per org, level of the path, window and period, months from @since, days
-- from @since_day. The sums are numeric, given as text: one org's total past bigint is
-- refused in Go for that counter (a bad_total problem), not by an error of the statement
-- for every org.
select x.org, lvl.account, 'month', x.period::timestamp,
       array[sum(x.requests), sum(x.tokens), sum(x.credits), sum(x.cost_micros)]::text[]
from x cross join lateral unnest(x.path) as lvl(account)
where x.period >= @since
group by 1, 2, 3, 4
union all
select x.org, lvl.account, 'day', x.day,
       array[sum(x.requests), sum(x.tokens), sum(x.credits), sum(x.cost_micros)]::text[]
from x cross join lateral unnest(x.path) as lvl(account)
where x.day >= @since_day
group by 1, 2, 3, 4
order by 1, 2, 3, 4
