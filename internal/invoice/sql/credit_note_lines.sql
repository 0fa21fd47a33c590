-- The lines of the credit notes whose ids are in @ids, by note and line number.
select credit_note_id, kind, account_path, coalesce(unit, ''), quantity, unit_price_minor, per_units, amount_minor,
       coalesce(for_period::text, '')
from credit_note_lines
where credit_note_id = any(@ids)
order by credit_note_id, line_no
