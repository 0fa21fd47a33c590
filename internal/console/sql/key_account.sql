-- The account and org of API key @key.
select k.account, a.org from api_keys k join accounts a on a.id = k.account where k.id = @key
