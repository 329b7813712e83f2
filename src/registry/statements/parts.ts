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
