-- The invoices whose ids are in @ids, without their lines.
select id, coalesce(number, ''), org, period::text, plan, price_version, currency, status, seller, buyer,
       subtotal_minor, tax_rate_bp, tax_minor, total_minor, issued_at, due_at, replaces, coalesce(reason, ''),
       coalesce(issued_by, '')
from invoices
where id = any(@ids)
