-- Whether @period is closed (its closed_at; NULL while it is open) and whether a later
-- period is.
select (select closed_at from periods where period = @period),
       exists (select 1 from periods where period > @period)
