import { describe, expect, it } from "vitest";
import { HealthCheckResponse_ServingStatus } from "../../src/gen/grpc/health/v1/health_pb.js";
import { Decision } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { transactionDb } from "../../src/registry/db.js";
import { useTestDatabase } from "../support/database.js";
import { actor, newKey, reserveInput, testRegistry } from "../support/fixtures.js";
import { gatewayClient, startTestServer } from "../support/server.js";
import { until } from "../support/wait.js";

const t = useTestDatabase();

describe("graceful stop", () => {
  it("stops serving new work at once but lets in-flight RPCs finish before closing", async () => {
    // Ten transactions of one tenant and caller at a time, so that each of the ten Reserves below waits in a transaction of its own.
    const server = await startTestServer(t, { config: { batch: { maxBatch: 64, maxInFlight: 10, lockWaitMs: 50 } } });
    const { client, call } = gatewayClient(server);
    const key = newKey();
    const body = new TextEncoder().encode(JSON.stringify({ amount: 10 }));

    // Another transaction has reserved the same scope and not committed yet:
    // every Reserve of that scope waits on it inside the server.
    const blocker = await t.pool.connect();
    await blocker.query("BEGIN");
    const first = await testRegistry().reserve(transactionDb(blocker), reserveInput(key), actor());
    expect(first.decision).toBe("ACCEPTED");

    const waiting = Array.from({ length: 10 }, () =>
      client.reserve(
        {
          subject: { tenant: "acme", principal: "alice" },
          operation: "payments.create",
          apiRevision: 1,
          idempotencyKey: key,
          request: { case: "parts", value: { method: "POST", path: "/v1/payments", mediaType: "application/json", body } },
        },
        call,
      ),
    );
    const lockWaits = async () =>
      (await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", [server.applicationName]))
        .rows[0]!.n;
    await until(async () => (await lockWaits()) >= 10, "all ten Reserves to wait on the uncommitted reservation's lock");

    let stopped = false;
    const stopping = server.stop().then(() => (stopped = true));
    // The stop has reached its drain: the RPC port takes no new connection, while
    // the ten (still waiting on the lock, which only this test releases) are in flight.
    await until(
      () =>
        fetch(`${server.baseUrl}/`).then(
          () => false,
          () => true,
        ),
      "the RPC port to refuse new connections",
    );
    expect(server.coordinator.health.get("")).toBe(HealthCheckResponse_ServingStatus.NOT_SERVING);
    expect((await fetch(`${server.adminUrl}/readyz`)).status).toBe(503);
    expect(stopped).toBe(false);

    await blocker.query("COMMIT");
    blocker.release();
    const answers = await Promise.all(waiting);
    await stopping;
    expect(answers.map((a) => a.decision)).toEqual(Array(10).fill(Decision.IN_PROGRESS));
    expect(new Set(answers.map((a) => a.operationId))).toEqual(new Set([first.record!.operationId]));
    // Nothing listens any more.
    await expect(fetch(`${server.baseUrl}/`)).rejects.toThrow();
  });
});
