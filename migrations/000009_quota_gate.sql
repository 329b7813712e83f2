-- The quota of unfinished records per principal (max_active_per_principal)
-- is exact: every Reserve that adds an unfinished record locks its
-- principal's gate row and then counts, and holds the lock until it commits
-- or rolls back, so that racing reservations (on any number of coordinators)
-- count one after the other and no more than the quota commit. One row per
-- principal, operation and API revision that ever reserved; a row, not an
-- advisory lock, so that it works on distributed PostgreSQL too.
CREATE TABLE idem_quota_gate (
    tenant_id    text    NOT NULL,
    principal    text    NOT NULL,
    operation    text    NOT NULL,
    api_revision integer NOT NULL,
    PRIMARY KEY (tenant_id, principal, operation, api_revision)
);

-- INSERT … ON CONFLICT DO UPDATE needs UPDATE (it only locks: WHERE false).
GRANT SELECT, INSERT, UPDATE ON idem_quota_gate TO idem_server;

ALTER TABLE idem_quota_gate ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
CREATE POLICY idem_quota_gate_bound_tenant ON idem_quota_gate
    USING (tenant_id = nullif(current_setting('idem.tenant', true), '') OR current_setting('idem.all_tenants', true) = 'on')
    WITH CHECK (tenant_id = nullif(current_setting('idem.tenant', true), '') OR current_setting('idem.all_tenants', true) = 'on');
