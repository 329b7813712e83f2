import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import type { Logger } from "pino";
import { ERROR_DOMAIN, IdempotencyError, REFUSALS, STATUS_CODES, type Reason } from "../contract/errors.js";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";

/** The gRPC/Connect code of a refusal's reason (src/contract/errors.ts: REFUSALS). */
function codeOf(reason: Reason): Code {
  // Connect's Code enum uses the gRPC numbers the table carries.
  return STATUS_CODES[REFUSALS[reason].code].grpc;
}

/** The Connect error for a refusal, with its ErrorInfo detail. */
export function refusalToConnectError(error: IdempotencyError): ConnectError {
  return new ConnectError(error.message, codeOf(error.reason), undefined, [
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
        // A refusal with a cause was made from a failure below (the database, a sealed body): the cause is for the operator only.
        if (error.cause) logger.warn({ err: error.cause, reason: error.reason, rpc: req.method.name }, `refused with ${error.reason} after a failure; the cause is attached`);
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
