-- Take the next number of the issuer's @kind of document for @year: the UPDATE's row lock
-- orders concurrent issuers, and a rollback gives the number back.
insert into document_sequences as s (issuer, kind, year, last)
values (@issuer, @kind, @year, 1)
on conflict (issuer, kind, year) do update set last = s.last + 1
returning last
