import type { Queryable } from "./db.js";
import type { EffectStatus, RecordView, StoredAttempt, StoredRecord } from "./types.js";

/** The columns of idem_record every read selects, in toRecord's terms. */
export const RECORD_COLUMNS = `tenant_id, scope, operation_id, principal, operation, api_revision, schema_revision,
  fingerprint, state, generation, recovering, lease_expires_at, acquisition_id, writer_epoch, effect_possible,
  snapshot_status, snapshot_media_type, snapshot_location, snapshot_business_version, snapshot_headers,
  snapshot_body, snapshot_digest, snapshot_key_id, created_at, updated_at, completed_at, retain_until, tombstoned_at`;

export const ATTEMPT_COLUMNS = `attempt_number, effect, provider, downstream_key, status, provider_handle, generation,
  created_at, resolved_at`;

/** `now() + n milliseconds` for a bound parameter. */
export const plusMs = (param: string) => `now() + make_interval(secs => ${param}::double precision / 1000)`;

/** A record and its attempts in one read (no lock: a consistent snapshot is all a reader needs). */
export async function readView(q: Queryable, where: string, values: unknown[]): Promise<RecordView | undefined> {
  return (await readViews(q, `tenant_id = $1 AND ${where}`, values))[0];
}

/**
 * Records with their attempts; `condition` is what follows WHERE (ORDER BY
 * and LIMIT included). `leaseEndText` and `createdAtText` are timestamps as
 * PostgreSQL prints them, to the microsecond, for cursors (a Date keeps
 * milliseconds only).
 */
export async function readViews(
  q: Queryable,
  condition: string,
  values: unknown[],
): Promise<Array<RecordView & { leaseEndText: string; createdAtText: string }>> {
  const { rows } = await q.query(
    `SELECT ${RECORD_COLUMNS}, now() AS db_now, lease_expires_at::text AS lease_end_text, created_at::text AS created_at_text,
            COALESCE((SELECT json_agg(json_build_object(
                         'attempt_number', a.attempt_number, 'effect', a.effect, 'provider', a.provider,
                         'downstream_key', a.downstream_key, 'status', a.status, 'provider_handle', a.provider_handle,
                         'generation', a.generation, 'created_at', a.created_at, 'resolved_at', a.resolved_at)
                       ORDER BY a.attempt_number)
                        FROM idem_effect_attempt a
                       WHERE a.tenant_id = r.tenant_id AND a.operation_id = r.operation_id), '[]'::json) AS attempts
       FROM idem_record r WHERE ${condition}`,
    values,
  );
  return rows.map((row) => ({
    record: toRecord(row),
    attempts: (row.attempts as Array<Record<string, unknown>>).map((a) =>
      toAttempt({ ...a, created_at: new Date(a.created_at as string), resolved_at: a.resolved_at ? new Date(a.resolved_at as string) : null }),
    ),
    leaseEndText: (row.lease_end_text as string | null) ?? "",
    createdAtText: row.created_at_text as string,
  }));
}

type Row = Record<string, unknown>;

export function toRecord(row: Row): StoredRecord {
  const digest = row.snapshot_digest as Buffer | null;
  return {
    tenant: row.tenant_id as string,
    scope: row.scope as Buffer,
    operationId: row.operation_id as string,
    principal: row.principal as string,
    operation: row.operation as string,
    apiRevision: row.api_revision as number,
    schemaRevision: row.schema_revision as number,
    fingerprint: row.fingerprint as Buffer,
    state: row.state as StoredRecord["state"],
    generation: Number(row.generation),
    recovering: row.recovering as boolean,
    leaseExpiresAt: row.lease_expires_at as Date | null,
    acquisitionId: row.acquisition_id as string,
    writerEpoch: Number(row.writer_epoch),
    effectPossible: row.effect_possible as boolean,
    snapshot:
      digest === null
        ? null
        : {
            // A tombstone keeps the digest (and the outcome), not the snapshot itself.
            statusCode: (row.snapshot_status as number | null) ?? 0,
            mediaType: (row.snapshot_media_type as string | null) ?? "",
            location: (row.snapshot_location as string | null) ?? "",
            businessVersion: (row.snapshot_business_version as string | null) ?? "",
            headers: (row.snapshot_headers as Array<[string, string]> | null) ?? [],
            body: (row.snapshot_body as Buffer | null) ?? new Uint8Array(),
            digest,
            keyId: row.snapshot_key_id as string | null,
          },
    createdAt: row.created_at as Date,
    updatedAt: row.updated_at as Date,
    completedAt: row.completed_at as Date | null,
    retainUntil: row.retain_until as Date | null,
    tombstonedAt: row.tombstoned_at as Date | null,
    dbNow: row.db_now as Date,
  };
}

export function toAttempt(row: Row): StoredAttempt {
  return {
    attemptNumber: row.attempt_number as number,
    effect: row.effect as string,
    provider: row.provider as string,
    downstreamKey: row.downstream_key as string,
    status: row.status as EffectStatus,
    providerHandle: row.provider_handle as string,
    generation: Number(row.generation),
    createdAt: row.created_at as Date,
    resolvedAt: row.resolved_at as Date | null,
  };
}
