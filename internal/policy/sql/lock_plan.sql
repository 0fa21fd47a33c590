-- Plan @id, locked for its update; no row if there is none.
select id from plans where id = @id for update
