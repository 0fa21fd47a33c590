-- The billing details of the orgs in @orgs.
select org, legal_name, address, city, postal_code, region, country, email, tax_id,
       coalesce(currency, ''), tax_rate_bp, updated_at, updated_by
from billing_details
where org = any(@orgs)
