-- The events amendment @amendment_id amends.
insert into amendment_events (amendment_id, event_id, billing_period)
select @amendment_id, e, @period from unnest(@event_ids::text[]) as e
