-- Issues @org's invoice for @period as document @number, priced with @plan's @price_version:
-- the lines sum to @subtotal_minor, taxed at @tax_rate_bp; @replaces (NULL: none) is the
-- voided invoice a reissue replaces, for @reason; @issued_by issues it.
insert into invoices (org, period, plan, price_version, currency, subtotal_minor, tax_rate_bp, tax_minor, total_minor,
                      issued_at, due_at, status, number, issuer, seller, buyer, replaces, reason, issued_by)
values (@org, @period, @plan, @price_version, @currency, @subtotal_minor, @tax_rate_bp, @tax_minor,
        @subtotal_minor::bigint + @tax_minor::bigint, @issued_at, @due_at, 'issued', @number, @issuer, @seller, @buyer, @replaces, @reason, @issued_by)
returning id
