-- Creates API key @id of account @account, stored as the hash of its secret; no row back if the account does not exist.
insert into api_keys (id, account, hash)
select @id, id, @hash from accounts where id = @account
returning created_at
