-- Every (org, unit) of the closed period @period whose billed units differ from its
-- billable units now, whose credits applied differ from what the org's credits cover now,
-- or whose amount billed differs from the price of what was billed (a void took lines out
-- of the middle of a period's billing): finance_period_billing, live invoices only. One
-- period per statement: the equality reaches into the view's grouped subqueries.
select org, plan, price_version, unit, billed_quantity::text, billable_quantity::text, billed_covered::text,
       covered_quantity::text, billed_amount::text
from finance_period_billing
where period = @period
  and (billed_quantity <> billable_quantity or billed_covered <> covered_quantity
       or billed_amount <> price_usage(plan, price_version, unit, billed_quantity - billed_covered))
order by org, unit
