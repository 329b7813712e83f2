import type { Snapshot } from "../contract/snapshot.js";
import type { Subject } from "../contract/scope.js";
import type { RequestParts } from "../contract/fingerprint.js";

export type RecordState = "RESERVED" | "EXECUTING" | "SUCCEEDED" | "FAILED_FINAL" | "REJECTED" | "UNKNOWN";
export type Outcome = "SUCCEEDED" | "FAILED_FINAL" | "REJECTED";
export type EffectStatus = "PENDING" | "CONFIRMED" | "NO_EFFECT" | "INDETERMINATE";
export type Decision = "ACCEPTED" | "REPLAY" | "IN_PROGRESS" | "PAYLOAD_CONFLICT" | "EXPIRED";
export type ClaimMode = "OWNER" | "TAKEOVER" | "RECOVER";

/** One record as stored, plus the database's clock at the time it was read. */
export interface StoredRecord {
  tenant: string;
  scope: Uint8Array;
  operationId: string;
  principal: string;
  operation: string;
  apiRevision: number;
  schemaRevision: number;
  fingerprint: Uint8Array;
  state: RecordState;
  generation: number;
  recovering: boolean;
  leaseExpiresAt: Date | null;
  acquisitionId: string;
  writerEpoch: number;
  effectPossible: boolean;
  /** The stored response; `keyId` names the key its body is sealed with (null: the body is plaintext). */
  snapshot: (Snapshot & { digest: Uint8Array; keyId: string | null }) | null;
  createdAt: Date;
  updatedAt: Date;
  completedAt: Date | null;
  retainUntil: Date | null;
  tombstonedAt: Date | null;
  /** `now()` of the statement that read the row: leases are judged in database time. */
  dbNow: Date;
}

export interface StoredAttempt {
  attemptNumber: number;
  effect: string;
  provider: string;
  downstreamKey: string;
  status: EffectStatus;
  providerHandle: string;
  generation: number;
  createdAt: Date;
  resolvedAt: Date | null;
}

/**
 * Who is acting, as authenticated by the server (or the embedding service in
 * co-located mode). The registry asks it before touching a record found by
 * operation id, since only then is the record's operation known.
 */
export interface Actor {
  /** The caller's name, written to the event log. */
  caller: string;
  /** Whether the caller is granted this tenant. */
  mayUseTenant(tenant: string): boolean;
  /** Whether the caller may act on this operation. */
  mayOperate(operation: string): boolean;
  /** Operators may read any principal's records of the tenants they are granted. */
  isOperator: boolean;
}

/** Identifies an accepted operation. */
export interface OperationRef {
  tenant: string;
  operationId: string;
}

export type RequestIdentity =
  | { kind: "parts"; parts: RequestParts }
  | { kind: "fingerprint"; scheme: string; schemaRevision: number; digest: Uint8Array };

export interface ReserveInput {
  subject: Subject;
  operation: string;
  apiRevision: number;
  idempotencyKey: string;
  request: RequestIdentity;
  claim: boolean;
  /** Requested lease; undefined means the policy's default. */
  leaseMs?: number;
  writerEpoch: number;
}

export interface ReserveResult {
  decision: Decision;
  /** Absent on PAYLOAD_CONFLICT, which reveals nothing of the first request. */
  record?: StoredRecord;
  retryAfterMs?: number;
  enforced: boolean;
  schemaRevision: number;
}

export interface ClaimInput {
  ref: OperationRef;
  mode: ClaimMode;
  generation: number;
  leaseMs?: number;
  writerEpoch: number;
}

export interface ClaimResult {
  record: StoredRecord;
  attempts: StoredAttempt[];
}

export interface CompleteInput {
  ref: OperationRef;
  generation: number;
  outcome: Outcome;
  snapshot: Snapshot;
}

/** A record with its attempts, as Lookup returns it. */
export interface RecordView {
  record: StoredRecord;
  attempts: StoredAttempt[];
}

/** Where a listing of recoverable records resumes (after this record). */
export interface RecoverableCursor {
  /** The record's lease end as PostgreSQL prints it (microseconds kept). */
  leaseEnd: string;
  tenant: string;
  operationId: string;
}
