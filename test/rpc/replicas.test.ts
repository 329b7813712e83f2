import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AdminService, OperationMode } from "../../src/gen/idempotency/v1/admin_pb.js";
import { CoordinatorService, Decision } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { wireReason } from "../support/refusals.js";
import { useTestDatabase } from "../support/database.js";
import { newKey, testDocument } from "../support/fixtures.js";
import { startTestServer, type TestServer } from "../support/server.js";
import { until } from "../support/wait.js";

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
      await until(
        async () => (await wireReason(reserveOn(replica, "payouts.create"))) === "OPERATION_DRAINING",
        "the replica to refuse payouts.create as draining",
        10 * REFRESH_MS,
      );
    }
    // The mode is the operation's: another operation is untouched on every replica.
    for (const replica of replicas) expect((await reserveOn(replica, "payments.create")).decision).toBe(Decision.ACCEPTED);
  });

  it("runs each background job on one replica at a time, and hands it over when that replica stops", async () => {
    const holders = async () =>
      (await t.pool.query<{ job: string; holder: string; expires_at: string }>("SELECT job, holder, expires_at::text FROM idem_job_lease ORDER BY job")).rows;
    await until(async () => (await holders()).some((h) => h.job === "recoverer"), "a replica to take the recoverer's lease", 5_000);
    // Every pass of the recoverer renews its lease (a later expires_at): ten renewals seen, every replica
    // having tried to take the lease at each of its own passes meanwhile, and one holder throughout.
    const seen = new Set<string>();
    const renewals = new Set<string>();
    await until(async () => {
      const rows = await holders();
      // One row per job: one holder at a time.
      expect(new Set(rows.map((r) => r.job)).size).toBe(rows.length);
      const recoverer = rows.find((r) => r.job === "recoverer")!;
      seen.add(recoverer.holder);
      renewals.add(recoverer.expires_at);
      return renewals.size >= 10;
    }, "ten renewals of the recoverer's lease");
    expect(seen.size).toBe(1);
    const holder = [...seen][0]!;
    const holding = replicas.find((r) => r.coordinator.jobHolder === holder)!;
    await holding.stop();
    replicas.splice(replicas.indexOf(holding), 1);
    await until(
      async () => {
        const now = (await holders()).find((r) => r.job === "recoverer")?.holder;
        return now !== undefined && now !== holder;
      },
      "another replica to take the recoverer's lease",
      5_000,
    );
  });
});
