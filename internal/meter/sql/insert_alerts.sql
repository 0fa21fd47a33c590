-- Records a batch's thresholds, one array element per threshold; a redelivered one is its
-- first row.
insert into usage_alerts (id, event_time, org, account, path, unit, kind, threshold, at_units,
  value, period, arming_grant, triggered_by, admitted, payload)
select a.id, a.t, a.org, a.account, string_to_array(a.path, '/'), a.unit, a.kind, a.threshold, a.at_units,
  a.value, a.period, nullif(a.arming, ''), a.triggered_by, a.admitted, a.payload::jsonb
from unnest(@ids::text[], @event_times::timestamptz[], @orgs::text[], @accounts::text[], @paths::text[],
            @units::text[], @kinds::text[], @thresholds::bigint[], @at_units::bigint[], @values::bigint[],
            @periods::text[], @arming_grants::text[], @triggered_by::text[], @admitted::boolean[], @payloads::text[])
  as a(id, t, org, account, path, unit, kind, threshold, at_units, value, period, arming, triggered_by, admitted, payload)
order by 1
on conflict (id) do nothing
