import type http2 from "node:http2";
import { Code, ConnectError, type Interceptor, type UnaryRequest, type UnaryResponse } from "@connectrpc/connect";

/** The length-prefixed frame of a gRPC message: a flags byte (0: not compressed) and the length, big-endian. */
export const GRPC_FRAME_PREFIX = 5;

/**
 * What both ends of a unary gRPC call over node:http2 do alike (the
 * coordinator's short path, src/server/grpc-lane.ts, and the gateway SDK's
 * transport, src/gateway/transport.ts).
 */
export function grpcFrame(message: Uint8Array): Buffer {
  const frame = Buffer.allocUnsafe(GRPC_FRAME_PREFIX + message.byteLength);
  frame[0] = 0;
  frame.writeUInt32BE(message.byteLength, 1);
  frame.set(message, GRPC_FRAME_PREFIX);
  return frame;
}

/** The headers (or trailers) node:http2 received, as the Headers connect-es works with, without the pseudo-headers. */
export function webHeaders(headers: http2.IncomingHttpHeaders): Headers {
  const result = new Headers();
  for (const name in headers) {
    if (name.charCodeAt(0) === 58 /* ":" */) continue;
    const value = headers[name];
    if (typeof value === "string") result.set(name, value);
    else if (Array.isArray(value)) for (const v of value) result.append(name, v);
  }
  return result;
}

/**
 * The one message of a unary call's body (the request on the server, the
 * answer on the client), or undefined for an empty body; a body that is not
 * exactly one uncompressed message is refused with connect-es's protocol
 * errors.
 */
export function onlyMessage(body: Buffer, direction: "input" | "output"): Uint8Array | undefined {
  if (body.byteLength === 0) return undefined;
  if (body.byteLength < GRPC_FRAME_PREFIX) throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
  const end = GRPC_FRAME_PREFIX + body.readUInt32BE(1);
  if (body.byteLength < end) throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
  if ((body[0]! & 0b01) === 0b01) throw new ConnectError("received compressed envelope, but do not know how to decompress", Code.Internal);
  if (body.byteLength > end) throw new ConnectError(`protocol error: received extra ${direction} message for unary method`, Code.Unimplemented);
  return body.subarray(GRPC_FRAME_PREFIX, end);
}

/** A unary call's interceptor chain around `innermost`, outermost first, as connect-es applies them (built once per method). */
export function unaryChain(interceptors: readonly Interceptor[], innermost: (req: UnaryRequest) => Promise<UnaryResponse>): (req: UnaryRequest) => Promise<UnaryResponse> {
  return interceptors.reduceRight<(req: UnaryRequest) => Promise<UnaryResponse>>((next, interceptor) => interceptor(next as never) as never, innermost);
}
