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

CREATE FUNCTION idem_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM new_records WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')) THEN
        INSERT INTO idem_quota_gate AS g (tenant_id, principal, operation, api_revision, active)
        SELECT tenant_id, principal, operation, api_revision, count(*)::int FROM new_records
         WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')
         GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (tenant_id, principal, operation, api_revision) DO UPDATE SET active = g.active + EXCLUDED.active;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION idem_count_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A record keeps its tenant and scope (its key) in every update, and with
    -- them its principal, operation and API revision.
    IF EXISTS (SELECT FROM old_records o JOIN new_records n USING (tenant_id, scope)
                WHERE (o.state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')) <> (n.state IN ('RESERVED', 'EXECUTING', 'UNKNOWN'))) THEN
        INSERT INTO idem_quota_gate AS g (tenant_id, principal, operation, api_revision, active)
        SELECT n.tenant_id, n.principal, n.operation, n.api_revision,
               sum(CASE WHEN n.state IN ('RESERVED', 'EXECUTING', 'UNKNOWN') THEN 1 ELSE -1 END)::int
          FROM old_records o JOIN new_records n USING (tenant_id, scope)
         WHERE (o.state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')) <> (n.state IN ('RESERVED', 'EXECUTING', 'UNKNOWN'))
         GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (tenant_id, principal, operation, api_revision) DO UPDATE SET active = g.active + EXCLUDED.active;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION idem_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM old_records WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')) THEN
        INSERT INTO idem_quota_gate AS g (tenant_id, principal, operation, api_revision, active)
        SELECT tenant_id, principal, operation, api_revision, -count(*)::int FROM old_records
         WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')
         GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (tenant_id, principal, operation, api_revision) DO UPDATE SET active = g.active + EXCLUDED.active;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER idem_record_count_inserted AFTER INSERT ON idem_record
    REFERENCING NEW TABLE AS new_records FOR EACH STATEMENT EXECUTE FUNCTION idem_count_inserted();
CREATE TRIGGER idem_record_count_updated AFTER UPDATE ON idem_record
    REFERENCING OLD TABLE AS old_records NEW TABLE AS new_records FOR EACH STATEMENT EXECUTE FUNCTION idem_count_updated();
CREATE TRIGGER idem_record_count_deleted AFTER DELETE ON idem_record
    REFERENCING OLD TABLE AS old_records FOR EACH STATEMENT EXECUTE FUNCTION idem_count_deleted();

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
