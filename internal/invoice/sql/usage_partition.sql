-- The partition of usage_events that holds the month @period, as [schema, name]; no row
-- when there is none (no usage that month).
select array[n.nspname::text, c.relname::text]
from pg_inherits i
join pg_class c on c.oid = i.inhrelid
join pg_namespace n on n.oid = c.relnamespace
where i.inhparent = 'usage_events'::regclass and c.relname = 'usage_events_' || to_char(@period::date, 'YYYY_MM')
