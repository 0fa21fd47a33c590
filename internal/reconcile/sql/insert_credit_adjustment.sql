-- Records a refund or settle @kind of @units given back to grant @grant_id for event @event_id; one recorded before (a run that died) is the row already there.
insert into credit_adjustments (kind, grant_id, event_id, units, reason)
values (@kind, @grant_id, @event_id, @units, @reason)
on conflict do nothing
