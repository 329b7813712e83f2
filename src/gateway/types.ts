/**
 * The SDK's own vocabulary: plain objects, no protobuf messages, so that a
 * service never depends on the wire format. Names follow the contract
 * (`http.idempotency.v1`, proto/idempotency/v1/*.proto).
 */
import type { RequestParts } from "../contract/fingerprint.js";
import type { Snapshot } from "../contract/snapshot.js";
import type { ClaimMode, Decision, EffectStatus, Outcome, RecordState } from "../contract/words.js";

/** The end user a gateway acts for, from the service's own authentication (never the request body). */
export interface Subject {
  tenant: string;
  principal: string;
}

/** Identifies an accepted operation for every write after Reserve. */
export interface OperationRef {
  tenant: string;
  operationId: string;
}

/**
 * The raw parts of an HTTP request, forwarded so that the coordinator
 * computes the fingerprint itself (the contract's own type: path as received,
 * the raw query without `?`, the Content-Type value).
 */
export type { RequestParts };

/**
 * A response as stored by Complete and replayed to every retry: the
 * contract's snapshot (headers as [lower-case name, value] pairs of the
 * policy's allowlist, never Date, trace ids, Set-Cookie, …) with its SHA-256
 * digest, set by the coordinator (empty on input).
 */
export type ResponseSnapshot = Snapshot & { digest?: Uint8Array };

/** A downstream call registered before it was made. */
export interface EffectAttempt {
  attemptNumber: number;
  effect: string;
  provider: string;
  /** The idempotency key to send downstream: the same for every attempt and generation of this effect. */
  downstreamKey: string;
  status: EffectStatus;
  providerHandle: string;
  generation: number;
  createdAt?: Date;
  resolvedAt?: Date;
}

/** What Reserve decided. */
export interface ReserveResult {
  decision: Decision;
  /** Empty on PAYLOAD_CONFLICT, which reveals nothing of the first request. */
  operationId: string;
  state?: RecordState;
  /** The owner generation (fencing token) on ACCEPTED; 0 otherwise. */
  generation: number;
  leaseExpiresAt?: Date;
  /** On IN_PROGRESS: how long the client should wait. */
  retryAfterMs?: number;
  /** On REPLAY: the stored response. */
  snapshot?: ResponseSnapshot;
  /** False in shadow mode: the decision is recorded, not enforced. */
  enforced: boolean;
  schemaRevision: number;
  contractVersion: string;
  /** On ACCEPTED: the attempts registered for the declared effects (ReserveInput.effects). */
  attempts?: EffectAttempt[];
  /**
   * On REPLAY: how long, from when the request was sent, an exact repeat of
   * it may be answered with this snapshot without asking again (the
   * gateway's answer cache); absent: ask every time.
   */
  cacheableForMs?: number;
}

export interface ReserveInput {
  subject: Subject;
  operation: string;
  apiRevision: number;
  idempotencyKey: string;
  parts: RequestParts;
  /** Start executing at once (EXECUTING when ACCEPTED). */
  claim?: boolean;
  /** Requested lease; the policy's default when unset. */
  leaseMs?: number;
  writerEpoch?: number;
  /**
   * When the record's owner is still running: wait up to this long (at most
   * 30 s) for it to finish and answer its REPLAY (or ACCEPTED, when it let
   * go). Unset or 0: IN_PROGRESS at once.
   */
  waitForOwnerMs?: number;
  /** Effects registered with the acceptance (a PENDING attempt each when ACCEPTED); needs `claim`. */
  effects?: ReadonlyArray<{ effect: string; provider: string }>;
}

export interface ClaimInput {
  ref: OperationRef;
  mode: ClaimMode;
  /** OWNER: the generation held. TAKEOVER and RECOVER: the generation observed. */
  generation: number;
  leaseMs?: number;
  writerEpoch?: number;
}

export interface ClaimResult {
  generation: number;
  state: RecordState;
  leaseExpiresAt?: Date;
  recovering: boolean;
  effectAttempts: EffectAttempt[];
}

/** An accepted operation and the owner generation (fencing token) a write after Reserve acts at. */
export interface OwnedRef {
  ref: OperationRef;
  generation: number;
}

export interface RenewLeaseInput extends OwnedRef {
  /** The lease asked for (the policy's default when unset). */
  leaseMs?: number;
}

export interface RecordEffectAttemptInput extends OwnedRef {
  /** The effect's name, e.g. `card.charge`: every attempt of it shares one downstream key. */
  effect: string;
  /** The downstream system, e.g. `card-provider`. */
  provider: string;
}

export interface ResolveEffectAttemptInput extends OwnedRef {
  attemptNumber: number;
  status: Exclude<EffectStatus, "PENDING">;
  /** The downstream system's reference (e.g. a charge id); empty when there is none. */
  providerHandle?: string;
}

export interface CompleteInput extends OwnedRef {
  outcome: Outcome;
  /** The response every retry will get. */
  snapshot: ResponseSnapshot;
  /** Attempts to resolve (CONFIRMED or NO_EFFECT) in the same transaction, instead of a ResolveEffectAttempt each. */
  resolutions?: ReadonlyArray<{ attemptNumber: number; status: "CONFIRMED" | "NO_EFFECT"; providerHandle?: string }>;
}

/** Where Release and Abandon left the record. */
export interface HandOverResult {
  state: RecordState;
  generation: number;
}

export interface CompleteResult {
  state: RecordState;
  snapshotDigest: Uint8Array;
  completedAt?: Date;
}

/** An operation as Lookup and ListRecoverable return it. */
export interface OperationRecord {
  operationId: string;
  subject: Subject;
  operation: string;
  apiRevision: number;
  schemaRevision: number;
  state: RecordState;
  generation: number;
  recovering: boolean;
  leaseExpiresAt?: Date;
  createdAt?: Date;
  updatedAt?: Date;
  completedAt?: Date;
  snapshot?: ResponseSnapshot;
  effectAttempts: EffectAttempt[];
  contractVersion: string;
}

export type LookupInput = { ref: OperationRef; subject?: Subject } | { scope: { subject: Subject; operation: string; apiRevision: number; idempotencyKey: string } };

export interface ListRecoverableInput {
  tenant?: string;
  operations?: readonly string[];
  pageSize?: number;
  pageToken?: string;
}

export interface RecoverableRecord {
  record: OperationRecord;
  /** Claim with this mode and `record.generation`. */
  claimMode: ClaimMode;
}

export interface ListRecoverableResult {
  records: RecoverableRecord[];
  nextPageToken: string;
}

/** Header values as a handler may give them. */
export type HeaderValue = string | number | readonly string[];

/**
 * A response as a handler describes it (co-located completion, recovery,
 * `writeResponse`). `json` wins over `body` and defaults the media type to
 * `application/json`.
 */
export interface HandlerResponse {
  status: number;
  headers?: Record<string, HeaderValue | undefined>;
  body?: Uint8Array | string;
  json?: unknown;
}

/** A concrete HTTP response: what a gateway writes, or what it captured from a handler. */
export interface HttpResponse {
  status: number;
  /** [name, value] pairs; a name may repeat (Set-Cookie). */
  headers: Array<[string, string]>;
  body: Uint8Array;
}

/**
 * Co-located completion as the gateway and the recovery worker use it: a
 * business transaction on the registry's database, and Complete inside it.
 * `ColocatedRegistry` (`idempotency-coordinator/colocated`) implements it;
 * the gateway holds only this interface, so that it never loads a database
 * driver or the registry itself.
 */
export interface ColocatedCompletion {
  /** Runs `work` in one transaction: BEGIN, work, COMMIT; ROLLBACK when it throws. */
  transaction<T>(work: (tx: BusinessTransaction) => Promise<T>): Promise<T>;
  /** Complete inside the open transaction `tx`, committed by its COMMIT; refusals are thrown as CoordinatorError. */
  complete(tx: BusinessTransaction, input: CompleteInput): Promise<CompleteResult>;
  /**
   * Complete as the last statement of a transaction of `transaction()`: the
   * terminal state goes out with its COMMIT (one round trip fewer), and
   * nothing may be sent on `tx` after it. Optional (`complete` otherwise).
   */
  completeAndCommit?(tx: BusinessTransaction, input: CompleteInput): Promise<CompleteResult>;
  /**
   * The whole lifecycle in this process, on the service's pool: when
   * present, the gateway sends it every call it would send the coordinator
   * (Reserve, lease renewals, effects, Complete, Release, Abandon), and
   * makes no RPC. Absent: only completion is co-located.
   */
  readonly lifecycle?: LifecycleCalls;
  /**
   * Opens one transaction in which a local-only route (`localOnly`) is
   * reserved, runs its rows and effects and is completed: all of it commits
   * at once, or nothing does. Present with `lifecycle`.
   */
  begin?(): Promise<OpenTransaction>;
}

/**
 * The calls of an operation's lifecycle, as the coordinator's client makes
 * them (CoordinatorClient has them all) or as co-located mode runs them in
 * the service's process, with the same inputs, answers and refusals.
 */
export interface LifecycleCalls {
  reserve(input: ReserveInput): Promise<ReserveResult>;
  renewLease(input: RenewLeaseInput): Promise<Date | undefined>;
  recordEffectAttempt(input: RecordEffectAttemptInput): Promise<EffectAttempt>;
  resolveEffectAttempt(input: ResolveEffectAttemptInput): Promise<EffectAttempt>;
  complete(input: CompleteInput): Promise<CompleteResult>;
  release(input: OwnedRef): Promise<HandOverResult>;
  abandon(input: OwnedRef): Promise<HandOverResult>;
}

/**
 * A transaction open on the registry's database for one request of a
 * local-only route: its lifecycle calls run inside it, and nothing of it is
 * visible to anyone else until `commit`.
 */
export interface OpenTransaction {
  /** The transaction's client, handed to `ctx.transaction`'s work. */
  readonly tx: BusinessTransaction;
  /** The lifecycle inside this transaction. */
  readonly calls: LifecycleCalls;
  /** COMMIT; a connection lost during it is thrown as CommitUnknownError. */
  commit(): Promise<void>;
  /** ROLLBACK (quietly: a lost connection rolls back too). */
  rollback(): Promise<void>;
}

/**
 * The driver types of co-located completion. The SDK names no database
 * driver, so that it installs without one: the module that implements
 * co-located completion declares its client here by declaration merging
 * (`idempotency-coordinator/colocated` declares node-postgres's PoolClient as
 * `client`).
 */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type -- filled in by declaration merging
export interface ColocatedDriverTypes {}

/** What a co-located business transaction answers to when no driver has declared its client. */
export interface SqlQueryable {
  query(text: string, values?: unknown[]): Promise<{ rows: unknown[]; rowCount: number | null }>;
}

/** The client of the business transaction `ctx.transaction` hands to its work: the declared driver's, else SqlQueryable. */
export type BusinessTransaction = ColocatedDriverTypes extends { client: infer Client } ? Client : SqlQueryable;

/**
 * Where the SDK logs: warnings (a renewal or a resolution that failed and is
 * tried again or left to recovery) and errors (a misconfigured gateway, a
 * handler that threw), with an object of facts first and the message second,
 * as pino takes them. `console` fits, and so does a pino logger; `debug` and
 * `info` are used when present. Default: `consoleLogger`.
 */
export interface GatewayLogger {
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
  debug?(obj: object, msg?: string): void;
  info?(obj: object, msg?: string): void;
}

/** The default logger: warnings and errors to `console.warn` and `console.error`, the message first; nothing else. */
export const consoleLogger: GatewayLogger = {
  warn: (obj, msg) => console.warn(`idempotency-gateway: ${msg ?? ""}`, obj),
  error: (obj, msg) => console.error(`idempotency-gateway: ${msg ?? ""}`, obj),
};

/** A logger that drops everything (pass it as `logger` to log nothing). */
export const silentLogger: GatewayLogger = {
  debug: () => undefined,
  info: () => undefined,
  warn: () => undefined,
  error: () => undefined,
};

/** A logger with every level, as the SDK calls it internally. */
export type SdkLogger = Required<GatewayLogger>;

/**
 * The logger given in the options (`consoleLogger` when none), with the
 * levels it lacks dropped. Its methods are called on it, so that a pino
 * logger keeps its `this`.
 */
export function loggerOf(logger: GatewayLogger | undefined): SdkLogger {
  const given = logger ?? consoleLogger;
  return {
    warn: (obj, msg) => given.warn(obj, msg),
    error: (obj, msg) => given.error(obj, msg),
    debug: (obj, msg) => given.debug?.(obj, msg),
    info: (obj, msg) => given.info?.(obj, msg),
  };
}
