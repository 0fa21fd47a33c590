-- The plan other than @id that has rank @rank, if any: ranks are unique.
select id from plans where rank = @rank and id <> @id
