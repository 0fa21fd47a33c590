-- Records a batch's voids, one array element per void; a request's first void is kept.
insert into usage_voids (event_id, attempt, reason, void_time, source, kafka_partition, kafka_offset)
select * from unnest(@event_ids::text[], @attempts::text[], @reasons::text[], @void_times::timestamptz[],
                     @sources::text[], @kafka_partitions::integer[], @kafka_offsets::bigint[])
order by 1, 6, 7
on conflict (event_id) do nothing
