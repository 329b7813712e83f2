import { create } from "@bufbuild/protobuf";
import { type Duration, DurationSchema, type Timestamp, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { refuse } from "../contract/errors.js";
import { CONTRACT_VERSION } from "../contract/scope.js";
import type { Snapshot } from "../contract/snapshot.js";
import { ClaimMode as ProtoClaimMode, Decision as ProtoDecision } from "../gen/idempotency/v1/coordinator_pb.js";
import {
  type EffectAttempt,
  EffectAttemptSchema,
  EffectStatus as ProtoEffectStatus,
  type OperationRecord,
  OperationRecordSchema,
  Outcome as ProtoOutcome,
  RecordState as ProtoRecordState,
  type ResponseSnapshot,
  ResponseSnapshotSchema,
  type Subject as ProtoSubject,
} from "../gen/idempotency/v1/types_pb.js";
import type { Subject } from "../contract/scope.js";
import type { ClaimMode, Decision, EffectStatus, OperationRef, Outcome, RecordState, RecordView, StoredAttempt, StoredRecord } from "../registry/types.js";

/**
 * Translation between the wire messages and the registry's domain types, for
 * the server's handlers (the gateway SDK has its own, between the wire and
 * its public types). Enum names match one to one after the proto's type
 * prefix.
 */

export const toProtoState = (state: RecordState): ProtoRecordState => ProtoRecordState[state];

export function fromProtoState(state: ProtoRecordState): RecordState {
  const name = ProtoRecordState[state] as RecordState | "UNSPECIFIED" | undefined;
  if (name === undefined || name === "UNSPECIFIED") refuse("INVALID_REQUEST", "states must be record states such as RECORD_STATE_UNKNOWN");
  return name;
}
export const toProtoDecision = (decision: Decision): ProtoDecision => ProtoDecision[decision];
export const toProtoEffectStatus = (status: EffectStatus): ProtoEffectStatus => ProtoEffectStatus[status];

export function fromProtoOutcome(outcome: ProtoOutcome): Outcome {
  switch (outcome) {
    case ProtoOutcome.SUCCEEDED:
      return "SUCCEEDED";
    case ProtoOutcome.FAILED_FINAL:
      return "FAILED_FINAL";
    case ProtoOutcome.REJECTED:
      return "REJECTED";
    default:
      return refuse("INVALID_REQUEST", "outcome must be SUCCEEDED, FAILED_FINAL or REJECTED");
  }
}

export function fromProtoClaimMode(mode: ProtoClaimMode): ClaimMode {
  switch (mode) {
    case ProtoClaimMode.OWNER:
      return "OWNER";
    case ProtoClaimMode.TAKEOVER:
      return "TAKEOVER";
    case ProtoClaimMode.RECOVER:
      return "RECOVER";
    default:
      return refuse("INVALID_REQUEST", "mode must be OWNER, TAKEOVER or RECOVER");
  }
}

export function fromProtoEffectStatus(status: ProtoEffectStatus): EffectStatus {
  switch (status) {
    case ProtoEffectStatus.CONFIRMED:
      return "CONFIRMED";
    case ProtoEffectStatus.NO_EFFECT:
      return "NO_EFFECT";
    case ProtoEffectStatus.INDETERMINATE:
      return "INDETERMINATE";
    default:
      return refuse("INVALID_REQUEST", "status must be CONFIRMED, NO_EFFECT or INDETERMINATE");
  }
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
