-- Issues credit note @number of @kind crediting invoice @invoice_id of @org (settling
-- amendment @amendment_id, NULL for a void).
insert into credit_notes (number, issuer, org, invoice_id, kind, reason, currency, subtotal_minor, tax_rate_bp,
                          tax_minor, total_minor, issued_at, issued_by, seller, buyer, amendment_id)
values (@number, @issuer, @org, @invoice_id, @kind, @reason, @currency, @subtotal_minor, @tax_rate_bp,
        @tax_minor, @subtotal_minor::bigint + @tax_minor::bigint, @issued_at, @issued_by, @seller, @buyer, @amendment_id)
returning id
