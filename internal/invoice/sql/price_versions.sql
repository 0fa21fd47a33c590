-- Every price version of every plan, by plan and version (their units: price_units.sql).
select plan, version, effective_period, currency, base_fee_minor, created_at
from plan_prices
order by plan, version
