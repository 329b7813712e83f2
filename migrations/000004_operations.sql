-- Operating the shared registry: operation-level events, the jobs' leader
-- leases, and what tombstones and reconciliation need.

-- Events about an operation rather than one record (mode and epoch changes)
-- have no record: tenant_id '' and no operation_id. Every event names its
-- operation, so the log can be read per operation.
ALTER TABLE idem_event ALTER COLUMN operation_id DROP NOT NULL;
ALTER TABLE idem_event ALTER COLUMN generation DROP NOT NULL;
ALTER TABLE idem_event ALTER COLUMN state DROP NOT NULL;
ALTER TABLE idem_event ADD COLUMN operation text;
ALTER TABLE idem_event ADD COLUMN api_revision integer;
-- StreamEvents reads the whole log in event order, from a cursor.
CREATE INDEX idem_event_in_order ON idem_event (event_id);

-- One row per background job (recoverer, retention sweeper): the replica
-- whose lease is live runs it; the others wait for the lease to end. A row,
-- not an advisory lock, so it works on distributed PostgreSQL too.
CREATE TABLE idem_job_lease (
    job        text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);

-- The retention sweeper finds finished records whose retention ended.
CREATE INDEX idem_record_retention_due
    ON idem_record (retain_until)
    WHERE tombstoned_at IS NULL AND state IN ('SUCCEEDED', 'FAILED_FINAL', 'REJECTED');

-- Operators list records by state and age.
CREATE INDEX idem_record_by_state_age ON idem_record (state, created_at);
