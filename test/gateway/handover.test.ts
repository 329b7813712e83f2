import { randomUUID } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CoordinatorClient, IdempotencyGateway } from "../../src/gateway/index.js";
import { withIdempotency, type NodeIdempotentHandler } from "../../src/gateway/node.js";
import { RecoveryWorker, type RecoveryEvent } from "../../src/gateway/recovery.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";
import { EventLog, post } from "./helpers.js";

/**
 * An owner whose handler failed after an effect may have happened knows the
 * record must go to recovery: it hands it over at once instead of letting
 * its lease (30 s by default) run out first.
 */
const t = useTestDatabase();
const coordinator = useTestServer(t, { operations: [testDocument({ lease: { default: "30s", max: "5m" } })] });
let gatewayClient: CoordinatorClient;
let workerClient: CoordinatorClient;
let worker: RecoveryWorker;
let http: Server;
let base: string;
const recoveries = new EventLog<RecoveryEvent>();
/** Per key: what the business handler does after charging. */
const afterCharge = new Map<string, "throw" | "indeterminate">();

beforeAll(async () => {
  gatewayClient = coordinator.sdkClient();
  workerClient = coordinator.sdkClient({ token: coordinator.tokens.worker });
  const handler: NodeIdempotentHandler = async (_req, _res, ctx) => {
    const behaviour = afterCharge.get(ctx.idempotencyKey);
    await ctx.effect("card.charge", "cards", async () => {
      // The provider timed out: nobody knows whether the card was charged.
      if (behaviour === "indeterminate") throw new Error("provider timed out");
      return { id: "ch_1" };
    });
    throw new Error("the process failed after charging");
  };
  const gateway = new IdempotencyGateway({ client: gatewayClient });
  const route = withIdempotency(gateway, { operation: "payments.create", apiRevision: 1, subject: () => ({ tenant: "acme", principal: "alice" }) }, handler);
  http = createServer((req, res) => void route(req, res));
  await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
  worker = new RecoveryWorker({
    client: workerClient,
    pollIntervalMs: 200,
    onProgress: recoveries.push,
    resolvers: {
      "payments.create": async (ctx) => {
        // Asked the provider by the original key: the charge went through.
        const attempt = ctx.latestAttempt("card.charge")!;
        if (attempt.status !== "CONFIRMED") await ctx.resolve({ attemptNumber: attempt.attemptNumber, status: "CONFIRMED", providerHandle: "ch_1" });
        await ctx.completeWith({ status: 201, json: { id: "ch_1" } });
      },
    },
  });
  worker.start();
});

afterAll(async () => {
  await worker?.stop();
  http?.closeAllConnections();
  await new Promise((resolve) => http?.close(resolve));
});

describe.each(["throw", "indeterminate"] as const)("a handler that fails after its effect (%s)", (behaviour) => {
  it("hands the record to recovery at once: settled long before its 30 s lease would have ended", async () => {
    const key = randomUUID();
    afterCharge.set(key, behaviour);
    const failed = await post(`${base}/v1/payments`, key, { amount: 10 });
    const failedAt = Date.now();
    expect(failed.status).toBe(500);
    expect(failed.json?.type).toMatch(/outcome-pending$/);
    const operationId = failed.json!.operationId!;

    // The record is UNKNOWN at once, by the owner's hand, still at generation 1.
    const { rows: handed } = await t.pool.query("SELECT kind, caller, generation::int FROM idem_event WHERE operation_id = $1 AND kind = 'UNKNOWN'", [operationId]);
    expect(handed).toEqual([{ kind: "UNKNOWN", caller: "payments-gateway", generation: 1 }]);

    await recoveries.first((e) => e.kind === "completed" && e.operationId === operationId, "the recovery worker to settle the record", 10_000);
    const settledMs = Date.now() - failedAt;
    const { rows } = await t.pool.query(
      `SELECT r.state, (SELECT max(at) FROM idem_event e WHERE e.operation_id = r.operation_id AND e.kind = 'COMPLETED')
                        < (SELECT min(at) FROM idem_event e WHERE e.operation_id = r.operation_id AND e.kind = 'ACCEPTED') + interval '30 seconds' AS before_lease_end
         FROM idem_record r WHERE operation_id = $1`,
      [operationId],
    );
    expect(rows[0]).toEqual({ state: "SUCCEEDED", before_lease_end: true });
    console.info(`hand-over (${behaviour}): settled by the recovery worker ${settledMs} ms after the failed response`);

    // The retry replays the settled outcome; nothing runs again.
    const retry = await post(`${base}/v1/payments`, key, { amount: 10 });
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
  });
});
