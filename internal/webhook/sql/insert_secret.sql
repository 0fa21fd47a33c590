-- Gives @endpoint a new current secret (in a rotation, once the current one has an expiry:
-- expire_secret.sql).
insert into webhook_secrets (endpoint, secret) values (@endpoint, @secret)
