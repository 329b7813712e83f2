/**
 * The gateway's Fastify 5 plugin (`idempotency-gateway/fastify`).
 * See docs/adopting.md.
 */
import { Readable } from "node:stream";
import type { FastifyInstance, FastifyReply, FastifyRequest, RouteOptions } from "fastify";
import { checkOptions, func, idempotencyGateway } from "./arguments.js";
import type { IdempotencyContext } from "./context.js";
import type { IdempotencyGateway } from "./core.js";
import { checkRoute, type GatewayRequest, type HandlerResult, type IdempotentRoute, type SubjectResolver } from "./route.js";
import { headerPairs } from "./http.js";
import type { HttpResponse } from "./types.js";

declare module "fastify" {
  interface FastifyRequest {
    /** The idempotency context of a route with `config.idempotency` (set before the handler runs). */
    idempotency?: IdempotencyContext;
  }
  interface FastifyContextConfig {
    /** Makes the route idempotent: the operation and API revision it reserves under. */
    idempotency?: IdempotentRoute;
  }
}

export interface FastifyIdempotencyOptions {
  gateway: IdempotencyGateway;
  /** The end user, from the service's own authentication (a decorated request, a verified token). */
  subject: SubjectResolver<FastifyRequest>;
}

/** Per-request state kept out of the public request type. */
interface State {
  rawBody?: Buffer;
  /** The handler threw (an error without a 4xx status). */
  thrown?: { error: unknown };
  /** The gateway answered before the handler (replay, refusal): onSend leaves the payload alone. */
  answered?: boolean;
  finished?: boolean;
}
const STATE = Symbol("idempotency-state");
type WithState = FastifyRequest & { [STATE]?: State };
const stateOf = (request: FastifyRequest): State => ((request as WithState)[STATE] ??= {});

/**
 * Fastify 5 plugin: every route declared after it with
 * `config: { idempotency: { operation, apiRevision } }` is reserved before
 * its handler (preHandler, after the service's own authentication hooks),
 * answered by the gateway when it must not run (replay, conflict, in
 * progress, refusals, coordinator unreachable), and recorded after it (onSend)
 * with the status, headers and serialized body it produced. The handler
 * finds the context in `request.idempotency`.
 *
 * ```ts
 * await app.register(fastifyIdempotency, { gateway, subject: (req) => req.user });
 * app.post("/v1/payments", { config: { idempotency: { operation: "payments.create", apiRevision: 1 } } }, async (req, reply) => {
 *   reply.code(201);
 *   return createPayment(req.body, req.idempotency!);
 * });
 * ```
 */
// eslint-disable-next-line @typescript-eslint/require-await -- Fastify waits for a plugin that takes no callback through the promise it returns
export async function fastifyIdempotency(fastify: FastifyInstance, options: FastifyIdempotencyOptions): Promise<void> {
  checkOptions({ name: "fastifyIdempotency", takes: "options { gateway, subject(request) } (app.register(fastifyIdempotency, { gateway, subject }))" }, options, {
    gateway: idempotencyGateway,
    subject: func,
  });
  const { gateway, subject } = options;

  // Keep the exact body bytes for the fingerprint, whatever content-type parser runs after.
  const preParsing = async (request: FastifyRequest, _reply: FastifyReply, payload: Readable & { receivedEncodedLength?: number }) => {
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of payload) {
      const buffer = typeof chunk === "string" ? Buffer.from(chunk) : (chunk as Buffer);
      size += buffer.byteLength;
      if (size > gateway.maxBodyBytes) {
        throw Object.assign(new Error(`the request body exceeds ${gateway.maxBodyBytes} bytes`), { statusCode: 413 });
      }
      chunks.push(buffer);
    }
    const raw = Buffer.concat(chunks);
    stateOf(request).rawBody = raw;
    const replay = Readable.from(raw.byteLength > 0 ? [raw] : []) as Readable & { receivedEncodedLength?: number };
    replay.receivedEncodedLength = raw.byteLength;
    return replay;
  };

  const preHandler = async (request: FastifyRequest, reply: FastifyReply) => {
    const route = request.routeOptions.config.idempotency!;
    const state = stateOf(request);
    let who;
    try {
      who = await subject(request);
    } catch (error) {
      gateway.logger.warn({ error: (error as Error).message }, "the subject resolver failed");
    }
    const admission = await gateway.admit(route, who, gatewayRequest(request, state.rawBody ?? Buffer.alloc(0)));
    if (!admission.run) {
      state.answered = true;
      return send(reply, admission.response);
    }
    request.idempotency = admission.context;
    return undefined;
  };

  const onError = async (request: FastifyRequest, _reply: FastifyReply, error: Error & { statusCode?: number }) => {
    // An error with a 4xx status is the business refusing the request (a
    // validation error, `httpErrors.badRequest()`): its serialized response is
    // recorded like any other. Anything else is the handler failing.
    const status = error.statusCode;
    if (status === undefined || status >= 500 || status < 400) stateOf(request).thrown = { error };
  };

  const onSend = async (request: FastifyRequest, reply: FastifyReply, payload: unknown) => {
    const state = stateOf(request);
    const context = request.idempotency;
    if (state.answered || !context || state.finished) return payload;
    state.finished = true;
    let result: HandlerResult;
    if (state.thrown) {
      result = state.thrown;
    } else if (payload === null || payload === undefined || typeof payload === "string" || Buffer.isBuffer(payload)) {
      const body = typeof payload === "string" ? Buffer.from(payload) : (payload ?? Buffer.alloc(0));
      result = { response: { status: reply.statusCode, headers: headerPairs(reply.getHeaders()), body } };
    } else {
      // A stream, or anything else unserialized: after onSend, Fastify itself sends nothing but strings, buffers and streams.
      result = { error: new Error("a streamed response cannot be recorded for replay; send a string or buffer") };
    }
    const response = await gateway.finish(context, result);
    if ("response" in result && response === result.response) return payload;
    replaceHeaders(reply, response);
    return Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength);
  };

  // A response that never reached onSend (client gone, hook failure): stop renewing the lease.
  // eslint-disable-next-line @typescript-eslint/require-await -- a Fastify hook without a `done` callback must return a promise; this one serves two hooks of different arity
  const onDone = async (request: FastifyRequest) => {
    if (!stateOf(request).finished) request.idempotency?.stopLease();
  };

  fastify.addHook("onRoute", (routeOptions: RouteOptions) => {
    if (!routeOptions.config?.idempotency) return;
    checkRoute(
      {
        name: `config.idempotency of ${routeOptions.method.toString()} ${routeOptions.url}`,
        takes: "{ operation, apiRevision, leaseMs?, statusUrl?, waitForOwnerMs?, effects?, missingKey? }",
      },
      routeOptions.config.idempotency,
    );
    const add = (name: "preParsing" | "preHandler" | "onSend" | "onError" | "onResponse" | "onRequestAbort", hook: unknown, first = false) => {
      const existing = (routeOptions as unknown as Record<string, unknown>)[name];
      const list: unknown[] = existing === undefined ? [] : Array.isArray(existing) ? (existing as unknown[]) : [existing];
      (routeOptions as unknown as Record<string, unknown>)[name] = first ? [hook, ...list] : [...list, hook];
    };
    add("preParsing", preParsing, true);
    // Last: the route's own preHandlers (authentication) run first.
    add("preHandler", preHandler);
    add("onError", onError, true);
    // First: the response is recorded as the handler made it.
    add("onSend", onSend, true);
    add("onResponse", onDone);
    add("onRequestAbort", onDone);
  });
}

// Like fastify-plugin: the onRoute hook applies to routes declared anywhere after registration.
Object.assign(fastifyIdempotency, {
  [Symbol.for("skip-override")]: true,
  [Symbol.for("fastify.display-name")]: "idempotency-gateway",
});

function gatewayRequest(request: FastifyRequest, body: Buffer): GatewayRequest {
  const url = request.url;
  const q = url.indexOf("?");
  return {
    method: request.method,
    path: q < 0 ? url : url.slice(0, q),
    query: q < 0 ? "" : url.slice(q + 1),
    headers: request.headers,
    body,
  };
}

function send(reply: FastifyReply, response: HttpResponse): FastifyReply {
  replaceHeaders(reply, response);
  return reply.send(Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength));
}

function replaceHeaders(reply: FastifyReply, response: HttpResponse): void {
  for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
  const grouped = new Map<string, string[]>();
  for (const [name, value] of response.headers) grouped.set(name, [...(grouped.get(name) ?? []), value]);
  grouped.delete("content-length");
  for (const [name, values] of grouped) reply.header(name, values.length === 1 ? values[0]! : values);
  reply.code(response.status);
}
