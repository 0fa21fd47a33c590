-- Every API key, revoked ones too (a revoked key is refused as revoked, not as unknown).
select id, account, hash, created_at, revoked_at from api_keys
