import { statement } from "../statement.js";
import { ATTEMPT_COLUMNS, ATTEMPT_ROW, type AttemptRow } from "./parts.js";
import type { IdRef } from "./records.js";

/** The statements of effect attempts (idem_effect_attempt), always run under their record's lock. */

/**
 * A record's attempts, read by a statement of its own after the record's
 * lock is held: under READ COMMITTED a new statement sees every attempt
 * committed by the writer the lock waited for, which a subquery of the
 * locking statement (with its older snapshot) could miss.
 */
export const loadAttempts = statement<IdRef, AttemptRow>(
  "loadAttempts",
  `SELECT ${ATTEMPT_COLUMNS} FROM idem_effect_attempt WHERE tenant_id = :tenant AND operation_id = :operationId ORDER BY attempt_number`,
  ATTEMPT_ROW,
);

/**
 * Registers an attempt before its downstream call, PENDING, with the effect's
 * stable downstream key and the id of the call that registers it (so that a
 * re-run of that call after a lost COMMIT finds it).
 */
export const insertAttempt = statement<
  IdRef & { attemptNumber: number; effect: string; provider: string; downstreamKey: string; generation: number; registrationId: string },
  AttemptRow
>(
  "insertAttempt",
  `INSERT INTO idem_effect_attempt (tenant_id, operation_id, attempt_number, effect, provider, downstream_key, status, generation, registration_id)
   VALUES (:tenant, :operationId, :attemptNumber, :effect, :provider, :downstreamKey, 'PENDING', :generation, :registrationId)
   RETURNING ${ATTEMPT_COLUMNS}`,
  ATTEMPT_ROW,
);

/**
 * An operator's reopening of an UNKNOWN record (records.ts reopen): every
 * attempt not yet resolved is resolved NO_EFFECT, as the evidence says.
 */
export const resolveOpenAttempts = statement<IdRef, AttemptRow>(
  "resolveOpenAttempts",
  `UPDATE idem_effect_attempt SET status = 'NO_EFFECT', resolved_at = now()
    WHERE tenant_id = :tenant AND operation_id = :operationId AND status IN ('PENDING', 'INDETERMINATE')
    RETURNING ${ATTEMPT_COLUMNS}`,
  ATTEMPT_ROW,
);

/** Records what a downstream call did; an empty handle keeps the one stored. */
export const resolveAttempt = statement<IdRef & { attemptNumber: number; status: string; providerHandle: string }, AttemptRow>(
  "resolveAttempt",
  `UPDATE idem_effect_attempt
      SET status = :status, provider_handle = CASE WHEN :providerHandle = '' THEN provider_handle ELSE :providerHandle END, resolved_at = now()
    WHERE tenant_id = :tenant AND operation_id = :operationId AND attempt_number = :attemptNumber
    RETURNING ${ATTEMPT_COLUMNS}`,
  ATTEMPT_ROW,
);
