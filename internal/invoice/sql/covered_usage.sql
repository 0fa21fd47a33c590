-- Per org and unit, what the org's own credit grants covered of the events of @period
-- that billable_usage.sql sums (credits_covered); numeric, given as text like it.
select org, unit, sum(covered)::text
from credits_covered
where billing_period = @period and not late and ingest_time <= @closed_at
group by org, unit
