-- A principal's unfinished records (its quota) are counted on its gate row,
-- kept by the database at every change of a record's state, whichever
-- coordinator version writes it, instead of being counted at each Reserve:
-- that count walked the index entries of the principal's recently finished
-- records too (row versions not yet vacuumed), a cost that grew with the
-- principal's traffic and with every open transaction holding them back.
--
-- The count changes in the same statement as the records, and the gate row
-- stays locked until the transaction ends: of racing reservations of one
-- principal, each one's count includes every record committed before it
-- (READ COMMITTED re-reads the latest gate row after waiting), so that no
-- more than the quota can commit. Gate rows are changed in key order, so
-- that statements changing several principals' counts never deadlock.
ALTER TABLE idem_quota_gate ADD COLUMN active integer NOT NULL DEFAULT 0;

-- One change of a principal's count: +1 or -1 per record.
CREATE TYPE idem_count_change AS (tenant_id text, principal text, operation text, api_revision integer, change integer);

-- Applies changes to the counts, summed per principal, in key order.
CREATE FUNCTION idem_apply_count_changes(changes idem_count_change[]) RETURNS void LANGUAGE sql AS $$
    INSERT INTO idem_quota_gate AS g (tenant_id, principal, operation, api_revision, active)
    SELECT tenant_id, principal, operation, api_revision, sum(change)::int FROM unnest(changes)
     GROUP BY 1, 2, 3, 4 HAVING sum(change) <> 0 ORDER BY 1, 2, 3, 4
    ON CONFLICT (tenant_id, principal, operation, api_revision) DO UPDATE SET active = g.active + EXCLUDED.active;
$$;

-- +1 for each record the statement left unfinished, -1 for each it found
-- unfinished: an update keeps a record's tenant, principal, operation and
-- API revision, so the sum per principal is the change of its count.
CREATE FUNCTION idem_count_unfinished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changes idem_count_change[] := '{}';
BEGIN
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        changes := changes || ARRAY(SELECT ROW(tenant_id, principal, operation, api_revision, 1)::idem_count_change
                                      FROM new_records WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN'));
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        changes := changes || ARRAY(SELECT ROW(tenant_id, principal, operation, api_revision, -1)::idem_count_change
                                      FROM old_records WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN'));
    END IF;
    -- Most updates change no count (a lease renewed, a takeover, a lease ended): no gate is touched then.
    IF EXISTS (SELECT FROM unnest(changes) GROUP BY tenant_id, principal, operation, api_revision HAVING sum(change) <> 0) THEN
        PERFORM idem_apply_count_changes(changes);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER idem_record_count_inserted AFTER INSERT ON idem_record
    REFERENCING NEW TABLE AS new_records FOR EACH STATEMENT EXECUTE FUNCTION idem_count_unfinished();
CREATE TRIGGER idem_record_count_updated AFTER UPDATE ON idem_record
    REFERENCING OLD TABLE AS old_records NEW TABLE AS new_records FOR EACH STATEMENT EXECUTE FUNCTION idem_count_unfinished();
CREATE TRIGGER idem_record_count_deleted AFTER DELETE ON idem_record
    REFERENCING OLD TABLE AS old_records FOR EACH STATEMENT EXECUTE FUNCTION idem_count_unfinished();

-- The triggers write a gate row only when a count changes. The jobs across
-- tenants (idem_cross_tenant) never make a record unfinished or finished,
-- so that role keeps no privilege on the gates.

-- The counts of the records already there.
SELECT set_config('idem.all_tenants', 'on', true);
INSERT INTO idem_quota_gate AS g (tenant_id, principal, operation, api_revision, active)
SELECT tenant_id, principal, operation, api_revision, count(*)::int FROM idem_record
 WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')
 GROUP BY 1, 2, 3, 4
ON CONFLICT (tenant_id, principal, operation, api_revision) DO UPDATE SET active = EXCLUDED.active;
