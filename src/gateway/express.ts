/**
 * The gateway's Express 5 middleware (`idempotency-gateway/express`).
 * See docs/adopting.md.
 */
import type { IncomingMessage } from "node:http";
import type { NextFunction, Request, RequestHandler, Response } from "express";
import { check, func, idempotencyGateway } from "./arguments.js";
import type { IdempotencyContext } from "./context.js";
import type { IdempotencyGateway } from "./core.js";
import { checkRoute, type IdempotentRoute, type SubjectResolver } from "./route.js";
import { isJsonMediaType } from "./http.js";
import { BodyTooLarge, readBody, sendResponse, sendTooLarge, serve } from "./node-http.js";

export interface ExpressRouteOptions extends IdempotentRoute {
  subject: SubjectResolver<Request>;
}

/** An Express handler behind the gateway: `req.body` is set (parsed JSON for JSON bodies), `ctx` is the idempotency context. */
export type ExpressIdempotentHandler = (req: Request, res: Response, ctx: IdempotencyContext) => unknown;

/**
 * `express.json({ verify: captureRawBody })` keeps the exact body bytes for
 * the fingerprint when a body parser runs before the gateway.
 */
export function captureRawBody(req: IncomingMessage, _res: unknown, buffer: Buffer): void {
  (req as IncomingMessage & { rawBody?: Buffer }).rawBody = buffer;
}

/**
 * Express 5 middleware for one idempotent route: reserves the request,
 * answers replays, conflicts and refusals itself, and otherwise runs
 * `handler` with the context, capturing what it sends (`res.json`,
 * `res.send`, `res.end`) to record it before sending it.
 *
 * ```ts
 * app.post("/v1/payments", expressIdempotency(gateway, { operation: "payments.create", apiRevision: 1, subject }, async (req, res, ctx) => {
 *   res.status(201).json(await createPayment(req.body, ctx));
 * }));
 * ```
 * The body is read by the middleware (no body parser needed); when a parser
 * ran first it must keep the raw bytes (`captureRawBody`).
 */
export function expressIdempotency(gateway: IdempotencyGateway, route: ExpressRouteOptions, handler: ExpressIdempotentHandler): RequestHandler {
  const form = { name: "expressIdempotency", takes: "(gateway, route: { operation, apiRevision, subject(req), … }, handler(req, res, ctx))" };
  check(form, gateway, "gateway", idempotencyGateway);
  checkRoute(form, route, { subject: func });
  check(form, handler, "handler", func);
  return async (req: Request, res: Response, next: NextFunction) => {
    let body: Buffer;
    const raw = (req as Request & { rawBody?: unknown }).rawBody;
    if (Buffer.isBuffer(raw)) {
      body = raw;
    } else if (req.body !== undefined || req.readableEnded) {
      gateway.logger.error({ path: req.path }, "a body parser consumed the request without keeping its bytes: use express.json({ verify: captureRawBody })");
      sendResponse(res, gateway.problem({ status: 500, slug: "gateway-misconfigured", title: "Internal error", detail: "The request was not processed." }));
      return;
    } else {
      try {
        body = await readBody(req, gateway.maxBodyBytes);
      } catch (error) {
        if (error instanceof BodyTooLarge) {
          sendTooLarge(res, gateway);
          return;
        }
        next(error);
        return;
      }
      req.body = parsedBody(req, body);
    }
    // originalUrl: the path as the client sent it, also under a mounted router.
    await serve({ gateway, route, req, res, body, run: (ctx) => handler(req, res, ctx), url: req.originalUrl });
  };
}

function parsedBody(req: Request, body: Buffer): unknown {
  if (body.byteLength === 0) return undefined;
  if (isJsonMediaType(req.headers["content-type"] ?? "")) {
    try {
      return JSON.parse(body.toString("utf8"));
    } catch {
      // The gateway answers it 400 (malformed-json) before anything is reserved: the handler never sees it.
      return body;
    }
  }
  return body;
}
