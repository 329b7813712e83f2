/**
 * The gateway's node:http middleware (`idempotency-gateway/node`):
 * `withIdempotency` around each write route's handler, and `writeResponse`
 * for handlers that describe their response. See docs/adopting.md.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { check, func, handlerResponse, idempotencyGateway } from "./arguments.js";
import type { IdempotencyContext } from "./context.js";
import type { IdempotencyGateway } from "./core.js";
import { checkRoute, type IdempotentRoute, type SubjectResolver } from "./route.js";
import { toHttpResponse } from "./http.js";
import { BodyTooLarge, readBody, sendResponse, sendTooLarge, serve } from "./node-http.js";
import type { HandlerResponse } from "./types.js";

export interface NodeRouteOptions extends IdempotentRoute {
  subject: SubjectResolver<IncomingMessage>;
}

/** A node:http handler behind the gateway; the request body is already read: use `ctx.body` / `ctx.json()`. */
export type NodeIdempotentHandler = (req: IncomingMessage, res: ServerResponse, ctx: IdempotencyContext) => unknown;

/**
 * node:http middleware: wraps one route's handler. The request is reserved
 * before the handler runs; replays, conflicts, in-progress requests and
 * refusals are answered without running it. The handler writes its response
 * as usual (`writeHead`/`write`/`end`, or `writeResponse`); the gateway holds
 * it until the outcome is recorded, then sends it.
 *
 * ```ts
 * http.createServer(withIdempotency(gateway, { operation: "payments.create", apiRevision: 1, subject }, async (req, res, ctx) => {
 *   const charge = await ctx.effect("card.charge", "cards", (key) => cards.charge(key, ctx.json()), { handle: (c) => c.id });
 *   writeResponse(res, { status: 201, json: charge });
 * }));
 * ```
 */
export function withIdempotency(
  gateway: IdempotencyGateway,
  route: NodeRouteOptions,
  handler: NodeIdempotentHandler,
): (req: IncomingMessage, res: ServerResponse) => Promise<void> {
  const form = { name: "withIdempotency", takes: "(gateway, route: { operation, apiRevision, subject(req), … }, handler(req, res, ctx))" };
  check(form, gateway, "gateway", idempotencyGateway);
  checkRoute(form, route, { subject: func });
  check(form, handler, "handler", func);
  return async (req, res) => {
    let body: Buffer;
    try {
      body = await readBody(req, gateway.maxBodyBytes);
    } catch (error) {
      if (error instanceof BodyTooLarge) {
        sendTooLarge(res, gateway);
      } else {
        res.destroy();
      }
      return;
    }
    await serve({ gateway, route, req, res, body, run: (ctx) => handler(req, res, ctx) });
  };
}

/** Writes a handler's response description (status, headers, `json` or `body`) to a node response. */
export function writeResponse(res: ServerResponse, response: HandlerResponse): void {
  check({ name: "writeResponse", takes: "(res, response: { status, headers?, json? | body? })" }, response, "response", handlerResponse);
  sendResponse(res, toHttpResponse(response));
}
