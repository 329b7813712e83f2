import { randomUUID } from "node:crypto";
import Fastify, { type FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fastifyIdempotency } from "../../src/gateway/fastify.js";
import { CoordinatorClient, IdempotencyGateway } from "../../src/gateway/index.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";
import { post } from "./helpers.js";

const t = useTestDatabase();
const coordinator = useTestServer(t, { operations: [testDocument({ operation: "payments.create" })] });
let client: CoordinatorClient;
let app: FastifyInstance;
let base: string;
let runs = 0;

beforeAll(async () => {
  client = coordinator.sdkClient();
  const gateway = new IdempotencyGateway({ client });
  app = Fastify();
  await app.register(fastifyIdempotency, {
    gateway,
    subject: (request) => (typeof request.headers["x-user"] === "string" ? { tenant: "acme", principal: request.headers["x-user"] } : undefined),
  });
  app.post("/v1/payments", { config: { idempotency: { operation: "payments.create", apiRevision: 1 } } }, async (request, reply) => {
    runs++;
    const ctx = request.idempotency!;
    const charge = await ctx.effect("card.charge", "cards", async (downstreamKey) => ({ id: `ch_${downstreamKey.slice(0, 8)}` }), { handle: (c) => c.id });
    reply.code(201).header("set-cookie", "session=abc").header("location", `/v1/payments/${ctx.operationId}`);
    return { amount: (request.body as { amount: number }).amount, charge: charge.id, run: runs };
  });
  app.post("/v1/broken", { config: { idempotency: { operation: "payments.create", apiRevision: 1 } } }, async () => {
    runs++;
    throw new Error("boom before any effect");
  });
  base = await app.listen({ port: 0, host: "127.0.0.1" });
});

afterAll(async () => {
  await app?.close();
});

const ALICE = { "x-user": "alice" };

describe("Fastify 5 plugin", () => {
  it("runs an ACCEPTED request once and replays it with Idempotent-Replayed: true", async () => {
    const key = randomUUID();
    const before = runs;
    const first = await post(`${base}/v1/payments`, key, { amount: 10 }, ALICE);
    expect(first.status).toBe(201);
    expect(first.headers.get("idempotent-replayed")).toBeNull();
    expect(first.headers.get("set-cookie")).toBe("session=abc");
    expect(first.json).toMatchObject({ amount: 10 });

    const replay = await post(`${base}/v1/payments`, key, { amount: 10 }, ALICE);
    expect(replay.status).toBe(201);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.text).toBe(first.text);
    expect(replay.headers.get("location")).toBe(first.headers.get("location"));
    expect(replay.headers.get("content-type")).toBe(first.headers.get("content-type"));
    expect(replay.headers.get("set-cookie")).toBeNull();
    expect(runs).toBe(before + 1);
    const record = await client.lookup({ scope: { subject: { tenant: "acme", principal: "alice" }, operation: "payments.create", apiRevision: 1, idempotencyKey: key } });
    expect(record.state).toBe("SUCCEEDED");
    expect(record.effectAttempts).toMatchObject([{ status: "CONFIRMED", providerHandle: first.json?.charge }]);
  });

  it("leaves a malformed JSON body to Fastify's own 400, before anything is reserved, so the corrected request keeps its key", async () => {
    const key = randomUUID();
    const before = runs;
    const malformed = await post(`${base}/v1/payments`, key, '{"amount": 10,', ALICE);
    expect(malformed.status).toBe(400);
    expect(runs).toBe(before);
    const corrected = await post(`${base}/v1/payments`, key, { amount: 10 }, ALICE);
    expect(corrected.status).toBe(201);
    expect(runs).toBe(before + 1);
  });

  it("answers a different body under the same key with 422 problem+json", async () => {
    const key = randomUUID();
    expect((await post(`${base}/v1/payments`, key, { amount: 10 }, ALICE)).status).toBe(201);
    const before = runs;
    const conflict = await post(`${base}/v1/payments`, key, { amount: 12 }, ALICE);
    expect(conflict.status).toBe(422);
    expect(conflict.headers.get("content-type")).toBe("application/problem+json");
    expect(conflict.json).toMatchObject({ type: "urn:problem-type:idempotency:payload-conflict", status: 422 });
    expect(runs).toBe(before);
  });

  it("answers a request without Idempotency-Key with 400 problem+json", async () => {
    const before = runs;
    const missing = await post(`${base}/v1/payments`, undefined, { amount: 10 }, ALICE);
    expect(missing.status).toBe(400);
    expect(missing.headers.get("content-type")).toBe("application/problem+json");
    expect(missing.json).toMatchObject({ type: "urn:problem-type:idempotency:idempotency-key-missing", status: 400 });
    expect(runs).toBe(before);
  });

  it("releases a request whose handler throws before any effect and answers 503", async () => {
    const key = randomUUID();
    const failed = await post(`${base}/v1/broken`, key, { amount: 10 }, ALICE);
    expect(failed.status).toBe(503);
    expect(failed.json).toMatchObject({ type: "urn:problem-type:idempotency:retryable-failure", status: 503 });
    const record = await client.lookup({ scope: { subject: { tenant: "acme", principal: "alice" }, operation: "payments.create", apiRevision: 1, idempotencyKey: key } });
    expect(record.state).toBe("RESERVED");
  });
});
