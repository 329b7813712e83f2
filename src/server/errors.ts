import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import type { Logger } from "pino";
import { IdempotencyError, type Reason } from "../contract/errors.js";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";

/** The error domain of every ErrorInfo the coordinator sends. */
export const ERROR_DOMAIN = "idempotency.v1";

/** The one mapping from a refusal's reason to a gRPC/Connect code. */
const CODES: Record<Reason, Code> = {
  INVALID_REQUEST: Code.InvalidArgument,
  UNKNOWN_FIELD: Code.InvalidArgument,
  INVALID_KEY: Code.InvalidArgument,
  INVALID_PAYLOAD: Code.InvalidArgument,
  UNKNOWN_OPERATION: Code.InvalidArgument,
  SCHEMA_REVISION_MISMATCH: Code.InvalidArgument,
  UNSUPPORTED_FINGERPRINT_SCHEME: Code.InvalidArgument,
  UNAUTHENTICATED: Code.Unauthenticated,
  PERMISSION_DENIED: Code.PermissionDenied,
  NOT_FOUND: Code.NotFound,
  ATTEMPT_NOT_FOUND: Code.NotFound,
  QUOTA_EXCEEDED: Code.ResourceExhausted,
  SNAPSHOT_TOO_LARGE: Code.ResourceExhausted,
  STALE_WRITER_EPOCH: Code.FailedPrecondition,
  STALE_GENERATION: Code.FailedPrecondition,
  LEASE_HELD: Code.FailedPrecondition,
  LEASE_EXPIRED: Code.FailedPrecondition,
  INVALID_TRANSITION: Code.FailedPrecondition,
  NEW_EFFECT_IN_RECOVERY: Code.FailedPrecondition,
  ATTEMPT_ALREADY_RESOLVED: Code.FailedPrecondition,
  UNRESOLVED_EFFECTS: Code.FailedPrecondition,
  EFFECT_POSSIBLE: Code.FailedPrecondition,
  ALREADY_COMPLETED: Code.FailedPrecondition,
  INVALID_POLICY: Code.InvalidArgument,
  POLICY_REVISION_EXISTS: Code.FailedPrecondition,
  POLICY_REVISION_NOT_NEWER: Code.FailedPrecondition,
  WRITER_EPOCH_NOT_NEWER: Code.FailedPrecondition,
  OPERATION_DRAINING: Code.Unavailable,
  REGISTRY_UNAVAILABLE: Code.Unavailable,
  REGISTRY_BUSY: Code.Unavailable,
  INTERNAL: Code.Internal,
  SNAPSHOT_UNREADABLE: Code.Internal,
};

/** The gRPC/Connect code of a refusal's reason. */
export function codeOf(reason: Reason): Code {
  return CODES[reason];
}

/** The Connect error for a refusal, with its ErrorInfo detail. */
export function refusalToConnectError(error: IdempotencyError): ConnectError {
  return new ConnectError(error.message, CODES[error.reason], undefined, [
    { desc: ErrorInfoSchema, value: create(ErrorInfoSchema, { reason: error.reason, domain: ERROR_DOMAIN, metadata: error.metadata }) },
  ]);
}

/**
 * Turns whatever a handler throws into what a client may see: refusals keep
 * their reason; Connect's own errors (bad framing, deadline, size) pass; any
 * other error becomes INTERNAL, and its cause is logged, never sent.
 */
export function errorMapping(logger: Logger): Interceptor {
  return (next) => async (req) => {
    const mapped = (error: unknown): unknown => {
      if (error instanceof IdempotencyError) {
        if (error.cause) logger.warn({ err: error.cause, reason: error.reason, rpc: req.method.name }, "registry unavailable");
        return refusalToConnectError(error);
      }
      if (error instanceof ConnectError) return error;
      logger.error({ err: error, rpc: req.method.name }, "unexpected failure");
      return refusalToConnectError(new IdempotencyError("INTERNAL", "internal error; the cause is logged on the coordinator"));
    };
    let res;
    try {
      res = await next(req);
    } catch (error) {
      throw mapped(error);
    }
    if (!res.stream) return res;
    // A streaming handler runs as its messages are read: what it throws then
    // (a refusal before the first message, too) is mapped the same way.
    const messages = res.message;
    return {
      ...res,
      message: (async function* () {
        try {
          yield* messages;
        } catch (error) {
          throw mapped(error);
        }
      })(),
    };
  };
}
