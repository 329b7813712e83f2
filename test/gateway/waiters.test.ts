import { randomUUID } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CoordinatorClient, IdempotencyGateway, silentLogger } from "../../src/gateway/index.js";
import { withIdempotency, writeResponse } from "../../src/gateway/node.js";
import { useTestDatabase } from "../support/database.js";
import { useTestServer } from "../support/server.js";
import { post, within } from "./helpers.js";

/**
 * A coordinator refuses a Reserve that would wait for an owner once the
 * caller has as many waiting as it allows (TOO_MANY_WAITERS). The gateway
 * then answers the duplicate with the first Reserve's IN_PROGRESS (409 with
 * Retry-After), not with an error: the wait was only a courtesy.
 */
const t = useTestDatabase();
// No waiter allowed at all: every wait is refused.
const coordinator = useTestServer(t, { config: { waitersPerCaller: 0 } });
let client: CoordinatorClient;
let http: Server;
let base: string;
let release!: () => void;
let entered!: Promise<void>;

beforeAll(async () => {
  client = coordinator.sdkClient({ logger: silentLogger });
  const gateway = new IdempotencyGateway({ client, waitForOwnerMs: 20_000, logger: silentLogger });
  let enter!: () => void;
  entered = new Promise<void>((resolve) => (enter = resolve));
  const opened = new Promise<void>((resolve) => (release = resolve));
  const handler = withIdempotency(gateway, { operation: "payments.create", apiRevision: 1, subject: () => ({ tenant: "acme", principal: "alice" }) }, async (_req, res) => {
    enter();
    await opened;
    writeResponse(res, { status: 201, json: { ok: true } });
  });
  http = createServer((req, res) => void handler(req, res));
  await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(http.address() as AddressInfo).port}/v1/payments`;
});

afterAll(async () => {
  http?.closeAllConnections();
  await new Promise((resolve) => http?.close(resolve));
});

describe("a duplicate whose wait for the owner is refused", () => {
  it("is answered 409 with Retry-After, as without a wait, and the first request finishes", async () => {
    const key = randomUUID();
    const first = post(base, key, { amount: 10 });
    await within(entered, "the first request to run");
    const duplicate = await post(base, key, { amount: 10 });
    expect(duplicate.status).toBe(409);
    expect(Number(duplicate.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    release();
    expect((await first).status).toBe(201);
  });
});
