-- Every plan id, smallest first (an empty array when there is none).
select coalesce(array_agg(id order by rank), '{}') from plans
