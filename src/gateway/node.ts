import type { IncomingMessage, OutgoingHttpHeader, OutgoingHttpHeaders, ServerResponse } from "node:http";
import type { GatewayRequest, HandlerResult, IdempotencyContext, IdempotencyGateway, IdempotentRoute } from "./core.js";
import { headerPairs, toHttpResponse } from "./http.js";
import type { HandlerResponse, HttpResponse, Subject } from "./types.js";

/** How a route finds the end user: from the service's own authentication, never the body. */
export type SubjectResolver<Req> = (request: Req) => Subject | undefined | Promise<Subject | undefined>;

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
export function withIdempotency(gateway: IdempotencyGateway, route: NodeRouteOptions, handler: NodeIdempotentHandler): (req: IncomingMessage, res: ServerResponse) => Promise<void> {
  return async (req, res) => {
    let body: Buffer;
    try {
      body = await readBody(req, gateway.maxBodyBytes);
    } catch (error) {
      if (error instanceof BodyTooLarge) {
        sendResponse(res, gateway.problem({ status: 413, slug: "request-too-large", title: "Request body too large", detail: `At most ${gateway.maxBodyBytes} bytes are accepted.` }));
      } else {
        res.destroy();
      }
      return;
    }
    await serve(gateway, route, req, res, body, (ctx) => handler(req, res, ctx));
  };
}

/** @internal The shared node/Express flow once the body is known. */
export async function serve(
  gateway: IdempotencyGateway,
  route: IdempotentRoute & { subject: SubjectResolver<never> },
  req: IncomingMessage,
  res: ServerResponse,
  body: Uint8Array,
  run: (ctx: IdempotencyContext) => unknown,
  url = req.url ?? "/",
): Promise<void> {
  let subject: Subject | undefined;
  try {
    subject = await (route.subject as SubjectResolver<IncomingMessage>)(req);
  } catch (error) {
    gateway.logger.warn({ error: (error as Error).message }, "the subject resolver failed");
    subject = undefined;
  }
  const admission = await gateway.admit(route, subject, requestOf(req, body, url));
  if (!admission.run) {
    sendResponse(res, admission.response);
    return;
  }
  const capture = captureResponse(res);
  // The response is final when the handler ends it; a handler that throws
  // before ending it failed. (Throwing after ending it changes nothing.)
  const result = await new Promise<HandlerResult>((resolve) => {
    void capture.done.then((response) => resolve({ response }));
    Promise.resolve()
      .then(() => run(admission.context))
      .catch((error: unknown) => {
        if (!capture.ended) resolve({ error });
        else gateway.logger.warn({ error: (error as Error)?.message }, "the handler threw after ending its response");
      });
  });
  capture.restore();
  sendResponse(res, await gateway.finish(admission.context, result));
}

/** The gateway's view of a node request. */
export function requestOf(req: IncomingMessage, body: Uint8Array, url = req.url ?? "/"): GatewayRequest {
  const q = url.indexOf("?");
  return {
    method: req.method ?? "GET",
    path: q < 0 ? url : url.slice(0, q),
    query: q < 0 ? "" : url.slice(q + 1),
    headers: req.headers,
    body,
  };
}

export class BodyTooLarge extends Error {
  override readonly name = "BodyTooLarge";
}

/** Reads a request body, refusing more than `limit` bytes. */
export async function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    const buffer = typeof chunk === "string" ? Buffer.from(chunk) : (chunk as Buffer);
    size += buffer.byteLength;
    if (size > limit) throw new BodyTooLarge(`the request body exceeds ${limit} bytes`);
    chunks.push(buffer);
  }
  return Buffer.concat(chunks);
}

/** Writes a handler's response description (status, headers, `json` or `body`) to a node response. */
export function writeResponse(res: ServerResponse, response: HandlerResponse): void {
  sendResponse(res, toHttpResponse(response));
}

/** Writes a concrete response: exactly these headers (and a Content-Length), then the body. */
export function sendResponse(res: ServerResponse, response: HttpResponse): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  const grouped = new Map<string, string[]>();
  for (const [name, value] of response.headers) grouped.set(name, [...(grouped.get(name) ?? []), value]);
  grouped.delete("content-length");
  grouped.delete("transfer-encoding");
  for (const [name, values] of grouped) res.setHeader(name, values.length === 1 ? values[0]! : values);
  res.setHeader("content-length", String(response.body.byteLength));
  res.statusCode = response.status;
  res.end(Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength));
}

interface Capture {
  /** Resolves with the response once the handler ends it. */
  done: Promise<HttpResponse>;
  /** Whether the handler has ended the response. */
  readonly ended: boolean;
  /** Gives the response its own methods back. */
  restore(): void;
}

/**
 * Holds what a handler writes instead of sending it: `writeHead`, `write`
 * and `end` are replaced on this response object (Express's `send`/`json`
 * end in them too), headers stay on the object, the body is buffered. The
 * gateway sends it for real once the outcome is recorded.
 */
export function captureResponse(res: ServerResponse): Capture {
  const original = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
  const chunks: Buffer[] = [];
  let ended = false;
  let resolveDone!: (response: HttpResponse) => void;
  const done = new Promise<HttpResponse>((resolve) => (resolveDone = resolve));
  const toBuffer = (chunk: unknown, encoding?: unknown): Buffer | undefined => {
    if (chunk === undefined || chunk === null || typeof chunk === "function") return undefined;
    if (typeof chunk === "string") return Buffer.from(chunk, typeof encoding === "string" ? (encoding as BufferEncoding) : "utf8");
    if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    return Buffer.from(String(chunk));
  };
  const callbackOf = (...args: unknown[]) => args.find((a): a is () => void => typeof a === "function");

  res.writeHead = function writeHead(statusCode: number, ...rest: unknown[]) {
    res.statusCode = statusCode;
    if (typeof rest[0] === "string") res.statusMessage = rest.shift() as string;
    const headers = rest[0] as OutgoingHttpHeaders | OutgoingHttpHeader[] | undefined;
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2) res.setHeader(String(headers[i]), headers[i + 1] as string);
    } else if (headers) {
      for (const [name, value] of Object.entries(headers)) if (value !== undefined) res.setHeader(name, value);
    }
    return res;
  } as ServerResponse["writeHead"];
  res.flushHeaders = () => undefined;
  res.write = function write(chunk: unknown, ...rest: unknown[]) {
    const buffer = toBuffer(chunk, rest[0]);
    if (buffer && !ended) chunks.push(buffer);
    const cb = callbackOf(...rest);
    if (cb) queueMicrotask(cb);
    return true;
  } as ServerResponse["write"];
  res.end = function end(chunk?: unknown, ...rest: unknown[]) {
    if (ended) return res;
    const buffer = toBuffer(chunk, rest[0]);
    if (buffer) chunks.push(buffer);
    ended = true;
    const headers = headerPairs(res.getHeaders() as Record<string, string | number | string[] | undefined>);
    resolveDone({ status: res.statusCode, headers, body: Buffer.concat(chunks) });
    const cb = callbackOf(chunk, ...rest);
    if (cb) queueMicrotask(cb);
    return res;
  } as ServerResponse["end"];

  return {
    done,
    get ended() {
      return ended;
    },
    restore() {
      res.writeHead = original.writeHead;
      res.write = original.write;
      res.end = original.end;
      res.flushHeaders = original.flushHeaders;
    },
  };
}
