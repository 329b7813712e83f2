import { randomUUID } from "node:crypto";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startPaymentsApp, type PaymentsApp } from "../../examples/payments/app.js";
import { paymentsPolicy } from "../../examples/payments/policy.js";
import { AdminService } from "../../src/gen/idempotency/v1/admin_pb.js";
import { policyToProto } from "../../src/server/policy-convert.js";
import { useTestDatabase } from "../support/database.js";
import { useTestServer } from "../support/server.js";
import { post } from "../gateway/helpers.js";

// Requests that look like retries but are not, and retries that look different
// but are: each answered correctly through the example service.

const t = useTestDatabase();
let app: PaymentsApp;
const ALICE = { authorization: "Bearer alice-token-7f3a9c2e" };
const BOB = { authorization: "Bearer bob-token-51d0b6aa" };
const url = () => `${app.service.url}/v1/payments`;
// Short retention, no declared window longer: tombstones can be made within a test.
const windows = { keep: "1s", clientRetryWindow: "0s", queueBacklogWindow: "0s", reconciliationWindow: "0s", backupRestoreWindow: "0s" };
const server = useTestServer(t, { operations: [paymentsPolicy({ retention: windows })] });

beforeAll(async () => {
  // Co-located (the default): the service seals with the coordinator's key ring.
  app = await startPaymentsApp({
    coordinatorUrl: server.baseUrl,
    gatewayToken: server.tokens.gateway,
    workerToken: server.tokens.worker,
    pool: t.openPool(),
    ...(server.snapshotKeys ? { snapshotKeys: server.snapshotKeys } : {}),
  });
});
afterAll(async () => {
  await app?.close();
});

const charges = () => app.provider.charges().length;

describe("requests at the edges of the contract", () => {
  it("replays a retry whose JSON members come in another order, with other whitespace", async () => {
    const key = randomUUID();
    const first = await post(url(), key, '{"amount":700,"currency":"EUR","card":"tok_visa"}', ALICE);
    const reordered = await post(url(), key, ' {\n  "card" : "tok_visa",\n  "currency" : "EUR",\n  "amount" : 700\n} ', ALICE);
    expect(first.status).toBe(201);
    expect(reordered).toMatchObject({ status: 201, text: first.text });
    expect(reordered.headers.get("idempotent-replayed")).toBe("true");
  });

  it("refuses duplicate members, even equal ones, before anything is stored or charged", async () => {
    const before = charges();
    const records = (await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record")).rows[0]!.n;
    for (const body of ['{"amount":700,"amount":70000,"currency":"EUR","card":"tok_visa"}', '{"amount":700,"\\u0061mount":700,"currency":"EUR","card":"tok_visa"}']) {
      const refused = await post(url(), randomUUID(), body, ALICE);
      expect(refused.status).toBe(400);
      expect(refused.headers.get("content-type")).toBe("application/problem+json");
    }
    expect(charges()).toBe(before);
    const after = (await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record")).rows[0]!.n;
    expect(after).toBe(records);
  });

  it("never lets another principal's request hit a record, even with the same key", async () => {
    const key = randomUUID();
    const alice = await post(url(), key, { amount: 800, currency: "EUR", card: "tok_visa" }, ALICE);
    const bob = await post(url(), key, { amount: 900, currency: "EUR", card: "tok_mc" }, BOB);
    expect([alice.status, bob.status]).toEqual([201, 201]);
    expect((bob.json as { operationId: string }).operationId).not.toBe((alice.json as { operationId: string }).operationId);
    expect(await post(url(), key, { amount: 800, currency: "EUR", card: "tok_visa" }, ALICE)).toMatchObject({ status: 201, text: alice.text });
  });

  it("replays an old client's retry after a new schema revision is published", async () => {
    const key = randomUUID();
    const body = { amount: 650, currency: "EUR", card: "tok_visa", description: "lunch" };
    const first = await post(url(), key, body, ALICE);
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" }));
    // Revision 2 fingerprints the description too: the same body now fingerprints differently.
    const revision2 = paymentsPolicy({
      schemaRevision: 2,
      retention: windows,
      fingerprint: {
        mode: "json",
        schema: {
          type: "object",
          properties: {
            amount: { type: "integer", required: true },
            currency: { type: "string", required: true },
            card: { type: "string", required: true },
            description: { type: "string" },
          },
        },
      },
    });
    await admin.publishPolicy({ policy: policyToProto(revision2) }, { headers: { authorization: `Bearer ${server.tokens.allTenantsOperator}` } });
    const retry = await post(url(), key, body, ALICE);
    expect(retry).toMatchObject({ status: 201, text: first.text });
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
  });

  it("answers every racing retry of an expired record 410, and runs nothing again", async () => {
    const key = randomUUID();
    const body = { amount: 300, currency: "EUR", card: "tok_visa" };
    const first = await post(url(), key, body, ALICE);
    const operationId = (first.json as { operationId: string }).operationId;
    await t.pool.query("UPDATE idem_record SET retain_until = now() - interval '1 second' WHERE operation_id = $1", [operationId]);
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" }));
    const sweeping = admin.runRetentionSweep({}, { headers: { authorization: `Bearer ${server.tokens.allTenantsOperator}` } });
    const before = charges();
    const racing = await Promise.all(Array.from({ length: 20 }, () => post(url(), key, body, ALICE)));
    await sweeping;
    const after = await Promise.all(Array.from({ length: 5 }, () => post(url(), key, body, ALICE)));
    // Before the sweep: the stored response; after: gone. Never a second run.
    for (const answer of racing) expect([201, 410], answer.text).toContain(answer.status);
    for (const answer of after) expect(answer.status).toBe(410);
    expect(charges()).toBe(before);
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM payments WHERE operation_id = $1", [operationId]);
    expect(rows[0]?.n).toBe(1);
  });
});
