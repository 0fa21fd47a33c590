-- +goose Up
-- Reconcile corrects daily quota counters too. A correction names the window of the counter
-- it changes: quota_period 'month' (period is the first day of the month, as before) or 'day'
-- (period is the day, UTC). The unique keys include the window, so an event's refund of the
-- November counter and of the 1 November counter are two rows.

ALTER TABLE adjustments
    ADD COLUMN quota_period text NOT NULL DEFAULT 'month' CHECK (quota_period IN ('month', 'day'));
ALTER TABLE adjustments DROP CONSTRAINT adjustments_period_check;
ALTER TABLE adjustments
    ADD CONSTRAINT adjustments_period_check CHECK (quota_period = 'day' OR extract(day FROM period) = 1);

DROP INDEX adjustments_event_key;
CREATE UNIQUE INDEX adjustments_event_key ON adjustments (kind, source_event, account, unit, quota_period, period)
    WHERE kind <> 'drift_restore';
DROP INDEX adjustments_drift_key;
CREATE UNIQUE INDEX adjustments_drift_key ON adjustments (run_id, account, unit, quota_period, period)
    WHERE kind = 'drift_restore';

COMMENT ON COLUMN adjustments.quota_period IS 'Window of the quota counter changed: month or day (UTC).';
COMMENT ON COLUMN adjustments.period IS 'First day of the month of a monthly counter, or the day of a daily one.';

-- +goose Down
-- Fails (changing nothing) while daily corrections exist: the audit log is not dropped.
DROP INDEX adjustments_drift_key;
CREATE UNIQUE INDEX adjustments_drift_key ON adjustments (run_id, account, unit, period)
    WHERE kind = 'drift_restore';
DROP INDEX adjustments_event_key;
CREATE UNIQUE INDEX adjustments_event_key ON adjustments (kind, source_event, account, unit, period)
    WHERE kind <> 'drift_restore';
ALTER TABLE adjustments DROP CONSTRAINT adjustments_period_check;
ALTER TABLE adjustments ADD CONSTRAINT adjustments_period_check CHECK (extract(day FROM period) = 1);
ALTER TABLE adjustments DROP COLUMN quota_period;
COMMENT ON COLUMN adjustments.period IS 'First day of the month of the quota counter changed.';
