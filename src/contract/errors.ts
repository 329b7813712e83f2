/**
 * The one error type of the domain. Code below the server edge throws it with
 * a stable `reason`; the server maps the reason to a gRPC/Connect code and a
 * `google.rpc.ErrorInfo` detail (see src/server/errors.ts). The reasons are the
 * names of `idempotency.v1.ErrorReason` in proto/idempotency/v1/errors.proto;
 * a unit test keeps the two lists equal.
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
