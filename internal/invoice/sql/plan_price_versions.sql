-- The price versions of plan @plan, by version (as price_versions.sql).
select plan, version, effective_period, currency, base_fee_minor, created_at
from plan_prices
where plan = @plan
order by plan, version
