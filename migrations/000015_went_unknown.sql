-- A record that has once been UNKNOWN stays under recovery's rules for good.
-- UNKNOWN says that no machine can tell whether an effect happened; nothing
-- said afterwards by the owner that lost track (an attempt resolved
-- NO_EFFECT after its lease ended, say) takes that back. So from then on the
-- record is never released, never taken over, and no later generation
-- registers an effect it did not have: it is only recovered (its registered
-- effects replayed under their original downstream keys, its attempts
-- resolved, then completed) or reconciled by an operator, who alone may
-- reopen it to a fresh execution, with evidence.
--
-- The flag used to be implied by the state alone, so a record resolved back
-- to "nothing possible" while UNKNOWN could be released and run again.
ALTER TABLE idem_record ADD COLUMN went_unknown boolean NOT NULL DEFAULT false;

-- Runs as the tables' owner under forced row-level security: bound to every
-- tenant for this transaction only.
SELECT set_config('idem.all_tenants', 'on', true);

-- The records that are or were UNKNOWN: UNKNOWN now, held by a recovery
-- worker, or logged going UNKNOWN at some point of their life. A record
-- that went UNKNOWN and was since handed back (RESERVED, without a lease)
-- becomes UNKNOWN again, as it would have stayed.
UPDATE idem_record r
   SET went_unknown = true
 WHERE r.state = 'UNKNOWN' OR r.recovering
    OR EXISTS (SELECT 1 FROM idem_event e
                WHERE e.tenant_id = r.tenant_id AND e.operation_id = r.operation_id AND e.kind = 'UNKNOWN');

WITH handed_back AS (
    UPDATE idem_record
       SET state = 'UNKNOWN', lease_expires_at = now(), updated_at = now()
     WHERE went_unknown AND state = 'RESERVED' AND tombstoned_at IS NULL
 RETURNING tenant_id, operation_id, operation, api_revision, generation, state
)
INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail)
SELECT tenant_id, operation_id, operation, api_revision, 'UNKNOWN', generation, state, 'migration',
       '{"why": "released after it had been UNKNOWN: it is recovered, never run again"}'
  FROM handed_back;

-- Only a record that went UNKNOWN is held by recovery.
ALTER TABLE idem_record ADD CONSTRAINT idem_record_recovery_follows_unknown CHECK (NOT recovering OR went_unknown);
