import { statement } from "../statement.js";

/**
 * The quota of unfinished records per principal (migrations/000009): a
 * Reserve that made a record locks its principal's gate and then counts, in
 * a statement that starts once the lock is held, so that racing reservations
 * count one after another. Both do nothing unless this transaction made the
 * scope's record (`scope` with `acquisitionId`), so that a replay never waits
 * on a gate nor counts.
 */

/** Whose quota, and the record this transaction may have made. */
export interface QuotaSubject {
  tenant: string;
  principal: string;
  operation: string;
  apiRevision: number;
  scope: Buffer;
  acquisitionId: string;
}

/**
 * Locks the principal's gate for the rest of the transaction, creating it on
 * first use. ON CONFLICT DO UPDATE locks the existing row even though WHERE
 * false changes nothing, and it locks the latest version, also one committed
 * after this statement began.
 */
export const holdQuotaGate = statement<QuotaSubject>(
  "holdQuotaGate",
  `INSERT INTO idem_quota_gate (tenant_id, principal, operation, api_revision)
   SELECT :tenant, :principal, :operation, :apiRevision FROM idem_record
    WHERE tenant_id = :tenant AND scope = :scope AND acquisition_id = :acquisitionId
   ON CONFLICT (tenant_id, principal, operation, api_revision) DO UPDATE SET principal = EXCLUDED.principal WHERE false`,
);

/**
 * The principal's unfinished records, counted up to one past `quota`; over
 * the quota the statement fails with IDQ01 (migrations/000012), so that the
 * transaction cannot commit the new record.
 */
export const countActive = statement<QuotaSubject & { quota: number }, { active: number }>(
  "countActive",
  `SELECT idem_within_quota(count(*)::int, :quota) AS active FROM (
     SELECT 1 FROM idem_record
      WHERE tenant_id = :tenant AND principal = :principal AND operation = :operation AND api_revision = :apiRevision
        AND state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')
      LIMIT :quota + 1) capped
   WHERE EXISTS (SELECT 1 FROM idem_record WHERE tenant_id = :tenant AND scope = :scope AND acquisition_id = :acquisitionId)`,
);

/** The SQLSTATE of a count over its quota (idem_within_quota). */
export const QUOTA_EXCEEDED_SQLSTATE = "IDQ01";
