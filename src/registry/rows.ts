import type { EffectStatus, LoggedEvent, RecordView, StoredAttempt, StoredRecord } from "./types.js";

/** Rows as the registry's statements return them (src/registry/statements), turned into the registry's types. */

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
    wentUnknown: row.went_unknown as boolean,
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
    registrationId: (row.registration_id as string | null | undefined) ?? null,
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

/**
 * A row of a view statement (statements/views.ts): the record, its attempts
 * (a JSON array), and its lease end and creation time as PostgreSQL prints
 * them, to the microsecond, for cursors.
 */
export function toView(row: Row): RecordView & { leaseEndText: string; createdAtText: string } {
  return {
    record: toRecord(row),
    attempts: (row.attempts as Row[]).map((a) =>
      toAttempt({ ...a, created_at: new Date(a.created_at as string), resolved_at: a.resolved_at ? new Date(a.resolved_at as string) : null }),
    ),
    leaseEndText: (row.lease_end_text as string | null) ?? "",
    createdAtText: row.created_at_text as string,
  };
}

/** A row of the event log (statements/events.ts), without its cursor. */
export function toEvent(row: Row): Omit<LoggedEvent, "cursor"> {
  return {
    eventId: row.event_id_text as string,
    tenant: row.tenant_id as string,
    operationId: row.operation_id as string | null,
    operation: row.operation as string | null,
    apiRevision: row.api_revision as number | null,
    kind: row.kind as string,
    generation: row.generation === null ? null : Number(row.generation),
    state: row.state as string | null,
    caller: row.caller as string,
    detail: row.detail as Record<string, unknown>,
    at: row.at as Date,
  };
}
