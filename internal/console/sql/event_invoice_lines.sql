-- The invoice lines event @event_id landed on: the lines of its account path
-- (@account_path) on the invoices of its org and month that are not void, and on those
-- that billed it late.
with inv as (
    select l.invoice_id as id from invoice_late_events l where l.event_id = @event_id
    union
    select i.id from invoices i where i.org = @org and i.period = @period
)
select i.id, coalesce(i.number, ''), i.status, i.currency, l.line_no, l.kind, coalesce(l.unit, ''), l.quantity,
       l.amount_minor, coalesce(to_char(l.for_period, 'YYYY-MM'), '')
from inv
join invoices i on i.id = inv.id
join invoice_lines l on l.invoice_id = i.id
where i.status <> 'void' and (l.account_path = @account_path or l.kind = 'base_fee')
order by i.id, l.line_no
