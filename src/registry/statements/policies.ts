import type { PolicyDocument } from "../../policy/document.js";
import type { OperationMode } from "../../policy/operations.js";
import { NO_ROWS, statement, type NoRow, type RowColumns } from "../statement.js";

/**
 * Operation policies and switches (idem_policy, idem_operation): small
 * reference tables, written by operators, read whole by every coordinator.
 */

/** An operation at an API revision. */
export interface OperationKey {
  operation: string;
  apiRevision: number;
}

/** Makes the operation's switch row exist (it is also the lock that orders changes of the operation). */
export const ensureOperation = statement<OperationKey & { updatedBy: string }, NoRow>(
  "ensureOperation",
  `INSERT INTO idem_operation (operation, api_revision, updated_by) VALUES (:operation, :apiRevision, :updatedBy)
   ON CONFLICT (operation, api_revision) DO NOTHING`,
  NO_ROWS,
);

/** Locks the operation's switch row for the rest of the transaction, and reads it. */
export const lockOperation = statement<OperationKey, { mode: OperationMode; writer_epoch: string; updated_at: Date; updated_by: string }>(
  "lockOperation",
  "SELECT mode, writer_epoch, updated_at, updated_by FROM idem_operation WHERE operation = :operation AND api_revision = :apiRevision FOR UPDATE",
  { mode: true, writer_epoch: true, updated_at: true, updated_by: true },
);

/** A published revision as its reads return it (POLICY_COLUMNS): the document as it was published (jsonb). */
export interface PolicyRow {
  document: PolicyDocument;
  digest: Buffer;
  published_at: Date;
  published_by: string;
}

const POLICY_ROW: RowColumns<PolicyRow> = { document: true, digest: true, published_at: true, published_by: true };

const POLICY_COLUMNS = Object.keys(POLICY_ROW).join(", ");

/** The published revisions of one operation at an API revision, oldest first. */
export const revisionsOf = statement<OperationKey, PolicyRow>(
  "revisionsOf",
  `SELECT ${POLICY_COLUMNS} FROM idem_policy WHERE operation = :operation AND api_revision = :apiRevision ORDER BY schema_revision`,
  POLICY_ROW,
);

/** Publishes one revision (rows of idem_policy are never changed afterwards). */
export const insertPolicy = statement<OperationKey & { schemaRevision: number; document: string; digest: Buffer; publishedBy: string }, PolicyRow>(
  "insertPolicy",
  `INSERT INTO idem_policy (operation, api_revision, schema_revision, document, digest, published_by)
   VALUES (:operation, :apiRevision, :schemaRevision, :document::jsonb, :digest, :publishedBy) RETURNING ${POLICY_COLUMNS}`,
  POLICY_ROW,
);

/** Every published revision (of one operation, or of all when null), by operation, API revision, schema revision. */
export const listPolicies = statement<{ operation: string | null }, PolicyRow>(
  "listPolicies",
  `SELECT ${POLICY_COLUMNS} FROM idem_policy WHERE :operation::text IS NULL OR operation = :operation
    ORDER BY operation, api_revision, schema_revision`,
  POLICY_ROW,
);

/** Every operation's switches, by operation and API revision. */
export const listControls = statement<
  Record<string, never>,
  { operation: string; api_revision: number; mode: OperationMode; writer_epoch: string; updated_at: Date; updated_by: string }
>("listControls", "SELECT operation, api_revision, mode, writer_epoch, updated_at, updated_by FROM idem_operation ORDER BY operation, api_revision", {
  operation: true,
  api_revision: true,
  mode: true,
  writer_epoch: true,
  updated_at: true,
  updated_by: true,
});

/**
 * Changes an operation's switches (null: unchanged) and logs each change of
 * `events` (a JSON array of {kind, detail}) as an operation-level event
 * (tenant ''), in one statement: a change is never left without its event.
 */
export const changeControl = statement<
  OperationKey & { mode: string | null; writerEpoch: number | null; updatedBy: string; events: string },
  { mode: OperationMode; writer_epoch: string; updated_at: Date }
>(
  "changeControl",
  `WITH changed AS (
     UPDATE idem_operation
        SET mode = COALESCE(:mode, mode), writer_epoch = COALESCE(:writerEpoch, writer_epoch), updated_at = now(), updated_by = :updatedBy
      WHERE operation = :operation AND api_revision = :apiRevision
     RETURNING mode, writer_epoch, updated_at
   ), logged AS (
     INSERT INTO idem_event (tenant_id, operation, api_revision, kind, caller, detail)
     SELECT '', :operation, :apiRevision, e.kind, :updatedBy, e.detail FROM changed, jsonb_to_recordset(:events::jsonb) AS e(kind text, detail jsonb)
   )
   SELECT mode, writer_epoch, updated_at FROM changed`,
  { mode: true, writer_epoch: true, updated_at: true },
);
