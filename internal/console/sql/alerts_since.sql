-- Usage alerts fired since @since, newest first, at most @limit, each row with how many
-- fired since @since in all.
select count(*) over (), id, event_time, account, unit, kind, threshold, value, period
from usage_alerts
where event_time >= @since
order by event_time desc, id desc
limit @limit
