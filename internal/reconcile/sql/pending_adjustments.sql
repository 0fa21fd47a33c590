-- The corrections not applied yet, oldest first; period as its label (YYYY-MM, or
-- YYYY-MM-DD for a daily counter).
select id, kind, org, account, level, unit, quota_period,
       to_char(period, case quota_period when 'day' then 'YYYY-MM-DD' else 'YYYY-MM' end), amount, reason, coalesce(source_event, '')
from adjustments
where applied_at is null
order by id
