-- Records that invoice @invoice_id bills the late events @event_ids (of @billing_periods,
-- pairwise): each is billed once.
insert into invoice_late_events (event_id, billing_period, invoice_id)
select *, @invoice_id::bigint from unnest(@event_ids::text[], @billing_periods::date[])
