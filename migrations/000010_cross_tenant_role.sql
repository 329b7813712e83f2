-- Row-level security binds the serving role for real.
--
-- Until now every role got one policy: the bound tenant, or every tenant
-- when the transaction set idem.all_tenants. Any statement running as
-- idem_server could set that itself and read every tenant. Now:
-- - idem_server (every request) sees and writes only the tenant its
--   transaction is bound to; nothing it can set widens that;
-- - idem_cross_tenant, a role of its own that the coordinator uses on a
--   separate small pool, does the work that spans tenants (the recoverer,
--   the retention sweep, the census, operators' listings over several
--   tenants, operation-level events, policies and switches);
-- - the tables' owner keeps the binding it had, so that data migrations
--   bind themselves as before.
-- A serving login must be a member of idem_server only: a login that is also
-- a member of idem_cross_tenant (or the owner, or a superuser) could switch
-- roles and step around all of this (SECURITY.md).

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idem_cross_tenant') THEN
        CREATE ROLE idem_cross_tenant NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN NULL;
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'the migrating role may not create roles'
            USING HINT = 'have an administrator run: CREATE ROLE idem_cross_tenant NOLOGIN; then migrate again';
END
$$;

DO $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO idem_cross_tenant', current_schema());
END
$$;

-- What cross-tenant work needs, and no more: records are never inserted or
-- deleted by it, only swept; events are appended.
GRANT SELECT, UPDATE                 ON idem_record         TO idem_cross_tenant;
GRANT SELECT, DELETE                 ON idem_effect_attempt TO idem_cross_tenant;
GRANT SELECT, INSERT                 ON idem_event          TO idem_cross_tenant;
GRANT SELECT, INSERT                 ON idem_policy         TO idem_cross_tenant;
GRANT SELECT, INSERT, UPDATE         ON idem_operation      TO idem_cross_tenant;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_job_lease      TO idem_cross_tenant;

-- What the serving role no longer does: the sweep deletes attempts, the jobs
-- hold their leases, operators publish policies and set switches, all on the
-- cross-tenant pool.
REVOKE DELETE                 ON idem_effect_attempt FROM idem_server;
REVOKE INSERT                 ON idem_policy         FROM idem_server;
REVOKE INSERT, UPDATE         ON idem_operation      FROM idem_server;
REVOKE SELECT, INSERT, UPDATE, DELETE ON idem_job_lease FROM idem_server;

DROP POLICY idem_record_bound_tenant         ON idem_record;
DROP POLICY idem_effect_attempt_bound_tenant ON idem_effect_attempt;
DROP POLICY idem_event_bound_tenant          ON idem_event;
DROP POLICY idem_quota_gate_bound_tenant     ON idem_quota_gate;

CREATE POLICY idem_record_serving ON idem_record TO idem_server
    USING (tenant_id = nullif(current_setting('idem.tenant', true), ''))
    WITH CHECK (tenant_id = nullif(current_setting('idem.tenant', true), ''));
CREATE POLICY idem_effect_attempt_serving ON idem_effect_attempt TO idem_server
    USING (tenant_id = nullif(current_setting('idem.tenant', true), ''))
    WITH CHECK (tenant_id = nullif(current_setting('idem.tenant', true), ''));
-- Operation-level events (tenant_id '') are never the serving role's: '' is no binding.
CREATE POLICY idem_event_serving ON idem_event TO idem_server
    USING (tenant_id = nullif(current_setting('idem.tenant', true), ''))
    WITH CHECK (tenant_id = nullif(current_setting('idem.tenant', true), ''));
CREATE POLICY idem_quota_gate_serving ON idem_quota_gate TO idem_server
    USING (tenant_id = nullif(current_setting('idem.tenant', true), ''))
    WITH CHECK (tenant_id = nullif(current_setting('idem.tenant', true), ''));

CREATE POLICY idem_record_cross_tenant         ON idem_record         TO idem_cross_tenant USING (true) WITH CHECK (true);
CREATE POLICY idem_effect_attempt_cross_tenant ON idem_effect_attempt TO idem_cross_tenant USING (true) WITH CHECK (true);
CREATE POLICY idem_event_cross_tenant          ON idem_event          TO idem_cross_tenant USING (true) WITH CHECK (true);

-- The owner, for data migrations: bound to a tenant, or to all of them
-- explicitly for one transaction, as before.
DO $$
DECLARE
    owner name := (SELECT tableowner FROM pg_tables WHERE schemaname = current_schema() AND tablename = 'idem_record');
    tbl text;
BEGIN
    FOREACH tbl IN ARRAY ARRAY['idem_record', 'idem_effect_attempt', 'idem_event', 'idem_quota_gate'] LOOP
        EXECUTE format(
            'CREATE POLICY %I ON %I TO %I
                 USING (tenant_id = nullif(current_setting(''idem.tenant'', true), '''') OR current_setting(''idem.all_tenants'', true) = ''on'')
                 WITH CHECK (tenant_id = nullif(current_setting(''idem.tenant'', true), '''') OR current_setting(''idem.all_tenants'', true) = ''on'')',
            tbl || '_owner', tbl, owner);
    END LOOP;
END
$$;
