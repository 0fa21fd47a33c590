-- Records plan @plan's recurring grant of @unit.
insert into plan_grants (plan, unit, amount, priority)
values (@plan, @unit, @amount, @priority)
