import type http from "node:http";
import type http2 from "node:http2";
import { cors as connectCors } from "@connectrpc/connect";
import type { DualHandler } from "./listener.js";

/**
 * CORS on the RPC port, for pages of the configured origins (IDEM_CORS_ORIGINS)
 * calling the coordinator from a browser over Connect or gRPC-Web: a preflight
 * is answered with the methods and headers those protocols send (and
 * Authorization, which every RPC but health needs), and responses expose the
 * headers and trailers their clients read. A request from any other origin
 * gets no CORS header, so its browser keeps the answer from its page.
 */
export function withCors(handler: DualHandler, origins: readonly string[]): DualHandler {
  if (origins.length === 0) return handler;
  const allowed = new Set(origins);
  const allowedHeaders = [...connectCors.allowedHeaders, "Authorization"].join(", ");
  const exposedHeaders = connectCors.exposedHeaders.join(", ");
  const allowedMethods = connectCors.allowedMethods.join(", ");
  return (req, res) => {
    const origin = req.headers.origin;
    if (typeof origin !== "string" || !allowed.has(origin)) return handler(req, res);
    const reply = res as http.ServerResponse & http2.Http2ServerResponse;
    reply.setHeader("Access-Control-Allow-Origin", origin);
    reply.setHeader("Vary", "Origin");
    if (req.method === "OPTIONS" && req.headers["access-control-request-method"] !== undefined) {
      reply.setHeader("Access-Control-Allow-Methods", allowedMethods);
      reply.setHeader("Access-Control-Allow-Headers", allowedHeaders);
      reply.setHeader("Access-Control-Max-Age", "7200");
      reply.writeHead(204);
      reply.end();
      return;
    }
    reply.setHeader("Access-Control-Expose-Headers", exposedHeaders);
    handler(req, res);
  };
}
