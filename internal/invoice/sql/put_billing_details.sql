-- Write @org's billing details (insert or replace) and return them as stored.
insert into billing_details (org, legal_name, address, city, postal_code, region, country, email, tax_id,
                             currency, tax_rate_bp, updated_at, updated_by)
values (@org, @legal_name, @address, @city, @postal_code, @region, @country, @email, @tax_id,
        @currency, @tax_rate_bp, now(), @updated_by)
on conflict (org) do update
set legal_name = excluded.legal_name, address = excluded.address, city = excluded.city,
    postal_code = excluded.postal_code, region = excluded.region, country = excluded.country,
    email = excluded.email, tax_id = excluded.tax_id, currency = excluded.currency,
    tax_rate_bp = excluded.tax_rate_bp, updated_at = excluded.updated_at, updated_by = excluded.updated_by
returning updated_at
