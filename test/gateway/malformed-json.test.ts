import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CoordinatorClient, CoordinatorError, IdempotencyGateway, silentLogger } from "../../src/gateway/index.js";
import { withIdempotency, writeResponse, type NodeIdempotentHandler } from "../../src/gateway/node.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";
import { post, problemFields, type Exchange } from "./helpers.js";

/**
 * A request body that is not JSON, read with `ctx.json()`: the client's
 * mistake, answered 400 `malformed-json`, never a retryable 503. The
 * operation fingerprints raw bytes, so the coordinator itself accepts any body.
 */

const t = useTestDatabase();
const coordinator = useTestServer(t, { operations: [testDocument({ operation: "payments.create" })] });
let client: CoordinatorClient;
let http: Server;
let base: string;
/** Times the handler was entered, and times it got past `ctx.json()`. */
let entered = 0;
let parsed = 0;

const alice = { tenant: "acme", principal: "alice" };
const handler: NodeIdempotentHandler = (_req, res, ctx) => {
  entered++;
  const order = ctx.json<{ amount: number }>();
  parsed++;
  writeResponse(res, { status: 201, json: { amount: order.amount } });
};

beforeAll(async () => {
  client = coordinator.sdkClient();
  const gateway = new IdempotencyGateway({ client, logger: silentLogger });
  const route = { operation: "payments.create", apiRevision: 1, subject: () => alice };
  const routes = new Map<string, (req: IncomingMessage, res: ServerResponse) => Promise<void>>([
    ["/orders", withIdempotency(gateway, route, handler)],
    ["/orders-without-key", withIdempotency(gateway, { ...route, missingKey: "run" }, handler)],
  ]);
  http = createServer((req, res) => void routes.get(req.url ?? "")?.(req, res));
  await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
});

afterAll(async () => {
  http?.closeAllConnections();
  await new Promise((resolve) => http?.close(resolve));
});

const recordOf = (key: string) => client.lookup({ scope: { subject: alice, operation: "payments.create", apiRevision: 1, idempotencyKey: key } });

function expectMalformedJson(answer: Exchange, jsonPath: string, detail: RegExp): void {
  expect(answer.status).toBe(400);
  expect(answer.headers.get("content-type")).toBe("application/problem+json");
  expect(Object.keys(answer.json ?? {})).toEqual(expect.arrayContaining([...problemFields]));
  expect(answer.json).toMatchObject({ type: "urn:problem-type:idempotency:malformed-json", title: "The request body is not valid JSON", status: 400, jsonPath });
  expect(answer.json?.detail).toMatch(detail);
}

describe("a body that is not valid JSON", () => {
  it("declared as JSON: 400 before anything is reserved, the same again for the same request, and the corrected one runs under the same key", async () => {
    const key = randomUUID();
    const before = { entered, parsed };

    const first = await post(`${base}/orders`, key, '{"amount": 10, "currency": }');
    expectMalformedJson(first, "$.currency", /JSON body at \$\.currency: unexpected "}" at byte 27/);
    expect(first.json?.detail).toMatch(/nothing was recorded/);
    expect(entered, "the handler not to run").toBe(before.entered);
    await expect(recordOf(key)).rejects.toSatisfy((error: unknown) => error instanceof CoordinatorError && error.reason === "NOT_FOUND");

    const again = await post(`${base}/orders`, key, '{"amount": 10, "currency": }');
    expect(again.status).toBe(400);
    expect(again.text).toBe(first.text);

    const corrected = await post(`${base}/orders`, key, { amount: 10 });
    expect(corrected.status).toBe(201);
    expect(corrected.json).toEqual({ amount: 10 });
    expect((await recordOf(key)).state).toBe("SUCCEEDED");
    expect(parsed - before.parsed, "the corrected request to run once").toBe(1);
  });

  it("not declared as JSON, refused by ctx.json(): 400, recorded REJECTED, and replayed to the same request without running it", async () => {
    const key = randomUUID();
    const textPlain = { "content-type": "text/plain" };
    const before = entered;

    const first = await post(`${base}/orders`, key, "amount=10", textPlain);
    expectMalformedJson(first, "$", /JSON body at \$: unexpected "a" at byte 0/);
    expect(first.json?.detail).toMatch(/with a new key/);
    expect(entered - before).toBe(1);
    expect((await recordOf(key)).state).toBe("REJECTED");

    const again = await post(`${base}/orders`, key, "amount=10", textPlain);
    expect(again.status).toBe(400);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.text).toBe(first.text);
    expect(entered - before, "the replay not to run the handler").toBe(1);
  });

  it("on a route that runs requests without a key, refused by ctx.json(): 400, and nothing recorded", async () => {
    const answer = await post(`${base}/orders-without-key`, undefined, "amount=10", { "content-type": "text/plain" });
    expectMalformedJson(answer, "$", /unexpected "a" at byte 0/);
  });
});
