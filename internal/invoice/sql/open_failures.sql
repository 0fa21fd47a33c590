-- The orgs with a failed invoice for @period (invoice_failures) and still no invoice.
select distinct f.org
from invoice_failures f
where f.period = @period
  and not exists (select 1 from invoices i where i.org = f.org and i.period = f.period)
order by f.org
