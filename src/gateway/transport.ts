import http2 from "node:http2";
import { create, isMessage, type DescMethod } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, type Interceptor, type Transport, type UnaryRequest, type UnaryResponse } from "@connectrpc/connect";
import { createGrpcTransport, type Http2SessionManager } from "@connectrpc/connect-node";
import { createMethodSerializationLookup, getAbortSignalReason } from "@connectrpc/connect/protocol";
import { requestHeader, validateResponse, validateTrailer } from "@connectrpc/connect/protocol-grpc";
import { grpcFrame, onlyMessage, unaryChain, webHeaders } from "../grpc-wire.js";

/** The largest message the protocol can frame, as connect-node's transport allows by default. */
const UNLIMITED = { readMaxBytes: 0xffffffff, writeMaxBytes: 0xffffffff };
const { NGHTTP2_CANCEL, NGHTTP2_INTERNAL_ERROR } = http2.constants;

/**
 * A gRPC transport whose unary calls go straight onto an HTTP/2 stream of the
 * session manager: one request message written, one answer read, with the
 * interceptors, deadlines, cancellation and error codes of connect-node's
 * gRPC transport, without its general stream pipeline (which a unary call
 * pays for on every call). Streaming calls go through connect-node's
 * transport on the same session.
 */
export function directGrpcTransport(options: { baseUrl: string; sessionManager: Http2SessionManager; interceptors?: Interceptor[] }): Transport {
  const { baseUrl, sessionManager } = options;
  const interceptors = options.interceptors ?? [];
  const streaming = createGrpcTransport({ baseUrl, sessionManager, interceptors });
  const base = baseUrl.replace(/\/$/, "");
  // Per method, once: its serializers, its address and its interceptor chain.
  const methods = new Map<DescMethod, { url: string; chain: (req: UnaryRequest) => Promise<UnaryResponse> }>();
  const methodOf = (method: DescMethod) => {
    let found = methods.get(method);
    if (!found) {
      const serialization = createMethodSerializationLookup(method, undefined, undefined, UNLIMITED);
      const serialize = (message: unknown) => serialization.getI(true).serialize(message as never);
      const parse = (bytes: Uint8Array) => serialization.getO(true).parse(bytes);
      const path = `/${method.parent.typeName}/${method.name}`;
      found = { url: `${base}${path}`, chain: unaryChain(interceptors, (req) => exchange(sessionManager, path, req, serialize, parse)) };
      methods.set(method, found);
    }
    return found;
  };
  return {
    unary(method, signal, timeoutMs, header, input, contextValues) {
      const { url, chain } = methodOf(method);
      const deadline = timeoutMs === undefined || timeoutMs <= 0 ? undefined : timeoutMs;
      // One controller per call, aborted by the deadline or the caller's signal only (never when the call ends: that costs an error object per call).
      const controller = new AbortController();
      const timer = deadline === undefined ? undefined : setTimeout(() => controller.abort(new ConnectError("the operation timed out", Code.DeadlineExceeded)), deadline);
      const onAbort = () => controller.abort(ConnectError.from(getAbortSignalReason(signal!), Code.Canceled));
      if (signal?.aborted) onAbort();
      else signal?.addEventListener("abort", onAbort);
      const cleanup = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      const req: UnaryRequest = {
        stream: false,
        service: method.parent,
        method,
        requestMethod: "POST",
        url,
        header: requestHeader(true, deadline, header),
        contextValues: contextValues ?? createContextValues(),
        message: isMessage(input, method.input) ? input : create(method.input, input as never),
        signal: controller.signal,
      };
      return chain(req).then(
        (res) => {
          cleanup();
          return res as never;
        },
        (error: unknown) => {
          cleanup();
          throw controller.signal.aborted ? ConnectError.from(getAbortSignalReason(controller.signal), Code.Canceled) : ConnectError.from(error);
        },
      );
    },
    stream: (...args) => streaming.stream(...args),
  };
}

/** One unary call on its own HTTP/2 stream. */
async function exchange(
  sessionManager: Http2SessionManager,
  path: string,
  req: UnaryRequest,
  serialize: (message: unknown) => Uint8Array,
  parse: (bytes: Uint8Array) => unknown,
): Promise<UnaryResponse> {
  const envelope = grpcFrame(serialize(req.message));
  const headers: http2.OutgoingHttpHeaders = {};
  req.header.forEach((value, name) => {
    headers[name] = value;
  });
  const stream = await sessionManager.request("POST", path, headers, {});
  return new Promise<UnaryResponse>((resolve, reject) => {
    let settled = false;
    let responseHeaders: http2.IncomingHttpHeaders | undefined;
    let trailers: http2.IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];
    const settle = (error: ConnectError | undefined, response?: UnaryResponse) => {
      if (settled) return;
      settled = true;
      req.signal.removeEventListener("abort", onAbort);
      if (response) resolve(response);
      else reject(error ?? new ConnectError("protocol error: no answer", Code.Unknown));
    };
    const onAbort = () => {
      const reason = ConnectError.from(getAbortSignalReason(req.signal));
      // A cancelled call says so to the server with CANCEL, as gRPC maps it.
      if (!stream.closed) stream.close(reason.code === Code.Canceled ? NGHTTP2_CANCEL : NGHTTP2_INTERNAL_ERROR);
      settle(reason);
    };
    if (req.signal.aborted) return onAbort();
    req.signal.addEventListener("abort", onAbort);
    stream.on("response", (h: http2.IncomingHttpHeaders) => (responseHeaders = h));
    stream.on("trailers", (t: http2.IncomingHttpHeaders) => (trailers = t));
    stream.on("data", (chunk: Buffer) => {
      chunks.push(chunk);
      sessionManager.notifyResponseByteRead(stream);
    });
    stream.on("error", (error: Error) => {
      // The server answered (an early refusal) while the request was still being written: its answer wins.
      if (stream.writableEnded && (error as { code?: string }).code === "ERR_STREAM_WRITE_AFTER_END") return;
      settle(fromNodeError(error));
    });
    stream.on("close", () => {
      if (!settled) settle(fromResetCode(stream.rstCode) ?? new ConnectError("protocol error: the stream closed before its answer", Code.Unknown));
    });
    stream.on("end", () => {
      try {
        settle(undefined, answerOf(req, responseHeaders, trailers, Buffer.concat(chunks), parse));
      } catch (error) {
        settle(ConnectError.from(error));
      }
    });
    stream.end(envelope);
  });
}

/** The answer of a unary call, validated as connect-node's gRPC transport validates it. */
function answerOf(
  req: UnaryRequest,
  responseHeaders: http2.IncomingHttpHeaders | undefined,
  trailers: http2.IncomingHttpHeaders,
  body: Buffer,
  parse: (bytes: Uint8Array) => unknown,
): UnaryResponse {
  const header = webHeaders(responseHeaders ?? {});
  const { headerError } = validateResponse(Number(responseHeaders?.[":status"] ?? 0), header);
  const message = onlyMessage(body, "output");
  const trailer = webHeaders(trailers);
  validateTrailer(trailer, header);
  if (message === undefined) {
    if (headerError) throw headerError;
    throw new ConnectError("protocol error: missing output message for unary method", trailer.has("grpc-status") ? Code.Unimplemented : Code.Unknown);
  }
  if (headerError) throw new ConnectError("protocol error: received output message for unary method with error status", Code.Unknown);
  return { stream: false, service: req.service, method: req.method, header, message: parse(message) as never, trailer };
}

/** The code of a failed stream, as connect-node gives it: a connection that could not be made is UNAVAILABLE (nothing was sent). */
function fromNodeError(error: Error): ConnectError {
  const codes = new Set<string>();
  const seen = new Set<unknown>();
  for (let e: unknown = error; e instanceof Error && !seen.has(e); e = e.cause) {
    seen.add(e);
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") codes.add(code);
  }
  const code = ["ERR_STREAM_WRITE_AFTER_END", "ERR_STREAM_DESTROYED", "ERR_HTTP2_INVALID_STREAM", "ECONNRESET"].some((c) => codes.has(c))
    ? Code.Aborted
    : ["ETIMEDOUT", "ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED"].some((c) => codes.has(c))
      ? Code.Unavailable
      : Code.Internal;
  const connectError = ConnectError.from(error, code);
  if (connectError !== error) connectError.cause = error;
  return connectError;
}

/** gRPC's codes for the HTTP/2 error codes a peer resets a stream with (none for NO_ERROR and STREAM_CLOSED). */
const RESET_CODES: Readonly<Record<number, Code>> = {
  [http2.constants.NGHTTP2_PROTOCOL_ERROR]: Code.Internal,
  [http2.constants.NGHTTP2_INTERNAL_ERROR]: Code.Internal,
  [http2.constants.NGHTTP2_FLOW_CONTROL_ERROR]: Code.Internal,
  [http2.constants.NGHTTP2_SETTINGS_TIMEOUT]: Code.Internal,
  [http2.constants.NGHTTP2_FRAME_SIZE_ERROR]: Code.Internal,
  [http2.constants.NGHTTP2_COMPRESSION_ERROR]: Code.Internal,
  [http2.constants.NGHTTP2_CONNECT_ERROR]: Code.Internal,
  [http2.constants.NGHTTP2_REFUSED_STREAM]: Code.Unavailable,
  [http2.constants.NGHTTP2_CANCEL]: Code.Canceled,
  [http2.constants.NGHTTP2_ENHANCE_YOUR_CALM]: Code.ResourceExhausted,
  [http2.constants.NGHTTP2_INADEQUATE_SECURITY]: Code.PermissionDenied,
  [http2.constants.NGHTTP2_HTTP_1_1_REQUIRED]: Code.PermissionDenied,
};

/** The code of a stream the peer reset, as gRPC maps HTTP/2 error codes. */
function fromResetCode(rstCode: number): ConnectError | undefined {
  const code = RESET_CODES[rstCode];
  return code === undefined ? undefined : new ConnectError(`http/2 stream closed with error code ${rstCode} (0x${rstCode.toString(16)})`, code);
}
