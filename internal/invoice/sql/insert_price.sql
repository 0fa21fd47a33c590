-- Adds price version @version of plan @plan, effective from @effective_period
-- (0001-01-01: from the start).
insert into plan_prices (plan, version, effective_period, currency, base_fee_minor)
values (@plan, @version, @effective_period, @currency, @base_fee_minor)
returning created_at
