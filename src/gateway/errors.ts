import { Code, ConnectError } from "@connectrpc/connect";
import { ERROR_DOMAIN, IdempotencyError, refusalOf, REFUSALS, STATUS_CODES } from "../contract/errors.js";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import type { Status } from "../gen/google/rpc/status_pb.js";

/** True for a reason that says "nothing was decided, the registry was momentarily out of reach" (REFUSALS). */
const isTransient = (reason: string): boolean => refusalOf(reason)?.retryable === true;

/**
 * A failed coordinator call: either a refusal with a stable `reason` (see
 * proto/idempotency/v1/errors.proto), or a transport failure (`reason`
 * undefined). Switch on `reason`, never on the message.
 */
export class CoordinatorError extends Error {
  override readonly name = "CoordinatorError";

  constructor(
    message: string,
    /** The gRPC/Connect code. */
    readonly code: Code,
    /** The ErrorInfo reason, e.g. `STALE_GENERATION`; undefined for transport failures. */
    readonly reason: string | undefined,
    /** Safe facts of the refusal (ErrorInfo metadata). */
    readonly metadata: Record<string, string> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  /**
   * True when nothing was decided and the call may simply be repeated:
   * UNAVAILABLE without a reason (the transport failed), or with
   * REGISTRY_UNAVAILABLE / REGISTRY_BUSY. Never OPERATION_DRAINING nor any
   * other refusal: those are answers.
   */
  get retryable(): boolean {
    return this.transportFailed || (this.code === Code.Unavailable && this.reason !== undefined && isTransient(this.reason));
  }

  /** True when the call never reached a coordinator that answered: UNAVAILABLE without a reason. */
  get transportFailed(): boolean {
    return this.code === Code.Unavailable && this.reason === undefined;
  }

  /**
   * True when the coordinator could not give an answer (transport failure,
   * deadline, registry out of reach, internal error): a gateway fails closed.
   */
  get unreachable(): boolean {
    return this.reason === undefined || isTransient(this.reason) || this.reason === "INTERNAL";
  }
}

/** Turns whatever a coordinator call threw (Connect error, in-process refusal, anything) into a CoordinatorError. */
export function toCoordinatorError(error: unknown): CoordinatorError {
  if (error instanceof CoordinatorError) return error;
  if (error instanceof IdempotencyError) {
    // In-process (co-located) refusals carry the same reasons as the wire.
    // Connect's Code enum uses the gRPC numbers the table carries.
    const code: Code = STATUS_CODES[REFUSALS[error.reason].code].grpc;
    return new CoordinatorError(error.message, code, error.reason, error.metadata, { cause: error });
  }
  const connectError = ConnectError.from(error);
  const info = connectError.findDetails(ErrorInfoSchema).find((d) => d.domain === ERROR_DOMAIN || d.domain === "");
  return new CoordinatorError(connectError.rawMessage || connectError.message, connectError.code, info?.reason || undefined, info ? { ...info.metadata } : {}, {
    cause: error,
  });
}

/**
 * The error of a call refused inside a Batch RPC: the ConnectError the gRPC
 * protocol builds from the grpc-status-details-bin trailer of the same call
 * refused alone (same code, message and details), for toCoordinatorError to
 * read as it reads that one.
 */
export function errorOfStatus(status: Status): ConnectError {
  if (!(status.code in Code) || status.code === 0) {
    return new ConnectError(`the coordinator answered a call with an invalid status ${status.code}`, Code.Internal);
  }
  const error = new ConnectError(status.message, status.code);
  error.details = status.details.map((any) => ({ type: any.typeUrl.substring(any.typeUrl.lastIndexOf("/") + 1), value: any.value }));
  return error;
}

/**
 * Refusals of a renewal or an effect's registration meaning this owner's
 * lease is gone for good: another owner took over (STALE_GENERATION), the
 * lease ended or the record became UNKNOWN (LEASE_EXPIRED), the record left
 * EXECUTING (INVALID_TRANSITION) or is no longer there (NOT_FOUND). Stop
 * renewing, start no new effect.
 */
export function isLeaseLost(failure: CoordinatorError): failure is CoordinatorError & { reason: string } {
  return failure.reason !== undefined && LEASE_LOST_REASONS.has(failure.reason);
}

const LEASE_LOST_REASONS: ReadonlySet<string> = new Set(["STALE_GENERATION", "LEASE_EXPIRED", "INVALID_TRANSITION", "NOT_FOUND"]);

/**
 * Thrown by an effect's function when the downstream system definitely did
 * nothing (a card declined, a validation refusal): the attempt is resolved
 * NO_EFFECT, so the operation may still be rejected or released. Any other
 * error is INDETERMINATE (the call may have happened).
 */
export class DefiniteFailure extends Error {
  override readonly name: string = "DefiniteFailure";

  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** True for a DefiniteFailure (also across copies of this module). */
export function isDefiniteFailure(error: unknown): boolean {
  return error instanceof DefiniteFailure || (error instanceof Error && (error as { definiteFailure?: unknown }).definiteFailure === true);
}

/**
 * Thrown by `effect()` when this owner may no longer start effects: its lease
 * was lost (another owner took over, or the record became UNKNOWN). Nothing
 * was started downstream.
 */
export class LeaseLostError extends Error {
  override readonly name = "LeaseLostError";

  constructor(
    message: string,
    /** The refusal that showed the loss (STALE_GENERATION, LEASE_EXPIRED, …). */
    readonly reason: string | undefined,
  ) {
    super(message);
  }
}

/**
 * Thrown by `ctx.json()` when the request body is not valid JSON. Nothing
 * can have happened because of it: left uncaught, the gateway answers 400
 * `malformed-json` (and records it REJECTED, so that the same request
 * retried gets the same answer).
 */
export class MalformedJsonBody extends Error {
  override readonly name = "MalformedJsonBody";

  constructor(
    /** What is wrong and where, e.g. `JSON body at $.amount: unexpected '}' at byte 11; expected a JSON value …`. */
    message: string,
    /** The JSON path of the value being read when the text went wrong, e.g. `$.amount`. */
    readonly path: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}
