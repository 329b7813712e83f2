import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startCluster, type Cluster, type Member } from "../../harness/lib/cluster.js";
import type { HookPoint } from "../../src/fault-hooks.js";
import { useTestDatabase } from "../support/database.js";
import { until } from "../support/wait.js";

// Kills a real process exactly at each failpoint in the middle of a request,
// starts it again, lets the client retry and the recovery worker run, then
// checks the invariants: one operation per key, one business row, one outbox
// row and one provider charge per accepted operation, no UNKNOWN record
// executed again, generations that only grew. The coordinator runs as three
// replicas, which the service's SDK spreads its calls over.

const t = useTestDatabase();
let cluster: Cluster;

beforeAll(async () => {
  cluster = await startCluster({
    databaseUrl: t.url,
    schema: t.schema,
    replicas: 3,
    coordinatorEnv: { IDEM_RECOVERER_INTERVAL_MS: "200" },
    serviceEnv: { PROVIDER_TIMEOUT_MS: "1000" },
  });
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
});

const ALICE = "Bearer alice-token-7f3a9c2e";

async function post(key: string, body: unknown): Promise<{ status: number; text: string } | { error: string }> {
  try {
    const res = await fetch(`${cluster.service.url}/v1/payments`, {
      method: "POST",
      headers: { "content-type": "application/json", "idempotency-key": key, authorization: ALICE },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(10_000),
    });
    return { status: res.status, text: await res.text() };
  } catch (error) {
    return { error: (error as Error).message };
  }
}

/** Ends every live lease, as if their owners had gone silent (so the test need not wait for them). */
const endLeases = () => t.pool.query("UPDATE idem_record SET lease_expires_at = now() - interval '1 second' WHERE state IN ('RESERVED', 'EXECUTING') AND lease_expires_at > now()");

/** Retries like a client: until a final answer; 409 and 503 and lost connections mean try again. */
async function retryUntilFinal(key: string, body: unknown): Promise<{ status: number; text: string }> {
  let final: { status: number; text: string } | undefined;
  await until(
    async () => {
      const answer = await post(key, body);
      if ("status" in answer && answer.status !== 409 && answer.status !== 503) final = answer;
      else await endLeases();
      return final !== undefined;
    },
    `a final answer for ${key}`,
    30_000,
  );
  return final!;
}

async function crashAt(target: Member, point: HookPoint, extra: Record<string, string> = {}): Promise<void> {
  await target.kill();
  await target.restart({ IDEM_FAILPOINTS: `${point}=kill`, ...extra });
}

/** Arms the failpoint on every replica: whichever one the call reaches dies there, and so does the one its retry reaches. */
async function crashReplicasAt(point: HookPoint): Promise<void> {
  for (const replica of cluster.coordinators) await crashAt(replica, point);
}

/** Waits until a replica died at its failpoint, then starts every replica again without it. */
async function restartReplicas(): Promise<void> {
  await until(() => cluster.coordinators.some((replica) => !replica.alive()), "a replica to die at its failpoint");
  for (const replica of cluster.coordinators) {
    await replica.kill();
    await replica.restart();
  }
}

async function invariants(key: string, first: { status: number; text: string }) {
  const payment = JSON.parse(first.text) as { operationId: string; chargeId: string };
  const { rows: records } = await t.pool.query<{ state: string; generation: number }>("SELECT state, generation::int FROM idem_record WHERE operation_id = $1", [
    payment.operationId,
  ]);
  // eslint-disable-next-line @typescript-eslint/no-unsafe-assignment -- vitest types its asymmetric matchers (expect.any) as any
  expect(records).toEqual([{ state: "SUCCEEDED", generation: expect.any(Number) }]);
  const { rows: rowCounts } = await t.pool.query(
    `SELECT (SELECT count(*)::int FROM payments WHERE operation_id = $1) AS payments,
            (SELECT count(*)::int FROM payment_outbox o JOIN payments p ON p.id = o.payment_id WHERE p.operation_id = $1) AS outbox`,
    [payment.operationId],
  );
  expect(rowCounts[0]).toEqual({ payments: 1, outbox: 1 });
  const { rows: keys } = await t.pool.query<{ downstream_key: string }>("SELECT DISTINCT downstream_key FROM idem_effect_attempt WHERE operation_id = $1", [payment.operationId]);
  expect(keys).toHaveLength(1);
  const state = await cluster.providerState();
  expect(state.charges.filter((c) => c.idempotencyKey === keys[0]?.downstream_key).map((c) => c.id)).toEqual([payment.chargeId]);
  const { rows: events } = await t.pool.query<{ kind: string; generation: number }>("SELECT kind, generation::int FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [
    payment.operationId,
  ]);
  const generations = events.map((e) => e.generation);
  expect(generations).toEqual([...generations].sort((a, b) => a - b));
  // The client's retries replay the same body, and a different amount under the key is refused.
  const again = await post(key, { amount: 1500, currency: "EUR", card: "4242" });
  expect(again).toEqual({ status: first.status, text: first.text });
  expect(await post(key, { amount: 1501, currency: "EUR", card: "4242" })).toMatchObject({ status: 422 });
  return { payment, events: events.map((e) => e.kind) };
}

const BODY = { amount: 1500, currency: "EUR", card: "4242" };

describe("a process killed mid-request, at each failpoint", () => {
  it("coordinator dies right after the reservation committed: recovery finds nothing charged and finishes it as not made, never running it again", async () => {
    // Reserve over RPC: co-located mode with only completion in the service.
    await cluster.service.kill();
    await cluster.service.restart({ PAYMENTS_COLOCATED: "completion" });
    await crashReplicasAt("registry.reserve.after-commit");
    const key = randomUUID();
    const first = await post(key, BODY);
    // Not answered yet: the replica the retry reached found the record's lease held (409) or died as well (503).
    expect("status" in first && [409, 503].includes(first.status)).toBe(true);
    await restartReplicas();
    // The declared charge made an effect possible: once the lease ended the record was UNKNOWN, and an
    // UNKNOWN record never runs again. Recovery found no charge under its downstream key and no intent.
    const final = await retryUntilFinal(key, BODY);
    expect(final.status).toBe(500);
    expect(JSON.parse(final.text)).toMatchObject({ title: "Payment not made" });
    const { rows: records } = await t.pool.query<{ operation_id: string; state: string }>("SELECT operation_id, state FROM idem_record ORDER BY created_at DESC LIMIT 1");
    const operationId = records[0]!.operation_id;
    expect(records[0]!.state).toBe("FAILED_FINAL");
    const { rows: events } = await t.pool.query<{ kind: string }>("SELECT kind FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [operationId]);
    expect(events.map((e) => e.kind)).toEqual(expect.arrayContaining(["UNKNOWN", "RECOVERY_CLAIMED", "COMPLETED"]));
    expect(events.map((e) => e.kind)).not.toContain("TAKEOVER");
    const { rows: payments } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM payments WHERE operation_id = $1", [operationId]);
    expect(payments[0]!.n).toBe(0);
    const { rows: keys } = await t.pool.query<{ downstream_key: string }>("SELECT DISTINCT downstream_key FROM idem_effect_attempt WHERE operation_id = $1", [operationId]);
    expect((await cluster.providerState()).charges.filter((c) => keys.some((k) => k.downstream_key === c.idempotencyKey))).toEqual([]);
    // Every retry gets the same answer.
    expect(await post(key, BODY)).toEqual({ status: final.status, text: final.text });
    await cluster.service.kill();
    await cluster.service.restart();
  }, 60_000);

  it("service dies after the provider charged, before the attempt was resolved: recovered with the original key, one charge", async () => {
    await crashAt(cluster.service, "gateway.effect.after-call");
    const key = randomUUID();
    expect(await post(key, BODY)).toHaveProperty("error");
    await until(() => !cluster.service.alive(), "the service to die at its failpoint");
    await cluster.service.restart();
    const final = await retryUntilFinal(key, BODY);
    expect(final.status).toBe(201);
    const { events } = await invariants(key, final);
    expect(events).toEqual(expect.arrayContaining(["UNKNOWN", "RECOVERY_CLAIMED"]));
    // UNKNOWN was never executed again: no TAKEOVER of it.
    expect(events).not.toContain("TAKEOVER");
  }, 60_000);

  it("service dies before the business commit: nothing of the business was kept, recovery settles the charge once", async () => {
    await crashAt(cluster.service, "gateway.business.before-commit");
    const key = randomUUID();
    expect(await post(key, BODY)).toHaveProperty("error");
    await cluster.service.restart();
    const final = await retryUntilFinal(key, BODY);
    expect(final.status).toBe(201);
    await invariants(key, final);
  }, 60_000);

  it("service dies after the business commit, before answering: the retry gets the committed result", async () => {
    await crashAt(cluster.service, "gateway.business.after-commit");
    const key = randomUUID();
    expect(await post(key, BODY)).toHaveProperty("error");
    await cluster.service.restart();
    const final = await retryUntilFinal(key, BODY);
    expect(final.status).toBe(201);
    expect((await invariants(key, final)).events).not.toContain("UNKNOWN");
  }, 60_000);

  for (const point of ["registry.complete.before-commit", "registry.complete.after-commit"] as const) {
    it(`coordinator dies inside Complete (${point.endsWith("before-commit") ? "before" : "after"} its commit), the service completing over RPC: one charge, one row`, async () => {
      await cluster.service.kill();
      await cluster.service.restart({ PAYMENTS_COLOCATED: "false" });
      await crashReplicasAt(point);
      const key = randomUUID();
      const first = await post(key, BODY);
      expect("error" in first || first.status === 503).toBe(true);
      await restartReplicas();
      const final = await retryUntilFinal(key, BODY);
      expect(final.status).toBe(201);
      await invariants(key, final);
      await cluster.service.kill();
      await cluster.service.restart();
    }, 90_000);
  }
});
