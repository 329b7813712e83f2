import { create } from "@bufbuild/protobuf";
import { type Duration, DurationSchema, type Timestamp, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { refuse } from "../contract/errors.js";
import { CONTRACT_VERSION } from "../contract/scope.js";
import type { Snapshot } from "../contract/snapshot.js";
import {
  type EffectAttempt,
  EffectAttemptSchema,
  type OperationRecord,
  OperationRecordSchema,
  type ResponseSnapshot,
  ResponseSnapshotSchema,
  type Subject as ProtoSubject,
} from "../gen/idempotency/v1/types_pb.js";
import type { Subject } from "../contract/scope.js";
import { choice, CLAIM_MODES, DECISIONS, EFFECT_STATUSES, OUTCOMES, RECORD_STATES, type EffectStatus, type Vocabulary } from "../contract/words.js";
import type { OperationRef, RecordView, StoredAttempt, StoredRecord } from "../registry/types.js";

/**
 * Translation between the wire messages and the registry's domain types, for
 * the server's handlers (the gateway SDK has its own, between the wire and
 * its public types). Enums translate through the contract's words
 * (src/contract/words.ts), the same in both directions everywhere.
 */

export const toProtoState = RECORD_STATES.number;
export const toProtoDecision = DECISIONS.number;
export const toProtoEffectStatus = EFFECT_STATUSES.number;

/** The statuses a request may resolve an attempt to: PENDING is where every attempt starts. */
const RESOLVED: readonly EffectStatus[] = ["CONFIRMED", "NO_EFFECT", "INDETERMINATE"];

export const fromProtoState = (state: number) => requested(RECORD_STATES, state, "states must be record states such as RECORD_STATE_UNKNOWN");
export const fromProtoOutcome = (outcome: number) => requested(OUTCOMES, outcome, `outcome must be ${choice(OUTCOMES.words)}`);
export const fromProtoClaimMode = (mode: number) => requested(CLAIM_MODES, mode, `mode must be ${choice(CLAIM_MODES.words)}`);
export const fromProtoEffectStatus = (status: number) => requested(EFFECT_STATUSES, status, `status must be ${choice(RESOLVED)}`, RESOLVED);

/**
 * The word of an enum field of a request, one of `accepted`. Any other
 * number (UNSPECIFIED, a value of a newer contract than this coordinator's,
 * a word not taken here) refuses the request with `message`.
 */
function requested<Word extends string>(vocabulary: Vocabulary<Word, number>, value: number, message: string, accepted: readonly Word[] = vocabulary.words): Word {
  const word = vocabulary.word(value, () => refuse("INVALID_REQUEST", message));
  if (!accepted.includes(word)) refuse("INVALID_REQUEST", message);
  return word;
}

export function fromProtoSubject(subject: ProtoSubject | undefined, field = "subject"): Subject {
  if (!subject) refuse("INVALID_REQUEST", `${field} is required (tenant and principal)`);
  return { tenant: subject.tenant, principal: subject.principal };
}

export function fromProtoRef(ref: { tenant: string; operationId: string } | undefined): OperationRef {
  if (!ref) refuse("INVALID_REQUEST", "ref is required (tenant and operation_id)");
  return { tenant: ref.tenant, operationId: ref.operationId };
}

/** A uint64 that must fit a safe integer (generations, epochs). */
export function fromUint64(value: bigint, field: string): number {
  if (value > BigInt(Number.MAX_SAFE_INTEGER)) refuse("INVALID_REQUEST", `${field} is out of range`);
  return Number(value);
}

/** A requested duration in milliseconds (a lease, a wait, an age); unset stays unset (the lease: the policy's default). */
export function fromProtoDuration(duration: Duration | undefined, field = "lease"): number | undefined {
  if (!duration) return undefined;
  if (duration.seconds < 0n || duration.nanos < 0) refuse("INVALID_REQUEST", `${field} must not be negative`);
  if (duration.seconds > 86_400n * 365n) refuse("INVALID_REQUEST", `${field} is out of range`);
  return Number(duration.seconds) * 1000 + Math.floor(duration.nanos / 1e6);
}

export function toProtoDuration(ms: number): Duration {
  return create(DurationSchema, { seconds: BigInt(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 });
}

export function toTimestamp(date: Date | null): Timestamp | undefined {
  return date ? timestampFromDate(date) : undefined;
}

export function fromProtoSnapshot(snapshot: ResponseSnapshot | undefined): Snapshot {
  if (!snapshot) refuse("INVALID_REQUEST", "snapshot is required (the response to replay)");
  return {
    statusCode: snapshot.statusCode,
    mediaType: snapshot.mediaType,
    location: snapshot.location,
    businessVersion: snapshot.businessVersion,
    headers: snapshot.headers.map((h): [string, string] => [h.name, h.value]),
    body: snapshot.body,
  };
}

export function toProtoSnapshot(snapshot: StoredRecord["snapshot"]): ResponseSnapshot | undefined {
  if (!snapshot) return undefined;
  return create(ResponseSnapshotSchema, {
    statusCode: snapshot.statusCode,
    mediaType: snapshot.mediaType,
    location: snapshot.location,
    businessVersion: snapshot.businessVersion,
    headers: snapshot.headers.map(([name, value]) => ({ name, value })),
    body: snapshot.body,
    digest: snapshot.digest,
  });
}

export function toProtoAttempt(attempt: StoredAttempt): EffectAttempt {
  return create(EffectAttemptSchema, {
    attemptNumber: attempt.attemptNumber,
    effect: attempt.effect,
    provider: attempt.provider,
    downstreamKey: attempt.downstreamKey,
    status: toProtoEffectStatus(attempt.status),
    providerHandle: attempt.providerHandle,
    generation: BigInt(attempt.generation),
    createdAt: toTimestamp(attempt.createdAt),
    resolvedAt: toTimestamp(attempt.resolvedAt),
  });
}

export function toProtoRecord({ record, attempts }: RecordView): OperationRecord {
  return create(OperationRecordSchema, {
    operationId: record.operationId,
    subject: { tenant: record.tenant, principal: record.principal },
    operation: record.operation,
    apiRevision: record.apiRevision,
    schemaRevision: record.schemaRevision,
    state: toProtoState(record.state),
    generation: BigInt(record.generation),
    recovering: record.recovering,
    leaseExpiresAt: toTimestamp(record.leaseExpiresAt),
    createdAt: toTimestamp(record.createdAt),
    updatedAt: toTimestamp(record.updatedAt),
    completedAt: toTimestamp(record.completedAt),
    snapshot: toProtoSnapshot(record.snapshot),
    effectAttempts: attempts.map(toProtoAttempt),
    contractVersion: CONTRACT_VERSION,
    wentUnknown: record.wentUnknown,
  });
}
