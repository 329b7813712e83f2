import { create } from "@bufbuild/protobuf";
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { BatchRequestSchema, Decision, type ReserveRequest } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey, testDocument } from "../support/fixtures.js";
import { wireReasonOf } from "../support/refusals.js";
import { loadConfig } from "../../src/config.js";
import { gatewayClient, reservesWaiting, useTestServer } from "../support/server.js";
import { until } from "../support/wait.js";
import { paymentReserve } from "../support/wire-requests.js";

/**
 * A row lock held for long by another writer (a co-located service's
 * business transaction holding a principal's quota row, or a record) blocks
 * the one call that needs it, never its neighbours: concurrent calls of one
 * tenant and caller share a transaction (unary RPCs and the calls of one
 * Batch alike), and each is still decided exactly as its unary RPC would be,
 * at its own pace. The registry's lock timeout is long here, so that a
 * neighbour held behind the lock would still be waiting when the test looks.
 */
const TEST_KEYS = JSON.stringify({ active: "k", keys: { k: Buffer.alloc(32, 7).toString("base64") } });

const t = useTestDatabase();
const server = useTestServer(t, () => ({
  operations: [testDocument({ lease: { default: "30s", max: "5m" } })],
  config: { db: { ...loadConfig({ DATABASE_URL: t.url, IDEM_SNAPSHOT_KEYS: TEST_KEYS }).db, lockTimeoutMs: 20_000, statementTimeoutMs: 30_000 }, waitersPerCaller: 2 },
}));

const reserveRequest = (principal: string, key = newKey(), waitMs?: number): ReserveRequest => paymentReserve({ key, principal, ...(waitMs !== undefined ? { waitMs } : {}) });

/** Whether a promise has settled, without waiting for it. */
async function settled(promise: Promise<unknown>): Promise<boolean> {
  const marker = Symbol("pending");
  const result = await Promise.race([
    promise.then(
      () => true,
      () => true,
    ),
    new Promise((resolve) => setTimeout(() => resolve(marker), 0)),
  ]);
  return result === true;
}

/**
 * Runs `work` while another transaction holds the row `lockSql` locks; the
 * lock is let go once `work` is done, whatever happens. (`work` answers
 * promises wrapped in an object: returned as they are, they would be awaited
 * under the lock.)
 */
async function whileLocked<T>(lockSql: string, values: unknown[], work: () => Promise<T>): Promise<T> {
  const holder: pg.PoolClient = await t.pool.connect();
  try {
    await holder.query("BEGIN");
    await holder.query("SELECT set_config('idem.all_tenants', 'on', true)");
    const { rowCount } = await holder.query(lockSql, values);
    expect(rowCount, "the row to hold").toBe(1);
    return await work();
  } finally {
    await holder.query("ROLLBACK");
    holder.release();
  }
}

const holdQuotaRow = (principal: string) => ["SELECT 1 FROM idem_quota_gate WHERE tenant_id = 'acme' AND principal = $1 FOR UPDATE", [principal]] as const;

describe("a row lock held by another writer", () => {
  it("blocks only the unary Reserve that needs it: the other fifteen are decided while it is held", async () => {
    const { client, call } = gatewayClient(server);
    // The blocked principal's gate row exists once it has a record.
    expect((await client.reserve(reserveRequest("blocked-unary"), call)).decision).toBe(Decision.ACCEPTED);
    const [sql, values] = holdQuotaRow("blocked-unary");
    await whileLocked(sql, [...values], async () => {
      const blocked = client.reserve(reserveRequest("blocked-unary"), call);
      const others = Array.from({ length: 15 }, (_, i) => client.reserve(reserveRequest(`unary-${i}`), call));
      const answers = await Promise.all(others);
      expect(answers.map((a) => a.decision)).toEqual(answers.map(() => Decision.ACCEPTED));
      expect(await settled(blocked), "the blocked Reserve to wait for the lock").toBe(false);
      return { blocked };
    }).then(async ({ blocked }) => expect((await blocked).decision).toBe(Decision.ACCEPTED));
  });

  it("blocks only the call of a Batch that needs it: the others are answered with it once it gets the lock", async () => {
    const { client, call } = gatewayClient(server);
    expect((await client.reserve(reserveRequest("blocked-batch"), call)).decision).toBe(Decision.ACCEPTED);
    const [sql, values] = holdQuotaRow("blocked-batch");
    // A Batch answers once all its calls are: the others must not have waited for the lock's timeout, nor been refused with it.
    const calls = [reserveRequest("blocked-batch"), ...Array.from({ length: 15 }, (_, i) => reserveRequest(`batch-${i}`))];
    const answered = await whileLocked(sql, [...values], async () => {
      const batch = client.batch(create(BatchRequestSchema, { calls: calls.map((value) => ({ call: { case: "reserve" as const, value } })) }), call);
      // Unrelated unary calls of the same caller are answered meanwhile.
      expect((await client.reserve(reserveRequest("meanwhile"), call)).decision).toBe(Decision.ACCEPTED);
      // The others are decided while the lock is still held: their records are there (committed).
      const decided = async () =>
        (await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record WHERE tenant_id = 'acme' AND principal LIKE 'batch-%' AND state = 'EXECUTING'")).rows[0]!.n;
      await until(async () => (await decided()) >= 15, "the fifteen other calls of the Batch to be decided while the lock is held");
      expect(await decided()).toBe(15);
      expect(await settled(batch)).toBe(false);
      return { batch };
    });
    const { results } = await answered.batch;
    expect(results.map((r) => (r.result.case === "reserve" ? r.result.value.decision : r.result.case))).toEqual(calls.map(() => Decision.ACCEPTED));
  });

  it("blocks only the Complete of the locked record: the other Completes are decided while it is held", async () => {
    const { client, call } = gatewayClient(server);
    const owned = await Promise.all(Array.from({ length: 16 }, (_, i) => client.reserve(reserveRequest(`complete-${i}`), call)));
    const refs = owned.map((o) => ({ tenant: "acme", operationId: o.operationId }));
    const complete = (ref: (typeof refs)[number]) =>
      client.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201, body: new TextEncoder().encode("{}") } }, call);
    await whileLocked("SELECT 1 FROM idem_record WHERE tenant_id = 'acme' AND operation_id = $1 FOR UPDATE", [refs[0]!.operationId], async () => {
      const blocked = complete(refs[0]!);
      const others = await Promise.all(refs.slice(1).map(complete));
      expect(others.map((o) => o.state)).toEqual(others.map(() => RecordState.SUCCEEDED));
      expect(await settled(blocked)).toBe(false);
      return { blocked };
    }).then(async ({ blocked }) => expect((await blocked).state).toBe(RecordState.SUCCEEDED));
  });
});

describe("Reserves waiting for an owner", () => {
  it("are bounded per caller: one more is refused RESOURCE_EXHAUSTED, and the bound frees as waits end", async () => {
    const { client, call } = gatewayClient(server);
    const key = newKey();
    expect((await client.reserve(reserveRequest("waited-on", key), call)).decision).toBe(Decision.ACCEPTED);
    const stop = new AbortController();
    const waiting = [1, 2].map(() => client.reserve(reserveRequest("waited-on", key, 20_000), { ...call, signal: stop.signal }).catch(() => undefined));
    // A third short wait, once the two long ones are admitted (this server's bound is 2): it is refused.
    const third = () =>
      client.reserve(reserveRequest("waited-on", key, 100), call).then(
        (answer) => answer,
        (error: unknown) => ConnectError.from(error),
      );
    await until(async () => (await reservesWaiting(server)) === 2, "the two long waits to be admitted");
    const refused = await third();
    expect(refused).toBeInstanceOf(ConnectError);
    expect((refused as ConnectError).code).toBe(Code.ResourceExhausted);
    expect(wireReasonOf(refused)).toBe("TOO_MANY_WAITERS");
    expect((refused as ConnectError).rawMessage).toMatch(/already has 2 Reserves waiting .*IDEM_WAITERS_PER_CALLER/);
    // Without asking to wait, the same request is answered as ever.
    expect((await client.reserve(reserveRequest("waited-on", key), call)).decision).toBe(Decision.IN_PROGRESS);
    // Once the two waits end (their clients gave up), a wait is admitted again.
    stop.abort();
    await Promise.all(waiting);
    await until(async () => (await reservesWaiting(server)) === 0, "the coordinator to end the two waits");
    expect(await third()).toMatchObject({ decision: Decision.IN_PROGRESS });
  });
});
