-- The recurring grants of plan @plan, one row per unit.
select unit, amount, priority from plan_grants where plan = @plan
