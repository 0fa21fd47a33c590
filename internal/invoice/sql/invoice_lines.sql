-- The lines of the invoices whose ids are in @ids, by invoice and line number.
select invoice_id, kind, account_path, coalesce(unit, ''), quantity, unit_price_minor, per_units, amount_minor,
       coalesce(for_period::text, '')
from invoice_lines
where invoice_id = any(@ids)
order by invoice_id, line_no
