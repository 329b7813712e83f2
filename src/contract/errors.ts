/**
 * The one error type of the domain. Code below the server edge throws it with
 * a stable `reason`; every edge treats the reason as REFUSALS below says (the
 * server sends its code with a `google.rpc.ErrorInfo` detail, see
 * src/server/errors.ts). The reasons are the names of
 * `idempotency.v1.ErrorReason` in proto/idempotency/v1/errors.proto; a unit
 * test keeps the two lists equal.
 */
export const REASONS = [
  "INVALID_REQUEST",
  "UNKNOWN_FIELD",
  "INVALID_KEY",
  "INVALID_PAYLOAD",
  "UNKNOWN_OPERATION",
  "SCHEMA_REVISION_MISMATCH",
  "UNSUPPORTED_FINGERPRINT_SCHEME",
  "UNAUTHENTICATED",
  "PERMISSION_DENIED",
  "NOT_FOUND",
  "QUOTA_EXCEEDED",
  "SNAPSHOT_TOO_LARGE",
  "TOO_MANY_WAITERS",
  "STALE_WRITER_EPOCH",
  "STALE_GENERATION",
  "LEASE_HELD",
  "LEASE_EXPIRED",
  "INVALID_TRANSITION",
  "NEW_EFFECT_IN_RECOVERY",
  "ATTEMPT_NOT_FOUND",
  "ATTEMPT_ALREADY_RESOLVED",
  "UNRESOLVED_EFFECTS",
  "EFFECT_POSSIBLE",
  "ALREADY_COMPLETED",
  "INVALID_POLICY",
  "POLICY_REVISION_EXISTS",
  "POLICY_REVISION_NOT_NEWER",
  "WRITER_EPOCH_NOT_NEWER",
  "OPERATION_DRAINING",
  "REGISTRY_UNAVAILABLE",
  "REGISTRY_BUSY",
  "INTERNAL",
  "SNAPSHOT_UNREADABLE",
] as const;

export type Reason = (typeof REASONS)[number];

/** The ErrorInfo domain of every refusal the coordinator sends. */
export const ERROR_DOMAIN = "idempotency.v1";

/**
 * The gRPC status codes refusals are sent with, by their canonical names
 * (google.rpc.Code): `grpc` is the code's number, which is also the value of
 * Connect's `Code` enum, so each edge maps names to its framework's codes
 * without this module depending on one; `http` is the status an HTTP edge
 * (the operator console) answers with.
 */
export const STATUS_CODES = {
  INVALID_ARGUMENT: { grpc: 3, http: 400 },
  NOT_FOUND: { grpc: 5, http: 404 },
  PERMISSION_DENIED: { grpc: 7, http: 403 },
  RESOURCE_EXHAUSTED: { grpc: 8, http: 429 },
  FAILED_PRECONDITION: { grpc: 9, http: 409 },
  INTERNAL: { grpc: 13, http: 500 },
  UNAVAILABLE: { grpc: 14, http: 503 },
  UNAUTHENTICATED: { grpc: 16, http: 401 },
} as const;

export type StatusCodeName = keyof typeof STATUS_CODES;

/** How every edge treats one reason. */
export interface Refusal {
  /** The status code it is sent with: the code its comment in errors.proto starts with. */
  readonly code: StatusCodeName;
  /**
   * Nothing was decided, the registry was only out of reach for a moment: the
   * same call may simply be repeated with backoff (clients retry these).
   */
  readonly retryable: boolean;
}

/**
 * The one table from a refusal's reason to what the edges need: the server
 * sends `code`, the console answers its HTTP status, the gateway SDK retries
 * what is `retryable`. A unit test keeps it complete and in step with
 * errors.proto.
 */
export const REFUSALS: { readonly [R in Reason]: Refusal } = {
  INVALID_REQUEST: { code: "INVALID_ARGUMENT", retryable: false },
  UNKNOWN_FIELD: { code: "INVALID_ARGUMENT", retryable: false },
  INVALID_KEY: { code: "INVALID_ARGUMENT", retryable: false },
  INVALID_PAYLOAD: { code: "INVALID_ARGUMENT", retryable: false },
  UNKNOWN_OPERATION: { code: "INVALID_ARGUMENT", retryable: false },
  SCHEMA_REVISION_MISMATCH: { code: "INVALID_ARGUMENT", retryable: false },
  UNSUPPORTED_FINGERPRINT_SCHEME: { code: "INVALID_ARGUMENT", retryable: false },
  UNAUTHENTICATED: { code: "UNAUTHENTICATED", retryable: false },
  PERMISSION_DENIED: { code: "PERMISSION_DENIED", retryable: false },
  NOT_FOUND: { code: "NOT_FOUND", retryable: false },
  QUOTA_EXCEEDED: { code: "RESOURCE_EXHAUSTED", retryable: false },
  SNAPSHOT_TOO_LARGE: { code: "RESOURCE_EXHAUSTED", retryable: false },
  TOO_MANY_WAITERS: { code: "RESOURCE_EXHAUSTED", retryable: false },
  STALE_WRITER_EPOCH: { code: "FAILED_PRECONDITION", retryable: false },
  STALE_GENERATION: { code: "FAILED_PRECONDITION", retryable: false },
  LEASE_HELD: { code: "FAILED_PRECONDITION", retryable: false },
  LEASE_EXPIRED: { code: "FAILED_PRECONDITION", retryable: false },
  INVALID_TRANSITION: { code: "FAILED_PRECONDITION", retryable: false },
  NEW_EFFECT_IN_RECOVERY: { code: "FAILED_PRECONDITION", retryable: false },
  ATTEMPT_NOT_FOUND: { code: "NOT_FOUND", retryable: false },
  ATTEMPT_ALREADY_RESOLVED: { code: "FAILED_PRECONDITION", retryable: false },
  UNRESOLVED_EFFECTS: { code: "FAILED_PRECONDITION", retryable: false },
  EFFECT_POSSIBLE: { code: "FAILED_PRECONDITION", retryable: false },
  ALREADY_COMPLETED: { code: "FAILED_PRECONDITION", retryable: false },
  INVALID_POLICY: { code: "INVALID_ARGUMENT", retryable: false },
  POLICY_REVISION_EXISTS: { code: "FAILED_PRECONDITION", retryable: false },
  POLICY_REVISION_NOT_NEWER: { code: "FAILED_PRECONDITION", retryable: false },
  WRITER_EPOCH_NOT_NEWER: { code: "FAILED_PRECONDITION", retryable: false },
  OPERATION_DRAINING: { code: "UNAVAILABLE", retryable: false },
  REGISTRY_UNAVAILABLE: { code: "UNAVAILABLE", retryable: true },
  REGISTRY_BUSY: { code: "UNAVAILABLE", retryable: true },
  INTERNAL: { code: "INTERNAL", retryable: false },
  SNAPSHOT_UNREADABLE: { code: "INTERNAL", retryable: false },
};

/** The table's entry for a reason received as text (e.g. from the wire); undefined for a reason this version does not know. */
export function refusalOf(reason: string): Refusal | undefined {
  return Object.hasOwn(REFUSALS, reason) ? REFUSALS[reason as Reason] : undefined;
}

/** A refusal with a stable reason, a message that says what to do, and optional facts. */
export class IdempotencyError extends Error {
  override readonly name = "IdempotencyError";

  constructor(
    readonly reason: Reason,
    message: string,
    /** Safe facts for the client (never content of another request). */
    readonly metadata: Record<string, string> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** Shorthand for `throw new IdempotencyError(...)` in expression position. */
export function refuse(reason: Reason, message: string, metadata?: Record<string, string>): never {
  throw new IdempotencyError(reason, message, metadata);
}
