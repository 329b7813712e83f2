import type http2 from "node:http2";

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
