-- Records a batch's dead letters of @topic, one array element per message, keyed by its
-- Kafka position.
insert into dead_letters (topic, "partition", "offset", key, value, error)
select @topic, d.p, d.o, d.k, d.v, d.e
from unnest(@partitions::integer[], @offsets::bigint[], @keys::bytea[], @values::bytea[], @errors::text[]) as d(p, o, k, v, e)
on conflict on constraint dead_letters_position_key do nothing
