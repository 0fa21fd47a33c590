-- The credit notes whose ids are in @ids, with the number of the invoice each credits.
select n.id, n.number, n.org, n.invoice_id, coalesce(i.number, ''), n.kind, n.reason, n.currency, n.subtotal_minor,
       n.tax_rate_bp, n.tax_minor, n.total_minor, n.issued_at, n.issued_by, n.seller, n.buyer,
       n.amendment_id
from credit_notes n
join invoices i on i.id = n.invoice_id
where n.id = any(@ids)
