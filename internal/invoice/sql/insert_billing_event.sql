-- Record a billing event in the transaction that made it: webhooks deliver it from there.
insert into billing_events (id, type, org, occurred_at, payload)
values (@id, @type, @org, @occurred_at, @payload)
