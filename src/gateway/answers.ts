import type { CoordinatorError } from "./errors.js";
import { retryAfterSeconds, type Problem } from "./http.js";
import type { IdempotentRoute } from "./route.js";
import type { ReserveResult, SdkLogger } from "./types.js";

/**
 * The problems the gateway answers a request with instead of running its
 * handler (the contract's HTTP mapping, docs/adopting.md section 2): the
 * decisions that do not run it and the refusals of Reserve. The gateway
 * (core.ts) turns each into a response with its own problem type base.
 */

/** 500 for a gateway whose configuration is wrong (logged where it is found): nothing the client can fix. */
export const MISCONFIGURED: Problem = { status: 500, slug: "gateway-misconfigured", title: "Internal error", detail: "The request was not processed." };

/** 503 for a coordinator (or, co-located, the registry's database) that cannot be reached: fail closed. */
export const UNAVAILABLE: Problem = {
  status: 503,
  slug: "coordinator-unavailable",
  title: "Service temporarily unavailable",
  detail: "The request was not processed. Retry later with the same Idempotency-Key.",
  retryAfterSeconds: 1,
};

/** 503 when nothing was done downstream and the record was handed back (or, local-only, rolled back): the retry runs anew. */
export const RETRYABLE_FAILURE: Problem = {
  status: 503,
  slug: "retryable-failure",
  title: "The request failed before doing anything",
  detail: "Nothing was done. Retry with the same Idempotency-Key.",
  retryAfterSeconds: 1,
};

/** The answer of a decision that does not run the handler (IN_PROGRESS, PAYLOAD_CONFLICT, EXPIRED); undefined for the others. */
export function decisionProblem(reserved: ReserveResult, statusUrl: (operationId: string) => string): Problem | undefined {
  switch (reserved.decision) {
    case "IN_PROGRESS": {
      const url = statusUrl(reserved.operationId);
      return {
        status: 409,
        slug: "request-in-progress",
        title: "A request with this Idempotency-Key is in progress",
        detail: "The first request with this key has not finished. Retry after the time in Retry-After, with the same key, to get its result.",
        retryAfterSeconds: retryAfterSeconds(reserved.retryAfterMs),
        headers: [
          ["location", url],
          ["link", `<${url}>; rel="monitor"`],
        ],
        extensions: { operationId: reserved.operationId },
      };
    }
    case "PAYLOAD_CONFLICT":
      return {
        status: 422,
        slug: "payload-conflict",
        title: "Idempotency-Key reused with a different request",
        detail: "This key was already used for a different request. Use a new key for a new request.",
      };
    case "EXPIRED":
      return {
        status: 410,
        slug: "result-expired",
        title: "The result of this request is no longer available",
        detail: "The request with this key finished long ago and its response was not kept. It will not run again; use a new key for a new request.",
      };
    default:
      return undefined;
  }
}

/** The answer to a refused or failed Reserve (contract section 8), with what the client is never told logged. */
export function refusalProblem(failure: CoordinatorError, route: IdempotentRoute, logger: SdkLogger): Problem {
  switch (failure.reason) {
    case "INVALID_KEY":
      // The coordinator's message says what is wrong with the key (it is the client's own input).
      return { status: 400, slug: "idempotency-key-invalid", title: "Idempotency-Key is not acceptable", detail: failure.message };
    case "INVALID_PAYLOAD":
      return { status: 400, slug: "invalid-payload", title: "The request body is not acceptable", detail: failure.message };
    case "QUOTA_EXCEEDED":
      return {
        status: 429,
        slug: "too-many-pending-requests",
        title: "Too many unfinished requests",
        detail: "You have too many requests of this kind still in progress. Retry when some have finished.",
        retryAfterSeconds: 1,
      };
    case "OPERATION_DRAINING":
      return {
        status: 503,
        slug: "operation-draining",
        title: "This operation is not accepting new requests",
        detail: "The service is draining this operation. The request was not processed; retry later.",
        retryAfterSeconds: 5,
      };
    case "STALE_WRITER_EPOCH":
      logger.error({ operation: route.operation, reason: failure.reason }, "this deployment's writer epoch was fenced out (rollback): refusing writes");
      return UNAVAILABLE;
    case "UNKNOWN_OPERATION":
    case "PERMISSION_DENIED":
    case "UNAUTHENTICATED":
    case "INVALID_REQUEST":
    case "UNKNOWN_FIELD":
      // The gateway's configuration is wrong; the client cannot fix it. Log, say nothing specific.
      logger.error({ operation: route.operation, reason: failure.reason, error: failure.message }, "the coordinator refused this gateway's request");
      return MISCONFIGURED;
    default:
      logger.warn({ operation: route.operation, code: failure.code, reason: failure.reason, error: failure.message }, "coordinator unavailable: failing closed");
      return UNAVAILABLE;
  }
}
