import { randomUUID } from "node:crypto";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import express from "express";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { captureRawBody, expressIdempotency, type ExpressRouteOptions } from "../../src/gateway/express.js";
import { CoordinatorClient, IdempotencyGateway } from "../../src/gateway/index.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";
import { post } from "./helpers.js";

const t = useTestDatabase();
const coordinator = useTestServer(t, { operations: [testDocument({ operation: "payments.create" })] });
let client: CoordinatorClient;
let server: Server;
let base: string;
let runs = 0;

beforeAll(async () => {
  client = coordinator.sdkClient();
  const gateway = new IdempotencyGateway({ client });
  const route: ExpressRouteOptions = {
    operation: "payments.create",
    apiRevision: 1,
    // The service's own authentication put the user on the request.
    subject: (req) => (req.get("x-user") ? { tenant: "acme", principal: req.get("x-user")! } : undefined),
  };
  const handler = expressIdempotency(gateway, route, (req, res, ctx) => {
    runs++;
    res
      .status(201)
      .set("x-request-id", randomUUID())
      .json({ id: `pay_${ctx.operationId}`, amount: (req.body as { amount: number }).amount, run: runs });
  });

  const app = express();
  // The middleware reads the body itself…
  app.post("/v1/payments", handler);
  // …or takes the raw bytes a body parser kept.
  app.post("/v2/payments", express.json({ verify: captureRawBody }), handler);
  server = app.listen(0, "127.0.0.1");
  await new Promise((resolve) => server.once("listening", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server?.closeAllConnections();
  await new Promise((resolve) => server?.close(resolve));
});

const ALICE = { "x-user": "alice" };

describe.each(["/v1/payments", "/v2/payments"])("Express 5 middleware on %s", (path) => {
  it("runs an ACCEPTED request once and replays it with Idempotent-Replayed: true", async () => {
    const key = randomUUID();
    const before = runs;
    const first = await post(`${base}${path}`, key, { amount: 10 }, ALICE);
    expect(first.status).toBe(201);
    expect(first.headers.get("idempotent-replayed")).toBeNull();
    expect(first.json).toMatchObject({ amount: 10 });

    const replay = await post(`${base}${path}`, key, { amount: 10 }, ALICE);
    expect(replay.status).toBe(201);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.text).toBe(first.text);
    expect(replay.headers.get("content-type")).toBe(first.headers.get("content-type"));
    expect(replay.headers.get("x-request-id")).toBeNull();
    expect(runs).toBe(before + 1);
  });

  it("answers a malformed JSON body 400 before anything is reserved, so the corrected request keeps its key", async () => {
    const key = randomUUID();
    const before = runs;
    const malformed = await post(`${base}${path}`, key, '{"amount": 10,', ALICE);
    expect(malformed.status).toBe(400);
    expect(runs).toBe(before);
    const corrected = await post(`${base}${path}`, key, { amount: 10 }, ALICE);
    expect(corrected.status).toBe(201);
    expect(runs).toBe(before + 1);
  });

  it("answers a different body under the same key with 422 problem+json", async () => {
    const key = randomUUID();
    expect((await post(`${base}${path}`, key, { amount: 10 }, ALICE)).status).toBe(201);
    const before = runs;
    const conflict = await post(`${base}${path}`, key, { amount: 11 }, ALICE);
    expect(conflict.status).toBe(422);
    expect(conflict.headers.get("content-type")).toBe("application/problem+json");
    expect(conflict.json).toMatchObject({ type: "urn:problem-type:idempotency:payload-conflict", status: 422 });
    expect(conflict.text).not.toContain("10");
    expect(runs).toBe(before);
  });

  it("answers a request without Idempotency-Key with 400 problem+json", async () => {
    const before = runs;
    const missing = await post(`${base}${path}`, undefined, { amount: 10 }, ALICE);
    expect(missing.status).toBe(400);
    expect(missing.headers.get("content-type")).toBe("application/problem+json");
    expect(missing.json).toMatchObject({ type: "urn:problem-type:idempotency:idempotency-key-missing", status: 400 });
    expect(runs).toBe(before);
  });
});
