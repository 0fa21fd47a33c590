-- What each of @accounts, with everything under it, used per UTC day from @from until
-- before @to: the rows of usage_daily (migration 00028), the days without usage left out.
-- usage_daily_totals' primary key (account, day) finds the folded days; the changes not
-- folded yet (a few thousand rows) are scanned.
select account, day, events, requests, tokens, credits, cost_micros
from usage_daily
where account = any(@accounts::text[])
  and day >= @from::date
  and day < @to::date
order by account, day
