-- effect_possible now says whether ANY effect attempt of the record is not
-- NO_EFFECT. It used to follow only the latest attempt of each effect, so a
-- record whose first attempt was CONFIRMED (or PENDING, or INDETERMINATE) and
-- whose retry was resolved NO_EFFECT counted as untouched: it could be
-- released, rejected or taken over and run again. This corrects the flag on
-- every record, and a record that was released in that state (RESERVED with
-- no lease) becomes UNKNOWN, as it would have when its lease ended, so that
-- recovery settles it instead of a retry running it again.
--
-- Runs as the tables' owner under forced row-level security: bound to every
-- tenant for this transaction only.
SELECT set_config('idem.all_tenants', 'on', true);

UPDATE idem_record r
   SET effect_possible = true, updated_at = now()
 WHERE NOT r.effect_possible
   AND EXISTS (SELECT 1 FROM idem_effect_attempt a
                WHERE a.tenant_id = r.tenant_id AND a.operation_id = r.operation_id AND a.status <> 'NO_EFFECT');

WITH released AS (
    UPDATE idem_record
       SET state = 'UNKNOWN', recovering = false, lease_expires_at = now(), updated_at = now()
     WHERE state = 'RESERVED' AND lease_expires_at IS NULL AND effect_possible
 RETURNING tenant_id, operation_id, operation, api_revision, generation, state
)
INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail)
SELECT tenant_id, operation_id, operation, api_revision, 'UNKNOWN', generation, state, 'migration',
       '{"why": "released although an earlier effect attempt may have had an effect"}'
  FROM released;
