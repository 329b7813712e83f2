-- Runs once, when the compose rehearsal's PostgreSQL is first initialized.
-- The owner (POSTGRES_USER) migrates. The coordinators have two logins that
-- own nothing, one per role the migrations grant what it needs: requests act
-- as idem_server (one tenant at a time), the work that spans tenants as
-- idem_cross_tenant. A login is a member of one of them only, so that a
-- serving connection can never switch to the role that sees every tenant.
CREATE ROLE idem_server NOLOGIN;
CREATE ROLE idem_cross_tenant NOLOGIN;
CREATE ROLE coordinator LOGIN PASSWORD 'coordinator' IN ROLE idem_server;
CREATE ROLE coordinator_cross_tenant LOGIN PASSWORD 'coordinator_cross_tenant' IN ROLE idem_cross_tenant;
