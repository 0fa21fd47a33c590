-- Plan @id as stored (its limits, grants and prices are read apart); no row if there is none.
select rank, concurrency, priority, shadow from plans where id = @id
