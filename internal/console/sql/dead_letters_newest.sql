-- How many dead letters there are, with the newest: its id, topic, error and when it came.
-- No row when there is none.
select (select count(*) from dead_letters), d.id, d.topic, d.error, d.received_at
from dead_letters d
order by d.id desc
limit 1
