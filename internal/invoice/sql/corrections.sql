-- Every (org, unit) of the closed period @period whose billed units differ from its
-- billable units now, or whose credits applied differ from what the org's credits cover
-- now (finance_period_billing). One period per statement: the equality reaches into the
-- view's grouped subqueries.
select org, plan, price_version, unit, billed_quantity, billable_quantity, billed_covered, covered_quantity
from finance_period_billing
where period = @period and (billed_quantity <> billable_quantity or billed_covered <> covered_quantity)
order by org, unit
