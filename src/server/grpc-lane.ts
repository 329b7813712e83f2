import type http2 from "node:http2";
import { create, isMessage, type DescMessage } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createContextKey,
  type ContextValues,
  type HandlerContext,
  type Interceptor,
  type MethodImplSpec,
  type UnaryRequest,
  type UnaryResponse,
} from "@connectrpc/connect";
import { createMethodSerializationLookup } from "@connectrpc/connect/protocol";
import { parseTimeout, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import type { Logger } from "pino";
import { GRPC_FRAME_PREFIX, grpcFrame, onlyMessage, unaryChain, webHeaders } from "../grpc-wire.js";
import { malformedMessageRefusal } from "./errors.js";

/** Serves one HTTP/2 stream when it is a call the lane takes, and says whether it did. */
export type GrpcLane = ((stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders) => boolean) & {
  /** Calls the lane answered (tests and the benchmark read it). */
  readonly served: number;
};

export interface GrpcLaneOptions {
  /** The unary methods the lane may answer, by request path (/<service>/<method>). */
  methods: ReadonlyMap<string, MethodImplSpec>;
  /** The same interceptors, in the same order, as the Connect router's. */
  interceptors: readonly Interceptor[];
  readMaxBytes: number;
  writeMaxBytes: number;
  maxTimeoutMs: number;
  /** The context values of a call (what mutual TLS says of the connection's client). */
  contextValues: (socket: unknown) => ContextValues;
  logger: Logger;
}

const RESPONSE_CONTENT_TYPE = "application/grpc+proto";
const ACCEPTED_ENCODINGS = "gzip,br";
/** The handler context of the current call, for the innermost step of the chain built once per method. */
const handlerContextKey = createContextKey<HandlerContext | undefined>(undefined, { description: "handler context of a gRPC lane call" });

/**
 * The short path of the commonest call: a unary gRPC call over HTTP/2 with
 * an uncompressed binary message, the way the gateway SDK and the clients
 * generated from the proto call the coordinator. It runs the same
 * interceptors and the same method implementation as the Connect router, and
 * answers with the same status, message and details; it only leaves out the
 * general machinery a unary call does not need (the compatibility request and
 * response objects of node:http2, the stream pipeline of a universal handler,
 * an interceptor chain assembled per call). Everything else (Connect,
 * gRPC-Web, JSON, compressed messages, streams, browsers' requests, unknown
 * paths) is left to the router: the lane declines it before reading a byte.
 */
export function grpcLane(options: GrpcLaneOptions): GrpcLane {
  const methods = new Map([...options.methods].map(([path, spec]) => [path, laneMethod(spec, options)]));
  let served = 0;
  const lane = (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): boolean => {
    if (headers[":method"] !== "POST" || headers.origin !== undefined) return false;
    const method = methods.get(headers[":path"] ?? "");
    if (!method) return false;
    const contentType = headers["content-type"];
    if (contentType !== "application/grpc" && contentType !== "application/grpc+proto") return false;
    const encoding = headers["grpc-encoding"];
    if (encoding !== undefined && encoding !== "identity") return false;
    served++;
    method(stream, headers);
    return true;
  };
  return Object.defineProperty(lane, "served", { get: () => served }) as GrpcLane;
}

type LaneMethod = (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders) => void;

function laneMethod(spec: MethodImplSpec, options: GrpcLaneOptions): LaneMethod {
  if (spec.kind !== "unary") throw new Error(`the gRPC lane answers unary methods only, not ${spec.method.parent.typeName}/${spec.method.name}`);
  const method = spec.method;
  const serialization = createMethodSerializationLookup(method, undefined, undefined, { readMaxBytes: options.readMaxBytes, writeMaxBytes: options.writeMaxBytes });
  const input = serialization.getI(true);
  const output = serialization.getO(true);
  // The chain is assembled once: the call's handler context travels in its context values.
  const innermost = async (req: UnaryRequest): Promise<UnaryResponse> => {
    const context = req.contextValues.get(handlerContextKey)!;
    const result = await spec.impl(req.message, { ...context, service: req.service, requestHeader: req.header, signal: req.signal, values: req.contextValues });
    return {
      stream: false,
      service: method.parent,
      method,
      header: context.responseHeader,
      trailer: context.responseTrailer,
      message: normalized(method.output, result),
    };
  };
  const chain = unaryChain(options.interceptors, innermost);
  const url = `/${method.parent.typeName}/${method.name}`;

  return (stream, headers) => {
    const call = new LaneCall(stream, options.logger, url);
    const chunks: Buffer[] = [];
    let received = 0;
    let declared: number | undefined;
    stream.on("data", (chunk: Buffer) => {
      if (call.ended) return;
      chunks.push(chunk);
      received += chunk.byteLength;
      // A message larger than allowed is refused from its prefix, before its bytes arrive.
      if (declared === undefined && received >= GRPC_FRAME_PREFIX) {
        declared = Buffer.concat(chunks).readUInt32BE(1);
        if (declared > options.readMaxBytes) {
          call.fail(new ConnectError(`message size ${declared} is larger than configured readMaxBytes ${options.readMaxBytes}`, Code.ResourceExhausted));
        }
      }
      // Bytes past the one message are never kept: a unary call has one.
      if (declared !== undefined && received > GRPC_FRAME_PREFIX + declared) {
        call.fail(new ConnectError("protocol error: received extra input message for unary method", Code.Unimplemented));
      }
    });
    stream.once("end", () => {
      if (call.ended) return;
      const body = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, received);
      let message: unknown;
      let timeoutMs: number | undefined;
      try {
        timeoutMs = timeoutOf(headers, options.maxTimeoutMs);
        const bytes = onlyMessage(body, "input");
        if (!bytes) throw new ConnectError("protocol error: missing input message for unary method", Code.Unimplemented);
        message = input.parse(bytes);
      } catch (error) {
        call.fail(malformedMessageRefusal(error, method) ?? ConnectError.from(error, Code.Internal));
        return;
      }
      const requestHeader = webHeaders(headers);
      const contextValues = options.contextValues(stream.session?.socket);
      // The call's one signal ends it at its deadline or when the client goes; it is not aborted once answered (nothing waits on it then).
      const deadlineAt = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
      const timer = timeoutMs === undefined ? undefined : setTimeout(() => call.expire(), timeoutMs);
      const context: HandlerContext = {
        service: method.parent,
        method,
        protocolName: "grpc",
        requestMethod: "POST",
        url,
        signal: call.signal,
        timeoutMs: () => (deadlineAt === undefined ? undefined : deadlineAt - Date.now()),
        requestHeader,
        responseHeader: new Headers({ "content-type": RESPONSE_CONTENT_TYPE }),
        responseTrailer: new Headers(),
        values: contextValues,
      };
      contextValues.set(handlerContextKey, context);
      chain({ stream: false, service: method.parent, method, requestMethod: "POST", url, signal: call.signal, header: requestHeader, contextValues, message } as UnaryRequest)
        .then(
          (res) => call.succeed(output.serialize(res.message), res.header, res.trailer),
          (error: unknown) => call.fail(error instanceof ConnectError ? error : new ConnectError("internal error", Code.Internal, undefined, undefined, error)),
        )
        .catch((error: unknown) => call.fail(ConnectError.from(error, Code.Internal)))
        .finally(() => clearTimeout(timer));
    });
  };
}

/** One call's stream: answered once, with what the client may read of a failure. */
class LaneCall {
  ended = false;
  private readonly abort = new AbortController();

  constructor(
    private readonly stream: http2.ServerHttp2Stream,
    private readonly logger: Logger,
    private readonly url: string,
  ) {
    // A client that resets its stream cancels the call; a write to a reset stream is no failure of the server's.
    stream.on("error", (error: Error) => logger.debug({ path: url, error: error.message }, "the client went away before its answer was written"));
    stream.once("close", () => {
      if (!this.ended) this.abort.abort(new ConnectError("the client cancelled the RPC", Code.Canceled));
      this.ended = true;
    });
  }

  get signal(): AbortSignal {
    return this.abort.signal;
  }

  /** The call's deadline passed: its handler is told, as connect-es tells it. */
  expire(): void {
    if (!this.ended) this.abort.abort(new ConnectError("the operation timed out", Code.DeadlineExceeded));
  }

  succeed(message: Uint8Array, header: Headers, trailer: Headers): void {
    if (!this.open()) return;
    const envelope = grpcFrame(message);
    const trailers = headerObject(trailer, { "grpc-status": "0" });
    this.stream.respond(headerObject(header, responseHeaders()), { waitForTrailers: true });
    this.stream.once("wantTrailers", () => this.stream.sendTrailers(trailers));
    this.stream.end(envelope);
  }

  /** A failure as a trailers-only answer: its status, message and details in the one HEADERS frame. */
  fail(error: ConnectError): void {
    if (!this.open()) return;
    const status = new Headers();
    setTrailerStatus(status, error);
    this.stream.respond(headerObject(status, responseHeaders()), { endStream: true });
    // Whatever the client still sends is not read: tell it to stop (RST_STREAM NO_ERROR once the answer is out).
    this.stream.resume();
  }

  private open(): boolean {
    if (this.ended || this.stream.destroyed) return false;
    this.ended = true;
    return true;
  }
}

const responseHeaders = (): http2.OutgoingHttpHeaders => ({
  ":status": 200,
  "content-type": RESPONSE_CONTENT_TYPE,
  "grpc-accept-encoding": ACCEPTED_ENCODINGS,
  // Answers are a caller's records: no cache between the client and the coordinator keeps them.
  "cache-control": "no-store, private",
});

function headerObject(headers: Headers, into: http2.OutgoingHttpHeaders): http2.OutgoingHttpHeaders {
  headers.forEach((value, name) => {
    into[name] = value;
  });
  return into;
}

function timeoutOf(headers: http2.IncomingHttpHeaders, maxTimeoutMs: number): number | undefined {
  const value = headers["grpc-timeout"];
  const timeout = parseTimeout(typeof value === "string" ? value : null, maxTimeoutMs);
  if (timeout.error) throw timeout.error;
  return timeout.timeoutMs;
}

function normalized(schema: DescMessage, value: unknown): never {
  return (isMessage(value, schema) ? value : create(schema, value as never)) as never;
}
