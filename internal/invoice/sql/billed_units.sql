-- What @org's live (not void) invoices billed so far for @period of @unit: units (the
-- period's usage lines, and the late and adjustment lines for it), of them the units credits
-- covered (the credits_applied lines for it), and the amount (of the priced lines).
select coalesce(sum(l.quantity) filter (where i.period = @period and l.kind = 'usage'), 0)::bigint
     + coalesce(sum(l.quantity) filter (where l.kind in ('late', 'adjustment') and l.for_period = @period), 0)::bigint,
       coalesce(sum(l.quantity) filter (where l.kind = 'credits_applied' and coalesce(l.for_period, i.period) = @period), 0)::bigint,
       coalesce(sum(l.amount_minor) filter (where coalesce(l.for_period, i.period) = @period
                                            and l.kind in ('included', 'overage_tier', 'late', 'adjustment')), 0)::bigint
from invoices i
join invoice_lines l on l.invoice_id = i.id
where i.org = @org and l.unit = @unit and i.status <> 'void'
