-- What each org's account paths bill for @period (finance_billable_events) of the events
-- its close covered (ingested by @closed_at), late events left out (billed at the margin of their period: late_events.sql). The sums are numeric,
-- given as text: a sum past bigint fails that org's invoice in Go, not the statement for
-- every org.
select org, account_path, sum(billable_requests)::text, sum(billable_tokens)::text,
       sum(billable_credits)::text, sum(billable_cost_micros)::text
from finance_billable_events
where billing_period = @period and not late and ingest_time <= @closed_at
group by org, account_path
