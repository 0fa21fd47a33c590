-- Records a failed attempt of delivery @id if the lease @lease_until is still its: @status
-- is pending (attempted again in @delay_s seconds) or failed (its retry window is over).
update webhook_deliveries set attempts = attempts + 1, status = @status,
  next_attempt_at = now() + make_interval(secs => @delay_s), lease_until = null,
  last_status = @last_status, last_error = @last_error, updated_at = now()
where id = @id and lease_until = @lease_until
