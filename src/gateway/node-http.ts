import type { IncomingMessage, OutgoingHttpHeader, OutgoingHttpHeaders, ServerResponse } from "node:http";
import type { IdempotencyContext } from "./context.js";
import type { IdempotencyGateway } from "./core.js";
import type { GatewayRequest, HandlerResult, IdempotentRoute, SubjectResolver } from "./route.js";
import { headerPairs } from "./http.js";
import type { HttpResponse, Subject } from "./types.js";

/**
 * node:http plumbing shared by the node:http and Express middleware: reading
 * a body within a limit, holding a handler's response until the outcome is
 * recorded, writing a response, and the flow between them.
 */

/** What `serve` needs: the gateway, the route, the exchange, the body already read, and the handler to run. */
export interface ServeOptions {
  gateway: IdempotencyGateway;
  route: IdempotentRoute & { subject: SubjectResolver<never> };
  req: IncomingMessage;
  res: ServerResponse;
  body: Uint8Array;
  run: (ctx: IdempotencyContext) => unknown;
  /** The URL as the client sent it (default `req.url`; Express: `originalUrl`). */
  url?: string;
}

/** The shared node/Express flow once the body is known: admit, run the handler capturing its response, finish, send. */
export async function serve(options: ServeOptions): Promise<void> {
  const { gateway, route, req, res, body, run } = options;
  const url = options.url ?? req.url ?? "/";
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

/** A request body over the gateway's `maxBodyBytes` (answered 413). */
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

/** Answers a request whose body is over the gateway's `maxBodyBytes`: 413, nothing done. */
export function sendTooLarge(res: ServerResponse, gateway: IdempotencyGateway): void {
  sendResponse(res, gateway.problem({ status: 413, slug: "request-too-large", title: "Request body too large", detail: `At most ${gateway.maxBodyBytes} bytes are accepted.` }));
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
  // eslint-disable-next-line @typescript-eslint/unbound-method -- unbound on purpose: restore() puts them back on `res`, where they are called as its methods again
  const original = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
  const chunks: Buffer[] = [];
  let ended = false;
  let resolveDone!: (response: HttpResponse) => void;
  const done = new Promise<HttpResponse>((resolve) => (resolveDone = resolve));
  const toBuffer = (chunk: unknown, encoding?: unknown): Buffer | undefined => {
    if (chunk === undefined || chunk === null || typeof chunk === "function") return undefined;
    if (typeof chunk === "string") return Buffer.from(chunk, typeof encoding === "string" ? (encoding as BufferEncoding) : "utf8");
    if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    // What ServerResponse#write itself refuses fails the same way here, instead of recording "[object Object]".
    throw Object.assign(new TypeError(`The "chunk" argument must be of type string or an instance of Buffer or Uint8Array. Received type ${typeof chunk}`), {
      code: "ERR_INVALID_ARG_TYPE",
    });
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
  };
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
    const headers = headerPairs(res.getHeaders());
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
