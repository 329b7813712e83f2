import type { Snapshot } from "../contract/snapshot.js";
import type { Subject } from "../contract/scope.js";
import type { RequestParts } from "../contract/fingerprint.js";
import type { ClaimMode, Decision, EffectStatus, Outcome, RecordState } from "../contract/words.js";

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
  /** It has been UNKNOWN: only recovery or an operator acts on it from then on (state-machine.ts recoveryOnly). */
  wentUnknown: boolean;
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
  /** The RecordEffectAttempt call that registered it (null: registered before calls were recorded, or read from a view). */
  registrationId: string | null;
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

export type RequestIdentity = { kind: "parts"; parts: RequestParts } | { kind: "fingerprint"; scheme: string; schemaRevision: number; digest: Uint8Array };

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
  /** Effects registered with the acceptance (each a PENDING attempt when ACCEPTED); needs `claim`. */
  effects?: ReadonlyArray<{ effect: string; provider: string }>;
}

export interface ReserveResult {
  decision: Decision;
  /** Absent on PAYLOAD_CONFLICT, which reveals nothing of the first request. */
  record?: StoredRecord;
  retryAfterMs?: number;
  enforced: boolean;
  schemaRevision: number;
  /** ACCEPTED by taking over a record whose lease ended with nothing possible (not a new record, nor a reused tombstone). */
  takenOver?: boolean;
  /** On ACCEPTED: the attempts registered for the declared effects, in their order. */
  attempts?: StoredAttempt[];
  /** On REPLAY: how long a gateway may answer exact repeats from its own cache (replayCacheableForMs); absent: not at all. */
  cacheableForMs?: number;
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
  /** Attempts to resolve first, in the same transaction (CONFIRMED or NO_EFFECT). */
  resolutions?: readonly EffectResolution[];
}

/** What a downstream call did, for one attempt, resolved with Complete. */
export interface EffectResolution {
  attemptNumber: number;
  /** CONFIRMED or NO_EFFECT (anything else is refused). */
  status: EffectStatus;
  /** The provider's id of what it did; empty keeps the one stored. */
  providerHandle: string;
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

/** A write by the holder of a generation (RenewLease, Release, Abandon). */
export interface HolderInput {
  ref: OperationRef;
  generation: number;
}

export interface RenewLeaseInput extends HolderInput {
  /** Requested lease; undefined means the policy's default. */
  leaseMs?: number;
}

export interface RecordEffectInput extends HolderInput {
  effect: string;
  provider: string;
}

export interface ResolveEffectInput extends HolderInput {
  attemptNumber: number;
  status: EffectStatus;
  /** The provider's id of what it did; empty keeps the one stored. */
  providerHandle: string;
}

/**
 * An operator's reconciliation of an UNKNOWN record, with evidence: settled
 * with an outcome (SUCCEEDED or FAILED_FINAL) and the response to replay, or
 * reopened to a fresh execution when the evidence shows nothing happened.
 */
export type ReconcileInput = {
  ref: OperationRef;
  evidence: string;
  operatorName: string;
} & ({ reopen?: false; outcome: Outcome; snapshot: Snapshot } | { reopen: true });

export interface LookupByIdInput {
  ref: OperationRef;
  /** The asking subject's principal; undefined for operators, who see every principal's records. */
  principal?: string;
}

/** Which tenants and operations a view covers; undefined: all. */
export interface ViewScope {
  tenants?: readonly string[];
  operations?: readonly string[];
}

/** What an operator lists records by. */
export interface RecordFilter extends ViewScope {
  states?: readonly RecordState[];
  /** Only records created at least this long ago. */
  olderThanMs?: number;
  pageSize: number;
  /** Resume after this record (the last one of the previous page). */
  after?: RecordCursor;
}

/** Where a listing of records by creation resumes: a record's creation time as PostgreSQL prints it (microseconds kept), tenant and id. */
export interface RecordCursor {
  createdAt: string;
  tenant: string;
  operationId: string;
}

/** One entry of the event log. */
export interface LoggedEvent {
  eventId: string;
  /** Where a reader resumes after this event. */
  cursor: EventCursor;
  tenant: string;
  operationId: string | null;
  operation: string | null;
  apiRevision: number | null;
  kind: string;
  generation: number | null;
  state: string | null;
  caller: string;
  detail: Record<string, unknown>;
  at: Date;
}

/** A position in the event log: the event's transaction id and event id, as text. */
export interface EventCursor {
  txid: string;
  eventId: string;
}

/** How many records are in each state, the age of the oldest UNKNOWN one, and those overdue. */
export interface Census {
  byState: Map<RecordState, number>;
  oldestUnknownSeconds: number;
  overdue: number;
}
