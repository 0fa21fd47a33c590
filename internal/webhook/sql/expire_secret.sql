-- Makes @endpoint's current secret a previous one, signing for @overlap_s seconds more.
update webhook_secrets set expires_at = now() + make_interval(secs => @overlap_s)
where endpoint = @endpoint and expires_at is null
