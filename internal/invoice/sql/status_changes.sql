-- The status changes of invoice @invoice_id, oldest first: its audit trail.
select from_status, to_status, reason, changed_by, changed_at
from invoice_status_changes
where invoice_id = @invoice_id
order by id
