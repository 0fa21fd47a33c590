-- Marks delivery @id delivered (HTTP @last_status) if the lease @lease_until is still its.
update webhook_deliveries set attempts = attempts + 1, status = 'delivered',
  delivered_at = now(), lease_until = null, last_status = @last_status, last_error = null, updated_at = now()
where id = @id and lease_until = @lease_until
