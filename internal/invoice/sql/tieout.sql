-- Every failed check of the invoice tie-out (finance_invoice_tieout), expected and actual
-- as text.
select invoice_id, org, period, "check", unit, expected::text, actual::text
from finance_invoice_tieout
order by invoice_id, "check", unit
