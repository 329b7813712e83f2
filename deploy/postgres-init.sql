-- Runs once, when the compose rehearsal's PostgreSQL is first initialized.
-- The owner (POSTGRES_USER) migrates; the coordinators log in as a role that
-- owns nothing and acts as idem_server (the migrations grant it what the
-- registry needs).
CREATE ROLE idem_server NOLOGIN;
CREATE ROLE coordinator LOGIN PASSWORD 'coordinator' IN ROLE idem_server;
