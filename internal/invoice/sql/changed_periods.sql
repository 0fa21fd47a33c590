-- The closed periods before @before whose billing changed since @since (the previous
-- close): an outcome or a void of one of their events ingested since, an amendment, or an
-- invoice of theirs voided or reissued. A close corrects them as it does the periods of its
-- window, however old.
select distinct x.period
from (
    select e.billing_period as period
    from usage_outcomes o join usage_events e on e.event_id = o.event_id
    where o.ingest_time > @since
    union
    select e.billing_period
    from usage_voids v join usage_events e on e.event_id = v.event_id
    where v.ingest_time > @since
    union
    select billing_period from amendments where amended_at > @since
    union
    select i.period
    from invoice_status_changes c join invoices i on i.id = c.invoice_id
    where c.changed_at > @since and c.to_status = 'void'
) x
join periods p on p.period = x.period
where x.period < @before
order by x.period
