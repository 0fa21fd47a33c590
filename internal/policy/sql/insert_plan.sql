-- Creates plan @id; no row affected if the id is taken.
insert into plans (id, rank, concurrency, priority, shadow)
values (@id, @rank, @concurrency, @priority, @shadow)
on conflict (id) do nothing
