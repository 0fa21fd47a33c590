-- Issues @org's invoice for @period, priced with @plan's @price_version: its subtotal and
-- total are @total_minor.
insert into invoices (org, period, plan, price_version, currency, subtotal_minor, total_minor, issued_at, status)
values (@org, @period, @plan, @price_version, @currency, @total_minor, @total_minor, @issued_at, 'issued')
returning id
