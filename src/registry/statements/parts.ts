import type { RowColumns } from "../statement.js";
import type { EffectStatus, RecordState } from "../../contract/words.js";

/**
 * Pieces of text shared by the registry's statements. Each statement is
 * still whole where it is defined; these only keep a column list, a listing's
 * scope or the event log's insert written once, and the types of the rows
 * they return with the lists of their columns.
 */

/** A record's columns as every read of one selects them (RECORD_COLUMNS). */
export interface RecordColumns {
  tenant_id: string;
  scope: Buffer;
  operation_id: string;
  principal: string;
  operation: string;
  api_revision: number;
  schema_revision: number;
  fingerprint: Buffer;
  state: RecordState;
  /** bigint, as the driver reads it. */
  generation: string;
  recovering: boolean;
  lease_expires_at: Date | null;
  acquisition_id: string;
  /** bigint, as the driver reads it. */
  writer_epoch: string;
  effect_possible: boolean;
  went_unknown: boolean;
  snapshot_status: number | null;
  snapshot_media_type: string | null;
  snapshot_location: string | null;
  snapshot_business_version: string | null;
  snapshot_headers: Array<[string, string]> | null;
  snapshot_body: Buffer | null;
  snapshot_digest: Buffer | null;
  snapshot_key_id: string | null;
  created_at: Date;
  updated_at: Date;
  completed_at: Date | null;
  retain_until: Date | null;
  tombstoned_at: Date | null;
}

const RECORD_COLUMN_LIST: RowColumns<RecordColumns> = {
  tenant_id: true,
  scope: true,
  operation_id: true,
  principal: true,
  operation: true,
  api_revision: true,
  schema_revision: true,
  fingerprint: true,
  state: true,
  generation: true,
  recovering: true,
  lease_expires_at: true,
  acquisition_id: true,
  writer_epoch: true,
  effect_possible: true,
  went_unknown: true,
  snapshot_status: true,
  snapshot_media_type: true,
  snapshot_location: true,
  snapshot_business_version: true,
  snapshot_headers: true,
  snapshot_body: true,
  snapshot_digest: true,
  snapshot_key_id: true,
  created_at: true,
  updated_at: true,
  completed_at: true,
  retain_until: true,
  tombstoned_at: true,
};

/** The columns of idem_record every read of a record selects: RecordColumns'. */
export const RECORD_COLUMNS = Object.keys(RECORD_COLUMN_LIST).join(", ");

/** A record as a statement returns it: its columns and `db_now`, the database's clock at the read (leases are judged by it). */
export interface RecordRow extends RecordColumns {
  db_now: Date;
}

export const RECORD_ROW: RowColumns<RecordRow> = { ...RECORD_COLUMN_LIST, db_now: true };

/** Reserve's guarded insert's row: the record, and whether this statement made it. */
export interface InsertedRow extends RecordRow {
  inserted: boolean;
}

export const INSERTED_ROW: RowColumns<InsertedRow> = { inserted: true, ...RECORD_ROW };

/** An effect attempt as every read of one selects it (ATTEMPT_COLUMNS). */
export interface AttemptRow {
  attempt_number: number;
  effect: string;
  provider: string;
  downstream_key: string;
  status: EffectStatus;
  provider_handle: string;
  /** bigint, as the driver reads it. */
  generation: string;
  created_at: Date;
  resolved_at: Date | null;
  registration_id: string | null;
}

export const ATTEMPT_ROW: RowColumns<AttemptRow> = {
  attempt_number: true,
  effect: true,
  provider: true,
  downstream_key: true,
  status: true,
  provider_handle: true,
  generation: true,
  created_at: true,
  resolved_at: true,
  registration_id: true,
};

/** The columns of idem_effect_attempt every read of an attempt selects: AttemptRow's. */
export const ATTEMPT_COLUMNS = Object.keys(ATTEMPT_ROW).join(", ");

/** The values of a listing's scope: tenants and operations (null: all). */
export interface ScopeValues {
  tenants: readonly string[] | null;
  operations: readonly string[] | null;
}

/** A listing's scope as conditions on a table with tenant_id and operation (named parameters :tenants and :operations). */
export const IN_SCOPE = `(:tenants::text[] IS NULL OR tenant_id = ANY(:tenants)) AND (:operations::text[] IS NULL OR operation = ANY(:operations))`;

/** `now()` plus the milliseconds of a named parameter (`:leaseMs`): leases and retention are in database time. */
export const nowPlusMs = (parameter: string) => `now() + make_interval(secs => ${parameter}::double precision / 1000)`;

/**
 * The event log's entry for every record a data-modifying CTE returned: one
 * event per changed record, written by the same statement, so that a change
 * is never committed without its event nor an event without its change. A
 * shared part rather than a trigger: the event names the caller and the kind
 * of change, which only the statement knows (a trigger would read them from
 * session settings, one more thing every statement must remember to set).
 *
 * `source` is the CTE returning the changed records' columns, `kind` an SQL
 * expression (a literal or a named parameter), `detail` a jsonb expression.
 * The caller is always `:caller`.
 */
export function logChanges(source: string, kind: string, detail = "'{}'::jsonb"): string {
  return `logged AS (
       INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail)
       SELECT tenant_id, operation_id, operation, api_revision, ${kind}, generation, state, :caller, ${detail} FROM ${source}
     )`;
}

/** The key of a principal's gate row (idem_quota_gate), as columns of idem_record too. */
const GATE_KEY = "tenant_id, principal, operation, api_revision";

/** The gate row of the records of a CTE aliased `s`. */
const GATE_OF = "g.tenant_id = s.tenant_id AND g.principal = s.principal AND g.operation = s.operation AND g.api_revision = s.api_revision";

/**
 * The count of unfinished records on a principal's gate row
 * (idem_quota_gate, migrations 13 and 16) moved by the statement that makes
 * a record unfinished (a new one, a tombstone reused): +1 for the one record
 * `source` (a data-modifying CTE) returned, nothing when it returned none.
 * The gate row stays locked until the transaction ends, so that racing
 * reservations of a principal count one after another: an UPDATE waiting
 * for another writer's row re-reads its latest version (READ COMMITTED), and
 * the INSERT for a principal's first record meets a row committed since the
 * statement's snapshot as a conflict and updates that one. Over the quota
 * (`quota`, an SQL expression) the statement fails with IDQ01.
 */
export function countOpened(source: string, quota: string): string {
  return `gate_updated AS (
       UPDATE idem_quota_gate g SET active = g.active + 1 FROM ${source} s WHERE ${GATE_OF}
       RETURNING g.tenant_id, idem_count_within_quota(g.active, ${quota})
     ), gate_made AS (
       INSERT INTO idem_quota_gate AS g (${GATE_KEY}, active)
       SELECT ${GATE_KEY}, 1 FROM ${source} s WHERE NOT EXISTS (SELECT FROM gate_updated u WHERE u.tenant_id = s.tenant_id)
       ON CONFLICT (${GATE_KEY}) DO UPDATE SET active = g.active + 1
       RETURNING idem_count_within_quota(g.active, ${quota})
     )`;
}

/**
 * The same for the one record `source` finished (Complete, Reconcile): -1 on
 * its principal's gate row, which exists since the record was counted when
 * it became unfinished. The statement changes only records that were
 * unfinished.
 */
export function countClosed(source: string): string {
  return `gate_updated AS (
       UPDATE idem_quota_gate g SET active = g.active - 1 FROM ${source} s WHERE ${GATE_OF}
     )`;
}

/**
 * The counts of a batch's records (`source`, a data-modifying CTE), summed
 * per principal (`change`: an SQL expression of the grouped rows, such as
 * `count(*)` or `-count(*)`), written in key order, so that statements
 * changing several principals' counts never deadlock. `check`, when given,
 * is an SQL expression of the gate row `g` that fails the statement over a
 * quota.
 */
export function countMany(source: string, change: string, check?: string): string {
  return `gate_changed AS (
       INSERT INTO idem_quota_gate AS g (${GATE_KEY}, active)
       SELECT ${GATE_KEY}, (${change})::int FROM ${source} GROUP BY ${GATE_KEY} ORDER BY ${GATE_KEY}
       ON CONFLICT (${GATE_KEY}) DO UPDATE SET active = g.active + EXCLUDED.active
       ${check ? `RETURNING ${check}` : ""}
     )`;
}

/** The states of a finished record; the others (RESERVED, EXECUTING, UNKNOWN) count against its principal's quota. */
export const FINISHED_STATES = "('SUCCEEDED', 'FAILED_FINAL', 'REJECTED')";

/**
 * A condition: the record is unfinished. Written as "not finished": a list
 * of the unfinished states would match the predicate of the recoverer's
 * partial index (idem_record_by_lease_end), and a statement that names one
 * record by its id could then be planned as a scan of that whole index,
 * which also holds the entries of every record finished since the last
 * vacuum (measured: a finish walking thousands of entries).
 */
export const UNFINISHED = `state NOT IN ${FINISHED_STATES}`;
