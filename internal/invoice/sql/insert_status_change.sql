-- Record the change of invoice @invoice_id's status from @from_status to @to_status, why and
-- by whom: the audit row the invoice's UPDATE needs (invoice_immutable checks it).
insert into invoice_status_changes (invoice_id, from_status, to_status, reason, changed_by)
values (@invoice_id, @from_status, @to_status, @reason, @changed_by)
returning id, changed_at
