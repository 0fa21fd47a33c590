-- Dead letters with an id below @before, newest first, at most @limit: where each came
-- from, why the meter refused it, when, the value's size, and the first @head bytes of its
-- key and value (never the whole of a message that may be large).
select id, topic, partition, "offset", error, received_at, octet_length(value),
       substring(value from 1 for @head), substring(key from 1 for @head)
from dead_letters
where id < @before
order by id desc
limit @limit
