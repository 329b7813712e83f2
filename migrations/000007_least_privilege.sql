-- Least privilege and tenant isolation inside the database.
--
-- The coordinator serves requests as idem_server: a role that owns nothing,
-- cannot log in by itself, and holds only the grants below (records are
-- never deleted, events and policy revisions never changed). Migrations run
-- as the owner of the tables; a login used by the server is granted
-- idem_server and connects with `-c role=idem_server` (IDEM_DB_ROLE).
--
-- Every table has row-level security, forced so that it binds the owner too.
-- A tenant table shows a transaction only the rows of the tenant it is bound
-- to (set_config('idem.tenant', …, true) at BEGIN, src/registry/db.ts), or
-- every row when it is bound to all tenants (operators' listings, background
-- jobs). A transaction bound to nothing sees and writes nothing. Data
-- migrations must bind themselves the same way.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idem_server') THEN
        CREATE ROLE idem_server NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
    END IF;
EXCEPTION
    -- Another schema's migration created it at the same moment.
    WHEN duplicate_object OR unique_violation THEN NULL;
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'the migrating role may not create roles'
            USING HINT = 'have an administrator run: CREATE ROLE idem_server NOLOGIN; then migrate again';
END
$$;

DO $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO idem_server', current_schema());
END
$$;

GRANT SELECT, INSERT, UPDATE         ON idem_record         TO idem_server;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_effect_attempt TO idem_server;
GRANT SELECT, INSERT                 ON idem_event          TO idem_server;
GRANT SELECT, INSERT                 ON idem_policy         TO idem_server;
GRANT SELECT, INSERT, UPDATE         ON idem_operation      TO idem_server;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_job_lease      TO idem_server;

-- Tenant tables: the binding decides which rows exist.
ALTER TABLE idem_record         ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE idem_effect_attempt ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE idem_event          ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;

CREATE POLICY idem_record_bound_tenant ON idem_record
    USING (tenant_id = nullif(current_setting('idem.tenant', true), '') OR current_setting('idem.all_tenants', true) = 'on')
    WITH CHECK (tenant_id = nullif(current_setting('idem.tenant', true), '') OR current_setting('idem.all_tenants', true) = 'on');
CREATE POLICY idem_effect_attempt_bound_tenant ON idem_effect_attempt
    USING (tenant_id = nullif(current_setting('idem.tenant', true), '') OR current_setting('idem.all_tenants', true) = 'on')
    WITH CHECK (tenant_id = nullif(current_setting('idem.tenant', true), '') OR current_setting('idem.all_tenants', true) = 'on');
-- Operation-level events (tenant_id '') belong to no tenant: only a
-- transaction bound to all tenants sees or writes them.
CREATE POLICY idem_event_bound_tenant ON idem_event
    USING (tenant_id = nullif(current_setting('idem.tenant', true), '') OR current_setting('idem.all_tenants', true) = 'on')
    WITH CHECK (tenant_id = nullif(current_setting('idem.tenant', true), '') OR current_setting('idem.all_tenants', true) = 'on');

-- Shared tables hold no tenant's data: every row is visible, and the grants
-- above decide who may change what.
ALTER TABLE idem_policy            ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE idem_operation         ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE idem_job_lease         ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE idem_schema_migrations ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;

CREATE POLICY idem_policy_shared            ON idem_policy            USING (true) WITH CHECK (true);
CREATE POLICY idem_operation_shared         ON idem_operation         USING (true) WITH CHECK (true);
CREATE POLICY idem_job_lease_shared         ON idem_job_lease         USING (true) WITH CHECK (true);
CREATE POLICY idem_schema_migrations_shared ON idem_schema_migrations USING (true) WITH CHECK (true);
