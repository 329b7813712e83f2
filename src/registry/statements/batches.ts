import { statement, type RowColumns } from "../statement.js";
import {
  ATTEMPT_COLUMNS,
  ATTEMPT_ROW,
  countMany,
  INSERTED_ROW,
  logChanges,
  nowPlusMs,
  RECORD_COLUMNS,
  RECORD_ROW,
  UNFINISHED,
  type AttemptRow,
  type InsertedRow,
  type RecordRow,
} from "./parts.js";
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
 * Locks are taken in one order (scopes and operation ids sorted, then the
 * gates of the quota counts sorted by principal), so that batches running
 * at once, on any number of coordinators, wait for one another but never
 * deadlock.
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
  /** The quota of each record's principal, under its request's policy. */
  quotas: number[];
}

/**
 * Reserve's guarded insert (records.ts insertOrFind) for a batch of distinct
 * scopes: inserts the new ones in scope order, logs ACCEPTED for each, counts
 * them against their principals' quotas (over a quota the statement fails
 * with IDQ01, and the whole batch rolls back; a principal's records of
 * requests judged under different quotas are held to the lowest), and
 * returns every new record (`inserted` true) and every existing one as this
 * statement's snapshot shows it. A scope whose record was committed after the
 * snapshot comes back in neither part: its request is decided again alone.
 */
export const insertOrFindMany = statement<NewRecords, InsertedRow>(
  "insertOrFindMany",
  `WITH input AS (
     SELECT * FROM unnest(:scopes::bytea[], :operationIds::uuid[], :principals::text[], :operations::text[], :apiRevisions::int[],
                          :schemaRevisions::int[], :fingerprints::bytea[], :states::text[], :leaseMs::bigint[], :acquisitionIds::uuid[],
                          :writerEpochs::bigint[], :quotas::int[])
       AS i(i_scope, i_operation_id, i_principal, i_operation, i_api_revision, i_schema_revision, i_fingerprint, i_state, i_lease_ms,
            i_acquisition_id, i_writer_epoch, i_quota)
   ), inserted AS (
     INSERT INTO idem_record (tenant_id, scope, operation_id, principal, operation, api_revision, schema_revision,
                              fingerprint, state, generation, lease_expires_at, acquisition_id, writer_epoch)
     SELECT :tenant, i_scope, i_operation_id, i_principal, i_operation, i_api_revision, i_schema_revision,
            i_fingerprint, i_state, 1, ${nowPlusMs("i_lease_ms")}, i_acquisition_id, i_writer_epoch
       FROM input ORDER BY i_scope
     ON CONFLICT (tenant_id, scope) DO NOTHING
     RETURNING ${RECORD_COLUMNS}
   ), ${logChanges("inserted", "'ACCEPTED'")}, ${countMany(
     "inserted",
     "count(*)",
     `idem_count_within_quota(g.active, (SELECT min(i_quota) FROM input
                                            WHERE i_principal = g.principal AND i_operation = g.operation AND i_api_revision = g.api_revision))`,
   )}
   SELECT true AS inserted, ${RECORD_COLUMNS}, now() AS db_now FROM inserted
   UNION ALL
   SELECT false, ${RECORD_COLUMNS}, now() FROM idem_record WHERE tenant_id = :tenant AND scope = ANY(:scopes::bytea[])`,
  INSERTED_ROW,
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
 * locked, each fenced by the generation it was read at (only unfinished
 * ones match), each with its COMPLETED event, leaving its principal's quota
 * count.
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
      WHERE tenant_id = :tenant AND operation_id = f_operation_id AND generation = f_generation AND ${UNFINISHED}
      RETURNING ${RECORD_COLUMNS}, f_event_detail
   ), ${logChanges("updated", "'COMPLETED'", "f_event_detail::jsonb")}, ${countMany("updated", "-count(*)")}
   SELECT ${RECORD_COLUMNS}, now() AS db_now FROM updated`,
  RECORD_ROW,
);
