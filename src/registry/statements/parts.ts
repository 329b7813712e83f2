/**
 * Pieces of text shared by the registry's statements. Each statement is
 * still whole where it is defined; these only keep a column list, a listing's
 * scope or the event log's insert written once.
 */

/** The columns of idem_record every read of a record selects, in toRecord's terms. */
export const RECORD_COLUMNS = `tenant_id, scope, operation_id, principal, operation, api_revision, schema_revision,
  fingerprint, state, generation, recovering, lease_expires_at, acquisition_id, writer_epoch, effect_possible, went_unknown,
  snapshot_status, snapshot_media_type, snapshot_location, snapshot_business_version, snapshot_headers,
  snapshot_body, snapshot_digest, snapshot_key_id, created_at, updated_at, completed_at, retain_until, tombstoned_at`;

/** The columns of idem_effect_attempt every read of an attempt selects, in toAttempt's terms. */
export const ATTEMPT_COLUMNS = `attempt_number, effect, provider, downstream_key, status, provider_handle, generation,
  created_at, resolved_at, registration_id`;

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
