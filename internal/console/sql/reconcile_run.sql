-- Reconcile run @run_id, with the number of adjustments it made.
select r.run_id::text, r.started_at, r.finished_at, r.dry_run, r.summary,
       (select count(*) from adjustments a where a.run_id = r.run_id)
from reconcile_runs r
where r.run_id = @run_id::uuid
