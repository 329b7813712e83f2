-- A principal's count of unfinished records (its quota, migration 13) is now
-- kept by the statements that change records, in the same statement as the
-- change (src/registry/statements/parts.ts, countOpened and countClosed),
-- instead of by statement triggers on idem_record. The triggers captured
-- every changed row into transition tables and ran PL/pgSQL for every
-- statement that changed a record, whether or not a count moved; with the
-- count Reserve then read by a statement of its own, about a fifth of
-- PostgreSQL's CPU per Reserve + Complete (npm run bench -- --level
-- database). The rule is unchanged: a record counts while it is
-- RESERVED, EXECUTING or UNKNOWN; the gate row stays locked until the
-- transaction ends, so that racing reservations count one after another;
-- several gate rows are changed in key order.
--
-- The statements that move a count: a new record (+1, refused over the
-- quota), a tombstone reused (+1, refused over the quota), a record finished
-- by Complete or by an operator's Reconcile (-1). No other statement takes a
-- record into or out of those states. Data migrations that do must move the
-- counts themselves.
DROP TRIGGER idem_record_count_inserted ON idem_record;
DROP TRIGGER idem_record_count_updated ON idem_record;
DROP TRIGGER idem_record_count_deleted ON idem_record;
DROP FUNCTION idem_count_unfinished();
DROP TYPE idem_count_change;

-- The check of a count against its quota, read from the gate row the
-- statement has just changed (and locked): over the quota it raises IDQ01,
-- which aborts the transaction, so that the COMMIT behind it rolls the new
-- record back (as migration 12's did for the count read after the trigger).
CREATE FUNCTION idem_count_within_quota(active integer, quota integer) RETURNS integer
    LANGUAGE plpgsql AS $$
BEGIN
    IF active > quota THEN
        RAISE EXCEPTION USING ERRCODE = 'IDQ01', MESSAGE = format('the principal has %s unfinished records, over its quota of %s', active, quota);
    END IF;
    RETURN active;
END
$$;

-- Coordinators from before this migration count nothing themselves: without
-- the function their count reads, their Reserves fail instead of admitting
-- records that no count holds.
DROP FUNCTION idem_within_quota(integer, integer);

-- Every count afresh from the records, as migration 13 made them: dropping
-- the triggers locked idem_record until this migration commits, so no
-- record changes meanwhile.
SELECT set_config('idem.all_tenants', 'on', true);
UPDATE idem_quota_gate SET active = 0 WHERE active <> 0;
INSERT INTO idem_quota_gate AS g (tenant_id, principal, operation, api_revision, active)
SELECT tenant_id, principal, operation, api_revision, count(*)::int FROM idem_record
 WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')
 GROUP BY 1, 2, 3, 4
ON CONFLICT (tenant_id, principal, operation, api_revision) DO UPDATE SET active = EXCLUDED.active;
