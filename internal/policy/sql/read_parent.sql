-- The kind and org of parent @id, key-share locked: it cannot go away before its child's insert commits.
select kind, org from accounts where id = @id for key share
