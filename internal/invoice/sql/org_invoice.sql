-- @org's invoice of @period with its lines, by line number (as period_invoices.sql).
select i.id, i.org, i.period::text, i.plan, i.price_version, i.currency, i.subtotal_minor, i.total_minor, i.issued_at, i.status,
       l.kind, l.account_path, coalesce(l.unit, ''), l.quantity, l.unit_price_minor, l.per_units, l.amount_minor,
       coalesce(l.for_period::text, '')
from invoices i
join invoice_lines l on l.invoice_id = i.id
where i.period = @period and i.org = @org
order by i.org, l.line_no
