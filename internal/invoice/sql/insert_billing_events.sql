-- Record billing events in the transaction that made them: webhooks deliver them from there.
insert into billing_events (id, type, org, occurred_at, payload)
select * from unnest(@ids::text[], @types::text[], @orgs::text[], @occurred_at::timestamptz[], @payloads::jsonb[])
