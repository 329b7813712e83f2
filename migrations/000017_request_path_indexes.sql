-- Two indexes of idem_record that every Reserve and Complete wrote and no
-- request reads:
-- - idem_record_active_by_principal counted a principal's unfinished records
--   for the quota until the count moved to the gate rows (migration 13);
--   the census reads the unfinished records through the recoverer's index
--   (idem_record_by_lease_end, the same predicate).
-- - idem_record_by_state_age ordered every record, tombstones included, by
--   state and age: an entry at Reserve and another at Complete (its update
--   makes a new row version). Its one reader was the console's UNKNOWN
--   queue, which the recoverer's index serves as well (UNKNOWN records are
--   in it); operators' listings by state and age match any of several
--   states or none (`state = ANY(…)` or no condition), which this index
--   never served: they read the table, as before.
DROP INDEX idem_record_active_by_principal;
DROP INDEX idem_record_by_state_age;
