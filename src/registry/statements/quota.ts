import { statement } from "../statement.js";

/**
 * The quota of unfinished records per principal (migrations/000009, 000013):
 * the database keeps each principal's count of unfinished records on its
 * gate row, changed by the statement that changes a record (a trigger) and
 * locked until the transaction ends, so that racing reservations count one
 * after another. A Reserve that made a record then reads its principal's
 * count; a replay reads nothing and never waits on a gate.
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
 * The principal's unfinished records, its new one included, when this
 * transaction made the scope's record (nothing otherwise); over `quota` the
 * statement fails with IDQ01 (migrations/000012), so that the transaction
 * cannot commit the new record.
 */
export const countActive = statement<QuotaSubject & { quota: number }, { active: number }>(
  "countActive",
  `SELECT idem_within_quota(g.active, :quota) AS active FROM idem_quota_gate g
    WHERE g.tenant_id = :tenant AND g.principal = :principal AND g.operation = :operation AND g.api_revision = :apiRevision
      AND EXISTS (SELECT 1 FROM idem_record WHERE tenant_id = :tenant AND scope = :scope AND acquisition_id = :acquisitionId)`,
  { active: true },
);

/** The SQLSTATE of a count over its quota (idem_within_quota). */
export const QUOTA_EXCEEDED_SQLSTATE = "IDQ01";
