-- +goose Up
-- Reconcile checks the corrections of its run after applying them (WHERE run_id = $1): without
-- an index that reads every correction ever recorded, a table that only grows. The index also
-- serves the foreign key to reconcile_runs.

CREATE INDEX adjustments_run_idx ON adjustments (run_id);

-- +goose Down
DROP INDEX adjustments_run_idx;
