-- Logs an attempt of delivery @delivery.
insert into webhook_attempts (delivery, started_at, latency_us, http_status, error, outcome)
values (@delivery, @started_at, @latency_us, @http_status, @error, @outcome)
