-- The units every price version of every plan bills, by plan, version and unit: the
-- included units, and the tiers as four arrays by from_units (up_to_units 0: no end;
-- empty: no tiers).
select u.plan, u.version, u.unit, u.included_units,
       coalesce(array_agg(t.from_units order by t.from_units) filter (where t.plan is not null), '{}'),
       coalesce(array_agg(coalesce(t.up_to_units, 0) order by t.from_units) filter (where t.plan is not null), '{}'),
       coalesce(array_agg(t.price_minor order by t.from_units) filter (where t.plan is not null), '{}'),
       coalesce(array_agg(t.per_units order by t.from_units) filter (where t.plan is not null), '{}')
from plan_price_units u
left join plan_price_tiers t on t.plan = u.plan and t.version = u.version and t.unit = u.unit
group by u.plan, u.version, u.unit
order by u.plan, u.version, u.unit
