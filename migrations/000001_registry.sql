-- The registry: one record per scope, the effect attempts of each operation,
-- and an append-only event log. Every primary key and unique index leads with
-- tenant_id, so that the tables can be distributed by tenant (Citus) and every
-- transaction touches one tenant.

CREATE TABLE idem_record (
    tenant_id                 text        NOT NULL,
    -- SHA-256 of the framed (tenant, principal, operation, api_revision, key);
    -- the key itself is never stored.
    scope                     bytea       NOT NULL CHECK (octet_length(scope) = 32),
    operation_id              uuid        NOT NULL,
    principal                 text        NOT NULL,
    operation                 text        NOT NULL,
    api_revision              integer     NOT NULL CHECK (api_revision >= 1),
    schema_revision           integer     NOT NULL CHECK (schema_revision >= 1),
    fingerprint               bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    state                     text        NOT NULL CHECK (state IN
                                  ('RESERVED', 'EXECUTING', 'SUCCEEDED', 'FAILED_FINAL', 'REJECTED', 'UNKNOWN')),
    -- The fencing token: every write names it and succeeds only if it is current.
    generation                bigint      NOT NULL CHECK (generation >= 1),
    -- Recovery ownership (after Claim RECOVER): only registered effects may be replayed.
    recovering                boolean     NOT NULL DEFAULT false,
    -- Leases are in database time, never in a caller's clock.
    lease_expires_at          timestamptz,
    -- Who took the current generation; lets a writer whose COMMIT outcome was
    -- lost with its connection recognize its own write when it re-reads.
    acquisition_id            uuid        NOT NULL,
    writer_epoch              bigint      NOT NULL DEFAULT 0,
    -- Whether some effect's latest attempt is not NO_EFFECT. Kept in step with
    -- idem_effect_attempt under the record's row lock, so that the fenced
    -- takeover UPDATE can test it in its WHERE clause: READ COMMITTED
    -- re-checks the locked row itself, not rows of other tables.
    effect_possible           boolean     NOT NULL DEFAULT false,
    snapshot_status           integer,
    snapshot_media_type       text,
    snapshot_location         text,
    snapshot_business_version text,
    snapshot_headers          jsonb,
    snapshot_body             bytea,
    snapshot_digest           bytea,
    created_at                timestamptz NOT NULL DEFAULT now(),
    updated_at                timestamptz NOT NULL DEFAULT now(),
    completed_at              timestamptz,
    retain_until              timestamptz,
    tombstoned_at             timestamptz,
    PRIMARY KEY (tenant_id, scope),
    CONSTRAINT idem_record_operation_id UNIQUE (tenant_id, operation_id),
    -- A terminal record always has its snapshot digest; others never do.
    CONSTRAINT idem_record_terminal_has_digest CHECK (
        (state IN ('SUCCEEDED', 'FAILED_FINAL', 'REJECTED')) = (snapshot_digest IS NOT NULL)),
    CONSTRAINT idem_record_only_executing_recovers CHECK (NOT recovering OR state = 'EXECUTING')
);

-- Counts a principal's unfinished records for the quota, without touching finished ones.
CREATE INDEX idem_record_active_by_principal
    ON idem_record (tenant_id, principal, operation, api_revision)
    WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN');

CREATE TABLE idem_effect_attempt (
    tenant_id       text        NOT NULL,
    operation_id    uuid        NOT NULL,
    attempt_number  integer     NOT NULL CHECK (attempt_number >= 1),
    effect          text        NOT NULL,
    provider        text        NOT NULL,
    downstream_key  text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('PENDING', 'CONFIRMED', 'NO_EFFECT', 'INDETERMINATE')),
    provider_handle text        NOT NULL DEFAULT '',
    generation      bigint      NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    PRIMARY KEY (tenant_id, operation_id, attempt_number),
    FOREIGN KEY (tenant_id, operation_id) REFERENCES idem_record (tenant_id, operation_id)
);

CREATE TABLE idem_event (
    tenant_id    text        NOT NULL,
    event_id     bigint      GENERATED ALWAYS AS IDENTITY,
    operation_id uuid        NOT NULL,
    -- ACCEPTED, TAKEOVER, CLAIMED, RECOVERY_CLAIMED, UNKNOWN, EFFECT_RECORDED,
    -- EFFECT_RESOLVED, COMPLETED, RELEASED, …
    kind         text        NOT NULL,
    generation   bigint      NOT NULL,
    state        text        NOT NULL,
    -- The authenticated caller that caused the event.
    caller       text        NOT NULL,
    detail       jsonb       NOT NULL DEFAULT '{}',
    at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, event_id)
);

-- The event log is evidence for reconciliation: it only grows.
CREATE FUNCTION idem_event_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'idem_event is append-only' USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER idem_event_append_only
    BEFORE UPDATE OR DELETE ON idem_event
    FOR EACH ROW EXECUTE FUNCTION idem_event_is_append_only();
