import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { AdminService, OperationMode } from "../../src/gen/idempotency/v1/admin_pb.js";
import { CoordinatorService, Decision } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { wireReason } from "../support/refusals.js";
import { useTestDatabase } from "../support/database.js";
import { newKey, testDocument } from "../support/fixtures.js";
import { startTestServer, type TestServer } from "../support/server.js";

/**
 * Three replicas on one registry: what one is told, every one applies within
 * IDEM_POLICY_REFRESH_MS, and the background jobs run on one at a time.
 */
const t = useTestDatabase();
const REFRESH_MS = 300;
const RECOVERER_MS = 100;
const operations = [testDocument(), testDocument({ operation: "payouts.create" })];

describe("three coordinator replicas on one registry", () => {
  const replicas: TestServer[] = [];
  const coordinator = (server: TestServer): Client<typeof CoordinatorService> =>
    createClient(CoordinatorService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" }));
  const headers = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });

  beforeAll(async () => {
    const config = { policyRefreshMs: REFRESH_MS, recovererIntervalMs: RECOVERER_MS };
    replicas.push(await startTestServer(t, { operations, config }));
    for (let i = 0; i < 2; i++) replicas.push(await startTestServer(t, { operations, config, replicaOf: replicas[0] }));
  });
  afterAll(async () => {
    await Promise.all(replicas.map((r) => r.stop()));
  });

  const reserveOn = (server: TestServer, operation: string) =>
    coordinator(server).reserve(
      {
        subject: { tenant: "acme", principal: "alice" },
        operation,
        apiRevision: 1,
        idempotencyKey: newKey(),
        request: { case: "parts", value: { method: "POST", path: "/v1/x", mediaType: "application/json", body: new TextEncoder().encode("{}") } },
      },
      headers(server.tokens.worker),
    );

  it("applies a mode set through one replica on every replica, within a few refresh intervals", async () => {
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: replicas[0]!.baseUrl, httpVersion: "2" }));
    for (const replica of replicas) expect((await reserveOn(replica, "payouts.create")).decision).toBe(Decision.ACCEPTED);
    await admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.DRAINING }, headers(replicas[0]!.tokens.allTenantsOperator));
    // Each replica re-reads at its own interval; the bound leaves room for a busy machine.
    for (const replica of replicas) {
      await vi.waitFor(async () => expect(await wireReason(reserveOn(replica, "payouts.create"))).toBe("OPERATION_DRAINING"), { timeout: 10 * REFRESH_MS, interval: 20 });
    }
    // The mode is the operation's: another operation is untouched on every replica.
    for (const replica of replicas) expect((await reserveOn(replica, "payments.create")).decision).toBe(Decision.ACCEPTED);
  });

  it("runs each background job on one replica at a time, and hands it over when that replica stops", async () => {
    const holders = async () => (await t.pool.query<{ job: string; holder: string }>("SELECT job, holder FROM idem_job_lease ORDER BY job")).rows;
    await vi.waitFor(async () => expect((await holders()).map((h) => h.job)).toContain("recoverer"), { timeout: 5_000 });
    const seen = new Set<string>();
    for (let i = 0; i < 10; i++) {
      const rows = await holders();
      // One row per job: one holder at a time.
      expect(new Set(rows.map((r) => r.job)).size).toBe(rows.length);
      seen.add(rows.find((r) => r.job === "recoverer")!.holder);
      await new Promise((resolve) => setTimeout(resolve, RECOVERER_MS));
    }
    expect(seen.size).toBe(1);
    const holder = [...seen][0]!;
    const holding = replicas.find((r) => r.coordinator.jobHolder === holder)!;
    await holding.stop();
    replicas.splice(replicas.indexOf(holding), 1);
    await vi.waitFor(
      async () => {
        const now = (await holders()).find((r) => r.job === "recoverer")?.holder;
        expect(now).toBeDefined();
        expect(now).not.toBe(holder);
      },
      { timeout: 5_000 },
    );
  });
});
