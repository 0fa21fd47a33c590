-- Adds a tier of @unit to price version @version of plan @plan (@up_to_units NULL: no end).
insert into plan_price_tiers (plan, version, unit, from_units, up_to_units, price_minor, per_units)
values (@plan, @version, @unit, @from_units, @up_to_units, @price_minor, @per_units)
