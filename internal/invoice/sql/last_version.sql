-- Locks plan @plan (FOR UPDATE: its versions are numbered one at a time) and reads its
-- last price version (0: none yet) and the last closed period (NULL: none); no row when
-- the plan does not exist.
select coalesce((select max(version) from plan_prices where plan = p.id), 0),
       (select max(period) from periods)
from plans p
where p.id = @plan
for update
