-- Creates account @id; no row back if the id is taken.
insert into accounts (id, kind, parent, org, plan, concurrency, priority, shadow)
values (@id, @kind, @parent, @org, @plan, @concurrency, @priority, @shadow)
on conflict (id) do nothing
returning created_at, updated_at
