-- Each org with a failed invoice of a period before @period and still no invoice for it,
-- with the first such period.
select f.org, min(f.period)
from invoice_failures f
where f.period < @period
  and not exists (select 1 from invoices i where i.org = f.org and i.period = f.period)
group by f.org
