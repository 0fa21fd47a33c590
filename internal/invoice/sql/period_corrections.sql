-- The (org, unit) rows of @org's closed period @period that corrections.sql would bill.
select org, plan, price_version, unit, billed_quantity::text, billable_quantity::text, billed_covered::text,
       covered_quantity::text, billed_amount::text
from finance_period_billing
where period = @period and org = @org
  and (billed_quantity <> billable_quantity or billed_covered <> covered_quantity
       or billed_amount <> price_usage(plan, price_version, unit, billed_quantity - billed_covered))
order by unit
