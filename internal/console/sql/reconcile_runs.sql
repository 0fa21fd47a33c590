-- Reconcile runs started before (@before_at, @before_id), newest first, at most @limit,
-- each with the number of adjustments it made.
select r.run_id::text, r.started_at, r.finished_at, r.dry_run, r.summary,
       (select count(*) from adjustments a where a.run_id = r.run_id)
from reconcile_runs r
where (r.started_at, r.run_id) < (@before_at::timestamptz, @before_id::uuid)
order by r.started_at desc, r.run_id desc
limit @limit
