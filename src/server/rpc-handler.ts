import type http from "node:http";
import type http2 from "node:http2";
import type { DescMethod } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createConnectRouter,
  createServiceImplSpec,
  type ConnectRouter,
  type ConnectRouterOptions,
  type ContextValues,
  type MethodImplSpec,
} from "@connectrpc/connect";
import { compressionBrotli, compressionGzip, universalRequestFromNodeRequest, universalResponseToNodeResponse } from "@connectrpc/connect-node";
import {
  createAsyncIterable,
  encodeEnvelope,
  readAllBytes,
  validateUniversalHandlerOptions,
  type UniversalHandler,
  type UniversalHandlerFn,
  type UniversalServerResponse,
} from "@connectrpc/connect/protocol";
import { codeToHttpStatus, errorFromJsonBytes, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { trailerFlag, trailerParse, trailerSerialize } from "@connectrpc/connect/protocol-grpc-web";
import type { Logger } from "pino";
import { malformedMessageRefusal } from "./errors.js";
import { grpcLane, type GrpcLane } from "./grpc-lane.js";
import type { DualHandler } from "./listener.js";

export interface RpcHandlerOptions extends ConnectRouterOptions {
  routes: (router: ConnectRouter) => void;
  /** The context values of a request, from its connection's socket (what mutual TLS says of its client). */
  contextValues: (socket: unknown) => ContextValues;
  /** The origins of IDEM_CORS_ORIGINS, for what a refused preflight says. */
  corsOrigins: readonly string[];
  logger: Logger;
}

/**
 * The RPC port's requests, served by the Connect router as connect-node's
 * adapter would serve them, with what that adapter leaves unsaid said:
 *
 * - every answer carries `Cache-Control: no-store, private`: answers are a
 *   caller's records, and a Connect GET is otherwise cacheable by any cache
 *   between the browser and the coordinator;
 * - bytes that are not the RPC's request message are refused as the client's
 *   mistake (INVALID_ARGUMENT, INVALID_REQUEST), not as an internal error;
 * - an unknown path, a wrong HTTP method or content type, and a two-way stream
 *   over HTTP/1.1 are answered with a body (and, for gRPC, a grpc-status and
 *   grpc-message) that says what to send instead, not an empty status line;
 * - an answer that could not be written (its client went away) is logged as
 *   the server's logs say everything else, at debug when it is the client's
 *   cancel.
 */
export function rpcHandler(options: RpcHandlerOptions): RpcHandler {
  const { routes, contextValues, corsOrigins, logger, ...routerOptions } = options;
  const router = createConnectRouter({ acceptCompression: [compressionGzip, compressionBrotli], ...routerOptions });
  const unary = new Map<string, MethodImplSpec>();
  routes(unaryRecorded(router, unary));
  const limits = validateUniversalHandlerOptions(routerOptions);
  const lane = grpcLane({
    methods: unary,
    interceptors: limits.interceptors,
    readMaxBytes: limits.readMaxBytes,
    writeMaxBytes: limits.writeMaxBytes,
    maxTimeoutMs: limits.maxTimeoutMs,
    contextValues,
    logger,
  });
  const services = [...new Set(router.handlers.map((h) => h.service.typeName))];
  const paths = new Map(router.handlers.map((h) => [h.requestPath, explained(h, routerOptions, corsOrigins)]));
  const handle: DualHandler = (req, res) => {
    const reply = res as http.ServerResponse & http2.Http2ServerResponse;
    reply.setHeader("Cache-Control", "no-store, private");
    const path = req.url?.split("?", 2)[0] ?? "";
    const handler = paths.get(path);
    const answer = handler
      ? handler(universalRequestFromNodeRequest(req, res, undefined, contextValues(req.socket)))
      : Promise.resolve(unknownPath(path, protocolOf(req.headers["content-type"]), services));
    answer
      .then((uRes) => universalResponseToNodeResponse(uRes, res))
      .catch((reason: unknown) => {
        const error = ConnectError.from(reason);
        const cancelled = error.code === Code.Aborted || error.code === Code.Canceled || res.destroyed;
        const fields = { path, code: Code[error.code], error: error.message };
        if (cancelled) logger.debug(fields, "the client went away before its answer was written");
        else logger.error({ ...fields, err: reason }, "an answer could not be written");
      });
  };
  return Object.assign(handle, { grpcLane: lane });
}

/** The RPC port's requests over HTTP/1.1 and HTTP/2, and the short path of unary gRPC calls (grpc-lane.ts) for its HTTP/2 streams. */
export type RpcHandler = DualHandler & { grpcLane: GrpcLane };

/**
 * The router, with the unary methods of the services it mounts without
 * options of their own recorded for the gRPC lane (a service with options
 * of its own is served by the router alone).
 */
function unaryRecorded(router: ConnectRouter, unary: Map<string, MethodImplSpec>): ConnectRouter {
  const recorded: ConnectRouter = {
    handlers: router.handlers,
    service(service, implementation, serviceOptions) {
      router.service(service, implementation, serviceOptions);
      if (serviceOptions === undefined) {
        for (const spec of Object.values(createServiceImplSpec(service, implementation).methods)) {
          if (spec.kind === "unary") unary.set(`/${service.typeName}/${spec.method.name}`, spec);
        }
      }
      return recorded;
    },
    rpc(method, impl, rpcOptions) {
      router.rpc(method, impl, rpcOptions);
      return recorded;
    },
  };
  return recorded;
}

type Protocol = "connect" | "grpc" | "grpc-web";

function protocolOf(contentType: string | undefined): Protocol {
  if (/^application\/grpc-web/i.test(contentType ?? "")) return "grpc-web";
  if (/^application\/grpc/i.test(contentType ?? "")) return "grpc";
  return "connect";
}

/**
 * One RPC's handler, with the empty answers of the protocol negotiation (405,
 * 415, 505) given a body, and unary requests that do not parse refused as
 * INVALID_ARGUMENT. (A streaming RPC's messages are parsed as its handler reads
 * them, inside the interceptors: errorMapping refuses those.)
 */
function explained(handler: UniversalHandler, routerOptions: ConnectRouterOptions, corsOrigins: readonly string[]): UniversalHandlerFn {
  const method = handler.method;
  const unary = method.methodKind === "unary";
  return async (req) => {
    const res = await handler(req);
    const protocol = protocolOf(req.header.get("content-type") ?? undefined);
    if (res.status === 405) {
      const allow = handler.allowedMethods.join(", ");
      const message =
        req.method === "OPTIONS"
          ? `no CORS preflight is answered for ${req.header.get("origin") ? `the origin ${req.header.get("origin")}` : "a request without an Origin"}: ` +
            `only pages of the origins listed in IDEM_CORS_ORIGINS may call the coordinator from a browser (${corsOrigins.length === 0 ? "none is configured" : "this one is not listed"})`
          : `${method.parent.typeName}/${method.name} is not answered to ${req.method}: send it as ${allow}` +
            (handler.allowedMethods.includes("GET") ? " (GET: a Connect GET, as it only reads)" : "");
      return refusal(405, new ConnectError(message, Code.Unimplemented), protocol, { Allow: allow });
    }
    if (res.status === 415) {
      const connect = unary ? "application/json or application/proto (Connect)" : "application/connect+json or application/connect+proto (Connect streaming)";
      const given = req.header.get("content-type");
      const message =
        `${given ? `Content-Type '${given}' is not one this RPC reads` : "the request has no Content-Type"}: ` +
        `send ${connect}, application/grpc (gRPC) or application/grpc-web (gRPC-Web, binary), each also as +proto or +json`;
      return refusal(415, new ConnectError(message, Code.InvalidArgument), protocol, {});
    }
    if (res.status === 505) {
      const message = `${method.parent.typeName}/${method.name} streams both ways: call it over HTTP/2`;
      return refusal(505, new ConnectError(message, Code.Unimplemented), protocol, { Connection: "close" });
    }
    if (!unary) return res;
    if (protocol === "connect") return connectUnaryParsed(res, method, routerOptions);
    if (protocol === "grpc") {
      // A request that does not parse fails before any answer: its status is in the trailer by the time the handler resolves.
      grpcTrailerParsed(res.trailer, method);
      return res;
    }
    // gRPC-Web writes its trailer as the body's last frame.
    return { ...res, ...(res.body ? { body: mapped(res.body, (chunk) => grpcWebTrailerParsed(chunk, method)) } : {}) };
  };
}

/** A Connect unary answer, with a request that did not parse refused as INVALID_ARGUMENT. */
async function connectUnaryParsed(res: UniversalServerResponse, method: DescMethod, routerOptions: ConnectRouterOptions): Promise<UniversalServerResponse> {
  // Only an error is answered with 500; a compressed body is not one connect-es wrote for a parse error.
  if (res.status !== 500 || !res.body || res.header?.has("content-encoding")) return res;
  const body = await readAllBytes(res.body, Number.MAX_SAFE_INTEGER);
  let refused: ConnectError | undefined;
  try {
    refused = malformedMessageRefusal(errorFromJsonBytes(body, undefined, new ConnectError("", Code.Internal)), method);
  } catch {
    refused = undefined;
  }
  if (!refused) return { ...res, body: createAsyncIterable([body]) };
  const bytes = errorToJsonBytes(refused, routerOptions.jsonOptions ?? {});
  const header = new Headers(res.header);
  header.set("content-length", String(bytes.byteLength));
  return { ...res, status: codeToHttpStatus(refused.code), header, body: createAsyncIterable([bytes]) };
}

function grpcTrailerParsed(trailer: UniversalServerResponse["trailer"], method: DescMethod): void {
  if (!trailer || trailer.get("grpc-status") !== String(Code.Internal)) return;
  let message: string;
  try {
    message = decodeURIComponent(trailer.get("grpc-message") ?? "");
  } catch {
    return; // not a message connect-es encoded
  }
  const refused = malformedMessageRefusal(new ConnectError(message, Code.Internal), method);
  if (refused) setTrailerStatus(trailer, refused);
}

/** A gRPC-Web body chunk; its trailer frame (uncompressed: connect-es compresses no frame that small) rewritten for a request that did not parse. */
function grpcWebTrailerParsed(chunk: Uint8Array, method: DescMethod): Uint8Array {
  if (chunk.byteLength < 5 || chunk[0] !== trailerFlag) return chunk;
  const trailer = trailerParse(chunk.subarray(5));
  const before = trailer.get("grpc-status");
  grpcTrailerParsed(trailer, method);
  return trailer.get("grpc-status") === before ? chunk : encodeEnvelope(trailerFlag, trailerSerialize(trailer));
}

/**
 * A body whose chunks are passed through `map`. Throw and return go to the
 * body itself, as the adapter reports write errors through them.
 */
function mapped(body: AsyncIterable<Uint8Array>, map: (chunk: Uint8Array) => Uint8Array): AsyncIterable<Uint8Array> {
  return {
    [Symbol.asyncIterator]() {
      const it = body[Symbol.asyncIterator]();
      return {
        async next() {
          const result = await it.next();
          return result.done ? result : { done: false, value: map(result.value) };
        },
        throw: async (e?: unknown) => {
          if (!it.throw) throw e;
          return it.throw(e);
        },
        return: (value?: unknown) => it.return?.(value) ?? Promise.resolve({ done: true, value: undefined }),
      };
    },
  };
}

/** A refusal the protocol negotiation answers, with a body that says what to do. */
function refusal(status: number, error: ConnectError, protocol: Protocol, extra: Record<string, string>): UniversalServerResponse {
  const header = new Headers(extra);
  header.set("Content-Type", "application/json");
  // gRPC clients read the status from headers when there is no message (a trailers-only answer).
  if (protocol !== "connect") {
    header.set("grpc-status", String(error.code));
    header.set("grpc-message", encodeURIComponent(error.rawMessage));
  }
  return { status, header, body: createAsyncIterable([errorToJsonBytes(error, {})]) };
}

/**
 * A path that is no RPC of this port: UNIMPLEMENTED, as gRPC answers an
 * unknown method (200 with its status, trailers-only) and Connect does (404
 * with a JSON error).
 */
function unknownPath(path: string, protocol: Protocol, services: readonly string[]): UniversalServerResponse {
  const error = new ConnectError(
    `no RPC at ${path || "/"}: this port serves ${services.join(", ")}, each method at /<service>/<method> ` +
      "(e.g. POST /idempotency.v1.CoordinatorService/Reserve); /healthz, /readyz, /metrics and the console are on the admin port",
    Code.Unimplemented,
  );
  if (protocol === "connect") return refusal(404, error, protocol, {});
  const status = setTrailerStatus(new Headers(), error);
  const header = new Headers({ "Content-Type": `application/${protocol}` });
  // gRPC-Web reads a status without a message from the headers; gRPC over HTTP/2 from the trailers.
  if (protocol === "grpc-web") return { status: 200, header: new Headers([...header, ...status]) };
  return { status: 200, header, trailer: status };
}
