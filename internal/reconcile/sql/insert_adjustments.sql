-- Records a batch of corrections of run @run_id, one array element per correction, in the
-- arrays' order. A correction recorded before (by a run that died) is the row already there
-- (the unique keys of adjustments): nothing is inserted for it.
insert into adjustments (run_id, kind, org, account, level, unit, quota_period, period, amount, reason, source_event)
select @run_id, k, o, a, l, u, w, p::date, n, r, nullif(s, '')
from unnest(@kinds::text[], @orgs::text[], @accounts::text[], @levels::text[], @units::text[],
            @quota_periods::text[], @periods::text[], @amounts::bigint[], @reasons::text[], @source_events::text[])
  with ordinality as t(k, o, a, l, u, w, p, n, r, s, i)
order by i
on conflict do nothing
