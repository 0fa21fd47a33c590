-- Record an amendment of @events events of @org's closed period @period, and return it.
insert into amendments (org, billing_period, action, requests, tokens, credits, cost_micros, reason, settle, events, amended_by)
values (@org, @period, @action, @requests, @tokens, @credits, @cost_micros, @reason, @settle, @events, @amended_by)
returning id, amended_at
