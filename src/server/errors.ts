import { create, type DescMethod } from "@bufbuild/protobuf";
import { anyPack } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createContextKey, type Interceptor } from "@connectrpc/connect";
import type { Logger } from "pino";
import { ERROR_DOMAIN, IdempotencyError, REFUSALS, STATUS_CODES, type Reason } from "../contract/errors.js";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import { StatusSchema, type Status } from "../gen/google/rpc/status_pb.js";

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

/** The message protobuf-es' binary parser gives connect-es, which sends it as INTERNAL. */
const PARSE_BINARY = "parse binary: ";

/**
 * The refusal of a request whose bytes are not the RPC's request message
 * (connect-es sends the parser's failure as INTERNAL); undefined for any
 * other error.
 */
export function malformedMessageRefusal(error: unknown, method: DescMethod): ConnectError | undefined {
  if (!(error instanceof ConnectError) || error.code !== Code.Internal || !error.rawMessage.startsWith(PARSE_BINARY)) return undefined;
  const why = error.rawMessage.slice(PARSE_BINARY.length);
  return refusalToConnectError(
    new IdempotencyError(
      "INVALID_REQUEST",
      `the request body is not a valid ${method.input.typeName} message in the protobuf binary encoding (${why}): send that message, encoded as proto/ defines it`,
    ),
  );
}

/** Turns whatever a call's handler threw into what its client may see (see errorMapping). */
export type ErrorMapping = (error: unknown, rpc: string) => ConnectError;

/**
 * The mapping of the errorMapping interceptor around the current RPC, for a
 * handler that answers many calls in one RPC (Batch) and refuses each of them
 * as its unary RPC would be refused.
 */
export const errorMappingKey = createContextKey<ErrorMapping | undefined>(undefined, { description: "error mapping" });

/** Reads the mapping set by the errorMapping interceptor (every coordinator RPC runs inside it). */
export function errorMappingOf(values: { get<T>(key: { id: symbol; defaultValue: T }): T }): ErrorMapping {
  const mapping = values.get(errorMappingKey);
  if (!mapping) throw new Error("no error mapping in context");
  return mapping;
}

/**
 * Turns whatever a handler throws into what a client may see: refusals keep
 * their reason; Connect's own errors (bad framing, deadline, size) pass; any
 * other error becomes INTERNAL, and its cause is logged, never sent.
 */
export function errorMapping(logger: Logger): Interceptor {
  const mapped = (error: unknown, rpc: string, method?: DescMethod, signal?: AbortSignal): ConnectError => {
    if (error instanceof IdempotencyError) {
      // A refusal with a cause was made from a failure below (the database, a sealed body): the cause is for the operator only.
      if (error.cause) logger.warn({ err: error.cause, reason: error.reason, rpc }, `refused with ${error.reason} after a failure; the cause is attached`);
      return refusalToConnectError(error);
    }
    // A streaming RPC's messages are parsed as its handler reads them: here (a unary one's before any interceptor, see rpc-handler.ts).
    const malformed = method && malformedMessageRefusal(error, method);
    if (malformed) return malformed;
    // What a handler throws once its RPC was cancelled or ran out of time (the abort of whatever it awaited) is no failure:
    // a client that stops following a stream (Ctrl-C, a dropped Health/Watch) ends it normally.
    if (signal?.aborted) {
      const ended = ConnectError.from(error instanceof ConnectError ? error : signal.reason);
      const why = ended.code === Code.DeadlineExceeded ? "the RPC's deadline passed before it ended" : "the client cancelled the RPC";
      logger.debug({ rpc, code: Code[ended.code], reason: ended.rawMessage }, why);
      return ended;
    }
    if (error instanceof ConnectError) return error;
    logger.error({ err: error, rpc }, "unexpected failure");
    return refusalToConnectError(new IdempotencyError("INTERNAL", "internal error; the cause is logged on the coordinator"));
  };
  return (next) => async (req) => {
    req.contextValues.set(errorMappingKey, mapped);
    let res;
    try {
      res = await next(req);
    } catch (error) {
      throw mapped(error, req.method.name, req.method, req.signal);
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
          throw mapped(error, req.method.name, req.method, req.signal);
        }
      })(),
    };
  };
}

/**
 * The google.rpc.Status of a refused call: the code, message and details the
 * gRPC protocol sends in the grpc-status-details-bin trailer of a refused
 * unary RPC, so that a client rebuilds the very error that RPC would give.
 */
export function statusOf(error: ConnectError): Status {
  return create(StatusSchema, {
    code: error.code,
    message: error.rawMessage,
    details: error.details.map((detail) =>
      "desc" in detail ? anyPack(detail.desc, create(detail.desc, detail.value)) : { typeUrl: `type.googleapis.com/${detail.type}`, value: detail.value },
    ),
  });
}
