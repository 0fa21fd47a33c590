-- Lock the issuer's sequence of @kind for @year (made at 0 when new) and read its last
-- number: the no-op update takes the row's lock until the transaction ends. A close
-- numbers its invoices from there and writes the row back once.
insert into document_sequences as s (issuer, kind, year, last)
values (@issuer, @kind, @year, 0)
on conflict (issuer, kind, year) do update set last = s.last
returning last
