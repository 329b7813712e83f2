import { statement, type RowColumns } from "../statement.js";
import { ATTEMPT_COLUMNS, ATTEMPT_ROW, INSERTED_ROW, logChanges, nowPlusMs, RECORD_COLUMNS, RECORD_ROW, type AttemptRow, type InsertedRow, type RecordRow } from "./parts.js";
import { finishAssignments } from "./records.js";

/**
 * The statements of coalesced Reserves and Completes (batching.ts,
 * Coalescer): the same guarded insert, quota gate, lock and fenced finish as
 * their one-record forms in records.ts and quota.ts, for many records of one
 * tenant and one caller in one statement, each row keeping its own values
 * (arrays, one element per request, unnested together). Every record is
 * still decided alone: the statements return each one's row, and the registry
 * applies the same rules to each as for a single request.
 *
 * Locks are taken in one order (scopes and operation ids sorted; the gates
 * of the quota counts sorted by the database's triggers), so that batches
 * running at once, on any number of coordinators, wait for one another but
 * never deadlock.
 */

/** One element per new record; every array has the batch's length. */
export interface NewRecords {
  tenant: string;
  caller: string;
  scopes: Buffer[];
  operationIds: string[];
  principals: string[];
  operations: string[];
  apiRevisions: number[];
  schemaRevisions: number[];
  fingerprints: Buffer[];
  states: string[];
  leaseMs: number[];
  acquisitionIds: string[];
  writerEpochs: number[];
}

/**
 * Reserve's guarded insert (records.ts insertOrFind) for a batch of distinct
 * scopes: inserts the new ones in scope order, logs ACCEPTED for each, and
 * returns every new record (`inserted` true) and every existing one as this
 * statement's snapshot shows it. A scope whose record was committed after the
 * snapshot comes back in neither part: its request is decided again alone.
 */
export const insertOrFindMany = statement<NewRecords, InsertedRow>(
  "insertOrFindMany",
  `WITH input AS (
     SELECT * FROM unnest(:scopes::bytea[], :operationIds::uuid[], :principals::text[], :operations::text[], :apiRevisions::int[],
                          :schemaRevisions::int[], :fingerprints::bytea[], :states::text[], :leaseMs::bigint[], :acquisitionIds::uuid[],
                          :writerEpochs::bigint[])
       AS i(i_scope, i_operation_id, i_principal, i_operation, i_api_revision, i_schema_revision, i_fingerprint, i_state, i_lease_ms,
            i_acquisition_id, i_writer_epoch)
   ), inserted AS (
     INSERT INTO idem_record (tenant_id, scope, operation_id, principal, operation, api_revision, schema_revision,
                              fingerprint, state, generation, lease_expires_at, acquisition_id, writer_epoch)
     SELECT :tenant, i_scope, i_operation_id, i_principal, i_operation, i_api_revision, i_schema_revision,
            i_fingerprint, i_state, 1, ${nowPlusMs("i_lease_ms")}, i_acquisition_id, i_writer_epoch
       FROM input ORDER BY i_scope
     ON CONFLICT (tenant_id, scope) DO NOTHING
     RETURNING ${RECORD_COLUMNS}
   ), ${logChanges("inserted", "'ACCEPTED'")}
   SELECT true AS inserted, ${RECORD_COLUMNS}, now() AS db_now FROM inserted
   UNION ALL
   SELECT false, ${RECORD_COLUMNS}, now() FROM idem_record WHERE tenant_id = :tenant AND scope = ANY(:scopes::bytea[])`,
  INSERTED_ROW,
);

/**
 * The records this transaction made, by scope and the acquisition id it
 * minted for each (a replay's scope matches none), with the quota of each
 * one's principal under its policy.
 */
export interface MadeRecords {
  tenant: string;
  scopes: Buffer[];
  acquisitionIds: string[];
  quotas: number[];
}

const MADE = `SELECT r.principal, r.operation, r.api_revision, m.m_quota AS quota FROM idem_record r
   JOIN unnest(:scopes::bytea[], :acquisitionIds::uuid[], :quotas::int[]) AS m(m_scope, m_acquisition_id, m_quota)
     ON r.scope = m.m_scope AND r.acquisition_id = m.m_acquisition_id
  WHERE r.tenant_id = :tenant`;

/**
 * For every principal with a new record in this transaction, its count of
 * unfinished records (quota.ts countActive); over a quota it fails with
 * IDQ01, and the whole batch rolls back.
 */
export const countActiveMany = statement<MadeRecords, { principal: string; operation: string; api_revision: number; active: number }>(
  "countActiveMany",
  `SELECT g.principal, g.operation, g.api_revision, idem_within_quota(g.active, made.quota) AS active
     FROM idem_quota_gate g
     JOIN (SELECT DISTINCT principal, operation, api_revision, quota FROM (${MADE}) m) made USING (principal, operation, api_revision)
    WHERE g.tenant_id = :tenant`,
  { principal: true, operation: true, api_revision: true, active: true },
);

/** Records by operation id. */
export interface IdRefs {
  tenant: string;
  operationIds: string[];
}

/** Locks a batch's records (records.ts lockRecord) in operation id order, for the rest of the transaction. */
export const lockRecords = statement<IdRefs, RecordRow>(
  "lockRecords",
  `SELECT ${RECORD_COLUMNS}, now() AS db_now FROM idem_record
    WHERE tenant_id = :tenant AND operation_id = ANY(:operationIds::uuid[])
    ORDER BY operation_id FOR UPDATE`,
  RECORD_ROW,
);

/** An attempt of one of a batch's records. */
export interface BatchAttemptRow extends AttemptRow {
  operation_id: string;
}

const BATCH_ATTEMPT_ROW: RowColumns<BatchAttemptRow> = { operation_id: true, ...ATTEMPT_ROW };

/** The attempts of a batch's records (attempts.ts loadAttempts), read once their locks are held. */
export const loadAttemptsMany = statement<IdRefs, BatchAttemptRow>(
  "loadAttemptsMany",
  `SELECT operation_id, ${ATTEMPT_COLUMNS} FROM idem_effect_attempt
    WHERE tenant_id = :tenant AND operation_id = ANY(:operationIds::uuid[])
    ORDER BY operation_id, attempt_number`,
  BATCH_ATTEMPT_ROW,
);

/** One element per record to finish. */
export interface Finishes {
  tenant: string;
  caller: string;
  operationIds: string[];
  generations: number[];
  outcomes: string[];
  keepMs: number[];
  snapshotStatuses: number[];
  snapshotMediaTypes: string[];
  snapshotLocations: string[];
  snapshotBusinessVersions: string[];
  snapshotHeaders: string[];
  snapshotBodies: Buffer[];
  snapshotDigests: Buffer[];
  snapshotKeyIds: Array<string | null>;
  eventDetails: string[];
}

/**
 * Complete (records.ts finish) for a batch of records this transaction has
 * locked, each fenced by the generation it was read at, each with its
 * COMPLETED event.
 */
export const finishMany = statement<Finishes, RecordRow>(
  "finishMany",
  `WITH input AS (
     SELECT * FROM unnest(:operationIds::uuid[], :generations::bigint[], :outcomes::text[], :keepMs::bigint[], :snapshotStatuses::int[],
                          :snapshotMediaTypes::text[], :snapshotLocations::text[], :snapshotBusinessVersions::text[], :snapshotHeaders::text[],
                          :snapshotBodies::bytea[], :snapshotDigests::bytea[], :snapshotKeyIds::text[], :eventDetails::text[])
       AS f(f_operation_id, f_generation, f_outcome, f_keep_ms, f_status, f_media_type, f_location, f_business_version, f_headers,
            f_body, f_digest, f_key_id, f_event_detail)
   ), updated AS (
     UPDATE idem_record SET ${finishAssignments({
       outcome: "f_outcome",
       keepMs: "f_keep_ms",
       snapshotStatus: "f_status",
       snapshotMediaType: "f_media_type",
       snapshotLocation: "f_location",
       snapshotBusinessVersion: "f_business_version",
       snapshotHeaders: "f_headers",
       snapshotBody: "f_body",
       snapshotDigest: "f_digest",
       snapshotKeyId: "f_key_id",
     })}, updated_at = now()
       FROM input
      WHERE tenant_id = :tenant AND operation_id = f_operation_id AND generation = f_generation
      RETURNING ${RECORD_COLUMNS}, f_event_detail
   ), ${logChanges("updated", "'COMPLETED'", "f_event_detail::jsonb")}
   SELECT ${RECORD_COLUMNS}, now() AS db_now FROM updated`,
  RECORD_ROW,
);
