import type { EventRow } from "./statements/events.js";
import type { AttemptRow, RecordRow } from "./statements/parts.js";
import type { ViewRow } from "./statements/views.js";
import type { LoggedEvent, RecordView, StoredAttempt, StoredRecord } from "./types.js";

/** Rows as the registry's statements return them (src/registry/statements), turned into the registry's types. */

export function toRecord(row: RecordRow): StoredRecord {
  const digest = row.snapshot_digest;
  return {
    tenant: row.tenant_id,
    scope: row.scope,
    operationId: row.operation_id,
    principal: row.principal,
    operation: row.operation,
    apiRevision: row.api_revision,
    schemaRevision: row.schema_revision,
    fingerprint: row.fingerprint,
    state: row.state,
    generation: Number(row.generation),
    recovering: row.recovering,
    leaseExpiresAt: row.lease_expires_at,
    acquisitionId: row.acquisition_id,
    writerEpoch: Number(row.writer_epoch),
    effectPossible: row.effect_possible,
    wentUnknown: row.went_unknown,
    snapshot:
      digest === null
        ? null
        : {
            // A tombstone keeps the digest (and the outcome), not the snapshot itself.
            statusCode: row.snapshot_status ?? 0,
            mediaType: row.snapshot_media_type ?? "",
            location: row.snapshot_location ?? "",
            businessVersion: row.snapshot_business_version ?? "",
            headers: row.snapshot_headers ?? [],
            body: row.snapshot_body ?? new Uint8Array(),
            digest,
            keyId: row.snapshot_key_id,
          },
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    completedAt: row.completed_at,
    retainUntil: row.retain_until,
    tombstonedAt: row.tombstoned_at,
    dbNow: row.db_now,
  };
}

export function toAttempt(row: AttemptRow): StoredAttempt {
  return {
    attemptNumber: row.attempt_number,
    registrationId: row.registration_id,
    effect: row.effect,
    provider: row.provider,
    downstreamKey: row.downstream_key,
    status: row.status,
    providerHandle: row.provider_handle,
    generation: Number(row.generation),
    createdAt: row.created_at,
    resolvedAt: row.resolved_at,
  };
}

/**
 * A row of a view statement (statements/views.ts): the record, its attempts
 * (a JSON array, without their registration ids), and its lease end and
 * creation time as PostgreSQL prints them, to the microsecond, for cursors.
 */
export function toView(row: ViewRow): RecordView & { leaseEndText: string; createdAtText: string } {
  return {
    record: toRecord(row),
    attempts: row.attempts.map((attempt) =>
      toAttempt({
        ...attempt,
        generation: String(attempt.generation),
        created_at: new Date(attempt.created_at),
        resolved_at: attempt.resolved_at === null ? null : new Date(attempt.resolved_at),
        registration_id: null,
      }),
    ),
    leaseEndText: row.lease_end_text ?? "",
    createdAtText: row.created_at_text,
  };
}

/** A row of the event log (statements/events.ts), without its cursor. */
export function toEvent(row: EventRow): Omit<LoggedEvent, "cursor"> {
  return {
    eventId: row.event_id_text,
    tenant: row.tenant_id,
    operationId: row.operation_id,
    operation: row.operation,
    apiRevision: row.api_revision,
    kind: row.kind,
    generation: row.generation === null ? null : Number(row.generation),
    state: row.state,
    caller: row.caller,
    detail: row.detail,
    at: row.at,
  };
}
