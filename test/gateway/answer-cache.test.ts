import { randomUUID } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { MeterProvider, MetricReader, type DataPoint } from "@opentelemetry/sdk-metrics";
import express from "express";
import Fastify, { type FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expressIdempotency } from "../../src/gateway/express.js";
import { fastifyIdempotency } from "../../src/gateway/fastify.js";
import { CoordinatorClient, IdempotencyGateway, toHttpResponse, type IdempotentRoute, type Subject } from "../../src/gateway/index.js";
import { withIdempotency, writeResponse } from "../../src/gateway/node.js";
import { AdminService } from "../../src/gen/idempotency/v1/admin_pb.js";
import type { BatchRequest } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { useTestDatabase } from "../support/database.js";
import { ManualClock } from "../support/clock.js";
import { testDocument } from "../support/fixtures.js";
import { startTestServer, type TestServer } from "../support/server.js";

/**
 * The gateway's answer cache against a real coordinator over the wire: an
 * exact repeat of a finished request is answered by the gateway itself, the
 * same bytes as the coordinator's replay, through every adapter; anything
 * else is asked, and the coordinator decides (REPLAY, 422, a new record).
 * Entries end with the time the coordinator gave (its max-age, the record's
 * retention), on a clock the test moves; the cache keeps to its bytes.
 */

const t = useTestDatabase();
const MAX_AGE_MS = 20_000;
let coordinator: TestServer;
let client: CoordinatorClient;
const clock = new ManualClock();
let gateway: IdempotencyGateway;
/** Reserve calls the gateways' client sent, unary or carried in a Batch. */
let reserves = 0;
/** Times a business handler ran. */
let runs = 0;
const closers: Array<() => Promise<void> | void> = [];

const countReserves: Interceptor = (next) => (req) => {
  if (req.method.name === "Reserve") reserves++;
  if (req.method.name === "Batch" && !req.stream) reserves += (req.message as BatchRequest).calls.filter((c) => c.call.case === "reserve").length;
  return next(req);
};

const ROUTE: IdempotentRoute = { operation: "payments.create", apiRevision: 1 };
/** The service's own authentication: tenant and user from headers the tests set. */
const subjectOf = (headers: Record<string, string | string[] | undefined>): Subject | undefined =>
  typeof headers["x-user"] === "string" ? { tenant: typeof headers["x-tenant"] === "string" ? headers["x-tenant"] : "acme", principal: headers["x-user"] } : undefined;
/** What every handler answers: a new payment, with a header never stored and one that is. */
const created = (operationId: string, amount: unknown) =>
  toHttpResponse({
    status: 201,
    headers: { location: `/v1/payments/${operationId}`, "x-request-id": randomUUID(), "content-language": "en" },
    json: { id: `pay_${operationId}`, amount, run: ++runs },
  });

/** Base URLs of the same gateway behind each adapter, and of its core called directly. */
const bases: Record<string, string> = {};

async function listen(server: Server): Promise<string> {
  server.listen(0, "127.0.0.1");
  await new Promise((resolve) => server.once("listening", resolve));
  closers.push(() => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/** The gateway's core alone (`execute`), behind a bare node:http server that reads the body and writes what it returns. */
function coreServer(gw: IdempotencyGateway): Server {
  return createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const url = req.url ?? "/";
      const q = url.indexOf("?");
      const body = Buffer.concat(chunks);
      void gw
        .execute(
          ROUTE,
          subjectOf(req.headers),
          { method: req.method!, path: q < 0 ? url : url.slice(0, q), query: q < 0 ? "" : url.slice(q + 1), headers: req.headers, body },
          (ctx) => Promise.resolve(created(ctx.operationId, ctx.json<{ amount: unknown }>().amount)),
        )
        .then((response) => {
          res.statusCode = response.status;
          for (const [name, value] of response.headers) res.appendHeader(name, value);
          res.end(response.body);
        });
    });
  });
}

beforeAll(async () => {
  coordinator = await startTestServer(t, { operations: [testDocument()], config: { answerCacheMaxAgeMs: MAX_AGE_MS } });
  // The worker token is granted every tenant: acme's and globex's users go through the one gateway.
  client = new CoordinatorClient({ baseUrl: coordinator.baseUrl, token: coordinator.tokens.worker, interceptors: [countReserves] });
  gateway = new IdempotencyGateway({ client, clock });

  const nodeHandler = withIdempotency(gateway, { ...ROUTE, subject: (req) => subjectOf(req.headers) }, (_req, res, ctx) => {
    const response = created(ctx.operationId, ctx.json<{ amount: unknown }>().amount);
    writeResponse(res, { status: response.status, headers: Object.fromEntries(response.headers), body: response.body });
  });
  bases.node = await listen(createServer((req, res) => void nodeHandler(req, res)));
  const app = express();
  app.post(
    "/v1/payments",
    expressIdempotency(gateway, { ...ROUTE, subject: (req) => subjectOf(req.headers) }, (req, res, ctx) => {
      const response = created(ctx.operationId, (req.body as { amount: unknown }).amount);
      res.status(response.status).set(Object.fromEntries(response.headers)).send(Buffer.from(response.body));
    }),
  );
  bases.express = await listen(createServer(app));
  const fastify: FastifyInstance = Fastify();
  await fastify.register(fastifyIdempotency, { gateway, subject: (request) => subjectOf(request.headers) });
  fastify.post("/v1/payments", { config: { idempotency: ROUTE } }, async (request, reply) => {
    const response = created(request.idempotency!.operationId, (request.body as { amount: unknown }).amount);
    return reply.code(response.status).headers(Object.fromEntries(response.headers)).send(Buffer.from(response.body));
  });
  bases.fastify = await fastify.listen({ port: 0, host: "127.0.0.1" });
  closers.push(() => fastify.close());
  bases.core = await listen(coreServer(gateway));
});

afterAll(async () => {
  for (const close of closers.reverse()) await close();
  client?.close();
  await coordinator?.stop();
});

/** One exchange as a client sees it, less what each delivery has of its own (Date, Connection, Keep-Alive). */
interface Answer {
  status: number;
  headers: Array<[string, string]>;
  body: string;
}

async function send(base: string, key: string, body: unknown, headers: Record<string, string> = {}, path = "/v1/payments"): Promise<Answer> {
  const response = await fetch(`${base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": key, "x-user": "alice", ...headers },
    body: JSON.stringify(body),
  });
  const perDelivery = new Set(["date", "connection", "keep-alive", "transfer-encoding"]);
  return { status: response.status, headers: [...response.headers].filter(([name]) => !perDelivery.has(name)), body: await response.text() };
}

const replayed = (answer: Answer) => answer.headers.find(([name]) => name === "idempotent-replayed")?.[1];

/** What `work` cost: Reserve calls sent and handler runs. */
async function cost<T>(work: () => Promise<T>): Promise<{ result: T; reserves: number; runs: number }> {
  const before = { reserves, runs };
  const result = await work();
  return { result, reserves: reserves - before.reserves, runs: runs - before.runs };
}

/** A finished request of a new key, replayed once by the coordinator (which makes it cacheable): its key and that replay. */
async function finishedAndReplayed(base = bases.core!, headers: Record<string, string> = {}): Promise<{ key: string; replay: Answer }> {
  const key = randomUUID();
  expect((await send(base, key, { amount: 10 }, headers)).status).toBe(201);
  const replay = await cost(() => send(base, key, { amount: 10 }, headers));
  expect(replay).toMatchObject({ reserves: 1, runs: 0 });
  expect(replayed(replay.result)).toBe("true");
  return { key, replay: replay.result };
}

describe("the gateway's answer cache", () => {
  it.each(["node", "express", "fastify", "core"])("answers an exact repeat itself through %s, byte for byte the coordinator's replay", async (adapter) => {
    const base = bases[adapter]!;
    const { key, replay } = await finishedAndReplayed(base);
    const again = await cost(() => send(base, key, { amount: 10 }));
    expect(again).toMatchObject({ reserves: 0, runs: 0 });
    expect(again.result).toEqual(replay);
    expect(replay.headers.map(([name]) => name)).toEqual(expect.arrayContaining(["content-type", "location", "content-language", "idempotent-replayed"]));
  });

  it("sends a changed payload under a cached key to the coordinator, which answers 422", async () => {
    const { key } = await finishedAndReplayed();
    const changed = await cost(() => send(bases.core!, key, { amount: 11 }));
    expect(changed).toMatchObject({ reserves: 1, runs: 0 });
    expect(changed.result.status).toBe(422);
    expect(JSON.parse(changed.result.body)).toMatchObject({ type: "urn:problem-type:idempotency:payload-conflict" });
    // The exact repeat is still answered from memory.
    expect(await cost(() => send(bases.core!, key, { amount: 10 }))).toMatchObject({ reserves: 0, result: { status: 201 } });
  });

  it("asks the coordinator for any other difference: a header, the query, the media type, the body's bytes", async () => {
    const { key } = await finishedAndReplayed();
    const variants: Array<[string, () => Promise<Answer>, number]> = [
      // Headers and query parameters the policy does not select: the coordinator replays.
      ["another header", () => send(bases.core!, key, { amount: 10 }, { "x-client-note": "retry" }), 201],
      ["a query", () => send(bases.core!, key, { amount: 10 }, {}, "/v1/payments?via=retry"), 201],
      // The same JSON value in other bytes: this policy fingerprints the bytes.
      ["other whitespace", () => fetchRaw(key, '{ "amount": 10 }', "application/json"), 422],
      // Another media type is another fingerprint.
      ["another media type", () => fetchRaw(key, '{"amount":10}', "application/vnd.payment+json"), 422],
    ];
    for (const [name, variant, status] of variants) {
      const asked = await cost(variant);
      expect(asked.reserves, name).toBe(1);
      expect(asked.result.status, name).toBe(status);
    }
  });

  it("never lets two principals or two tenants share an entry", async () => {
    const { key } = await finishedAndReplayed();
    for (const other of [{ "x-user": "bob" }, { "x-tenant": "globex" }] as Array<Record<string, string>>) {
      const asked = await cost(() => send(bases.core!, key, { amount: 10 }, other));
      // Another scope: a record of its own, and the handler runs for it.
      expect(asked).toMatchObject({ reserves: 1, runs: 1 });
      expect(replayed(asked.result)).toBeUndefined();
    }
    expect(await cost(() => send(bases.core!, key, { amount: 10 }))).toMatchObject({ reserves: 0, runs: 0 });
  });

  it("asks again once the coordinator's time is up, and keeps the new answer", async () => {
    const { key } = await finishedAndReplayed();
    clock.advance(MAX_AGE_MS - 1);
    expect(await cost(() => send(bases.core!, key, { amount: 10 }))).toMatchObject({ reserves: 0 });
    clock.advance(1);
    expect(await cost(() => send(bases.core!, key, { amount: 10 }))).toMatchObject({ reserves: 1, runs: 0, result: { status: 201 } });
    expect(await cost(() => send(bases.core!, key, { amount: 10 }))).toMatchObject({ reserves: 0 });
  });

  it("never serves an answer past its record's retention", async () => {
    const key = randomUUID();
    const first = await send(bases.core!, key, { amount: 10 });
    const operationId = (JSON.parse(first.body) as { id: string }).id.slice("pay_".length);
    await t.pool.query("UPDATE idem_record SET retain_until = now() + interval '5 seconds' WHERE operation_id = $1", [operationId]);
    expect(await cost(() => send(bases.core!, key, { amount: 10 }))).toMatchObject({ reserves: 1 });
    clock.advance(1000);
    expect(await cost(() => send(bases.core!, key, { amount: 10 }))).toMatchObject({ reserves: 0 });
    // Five seconds after it was fetched the retention has ended: asked, though the max-age has not passed.
    clock.advance(4000);
    await t.pool.query("UPDATE idem_record SET retain_until = now() - interval '1 second' WHERE operation_id = $1", [operationId]);
    const overdue = await cost(() => send(bases.core!, key, { amount: 10 }));
    expect(overdue).toMatchObject({ reserves: 1, result: { status: 201 } });
    // Replayed but not cacheable past the retention: asked every time, until the sweep makes it 410.
    expect(await cost(() => send(bases.core!, key, { amount: 10 }))).toMatchObject({ reserves: 1, result: { status: 201 } });
    const admin = createClient(AdminService, createGrpcTransport({ baseUrl: coordinator.baseUrl }));
    await admin.runRetentionSweep({}, { headers: { authorization: `Bearer ${coordinator.tokens.allTenantsOperator}` } });
    expect(await cost(() => send(bases.core!, key, { amount: 10 }))).toMatchObject({ reserves: 1, result: { status: 410 } });
  });

  it("with answerCache: false, asks the coordinator for every replay", async () => {
    const uncached = new IdempotencyGateway({ client, answerCache: false });
    expect(uncached.answerCacheStats()).toBeUndefined();
    const base = await listen(coreServer(uncached));
    const { key } = await finishedAndReplayed(base);
    const five = await cost(async () => {
      for (let i = 0; i < 5; i++) expect(replayed(await send(base, key, { amount: 10 }))).toBe("true");
    });
    expect(five).toMatchObject({ reserves: 5, runs: 0 });
  });

  it("keeps to its bytes, evicting the least recently answered entry first", async () => {
    // One entry's size, as the cache counts it (every entry of this test has the same).
    const probe = new IdempotencyGateway({ client, clock });
    await finishedAndReplayed(await listen(coreServer(probe)), { "x-user": "carol" });
    const entryBytes = probe.answerCacheStats()!.bytes;
    expect(entryBytes).toBeGreaterThan(0);

    const small = new IdempotencyGateway({ client, clock, answerCache: { maxBytes: Math.floor(entryBytes * 2.5) } });
    const base = await listen(coreServer(small));
    const carol = { "x-user": "carol" };
    const one = await finishedAndReplayed(base, carol);
    const two = await finishedAndReplayed(base, carol);
    expect(await cost(() => send(base, one.key, { amount: 10 }, carol))).toMatchObject({ reserves: 0 });
    // A third entry: two was answered least recently, and goes.
    const three = await finishedAndReplayed(base, carol);
    expect(small.answerCacheStats()).toMatchObject({ entries: 2, evictions: 1, bytes: 2 * entryBytes });
    expect(await cost(() => send(base, one.key, { amount: 10 }, carol))).toMatchObject({ reserves: 0 });
    expect(await cost(() => send(base, three.key, { amount: 10 }, carol))).toMatchObject({ reserves: 0 });
    expect(await cost(() => send(base, two.key, { amount: 10 }, carol))).toMatchObject({ reserves: 1, result: { status: 201 } });
    expect(small.answerCacheStats()).toMatchObject({ entries: 2, evictions: 2 });
  });

  it("counts hits, misses, evictions, entries and bytes, and reports them through OpenTelemetry", async () => {
    const reader = new (class extends MetricReader {
      protected onShutdown = () => Promise.resolve();
      protected onForceFlush = () => Promise.resolve();
    })();
    const counted = new IdempotencyGateway({ client, clock, answerCache: { meterProvider: new MeterProvider({ readers: [reader] }) } });
    const base = await listen(coreServer(counted));
    expect(counted.answerCacheStats()).toEqual({ hits: 0, misses: 0, evictions: 0, entries: 0, bytes: 0, maxBytes: 16 * 1024 * 1024 });
    // A new key (a miss: nothing cached), its coordinator replay (a miss, then cached), two exact repeats (hits).
    const { key } = await finishedAndReplayed(base);
    await send(base, key, { amount: 10 });
    await send(base, key, { amount: 10 });
    const stats = counted.answerCacheStats()!;
    expect(stats).toMatchObject({ hits: 2, misses: 2, evictions: 0, entries: 1 });
    expect(stats.bytes).toBeGreaterThan(0);

    const { resourceMetrics } = await reader.collect();
    const values = Object.fromEntries(
      resourceMetrics.scopeMetrics.flatMap((scope) => scope.metrics).map((metric) => [metric.descriptor.name, (metric.dataPoints[0] as DataPoint<number>).value]),
    );
    expect(values).toEqual({
      "idempotency_gateway.answer_cache.hits": 2,
      "idempotency_gateway.answer_cache.misses": 2,
      "idempotency_gateway.answer_cache.evictions": 0,
      "idempotency_gateway.answer_cache.entries": 1,
      "idempotency_gateway.answer_cache.bytes": stats.bytes,
    });
  });
});

/** A POST with this exact body text and media type, through the core. */
async function fetchRaw(key: string, body: string, mediaType: string): Promise<Answer> {
  const response = await fetch(`${bases.core!}/v1/payments`, { method: "POST", headers: { "content-type": mediaType, "idempotency-key": key, "x-user": "alice" }, body });
  return { status: response.status, headers: [...response.headers], body: await response.text() };
}
