import type pg from "pg";
import { afterEach, describe, expect, it } from "vitest";
import { poolDb, type Db } from "../../src/registry/db.js";
import { Registry } from "../../src/registry/registry.js";
import type { CompleteInput, StoredRecord } from "../../src/registry/types.js";
import type { FaultHooks } from "../../src/fault-hooks.js";
import { StaticPolicies } from "../../src/policy/operations.js";
import { actor, newKey, reserveInput, testPolicy } from "../support/fixtures.js";
import { CROSS_TENANT_ROLE, SERVER_ROLE, interceptedPool, silentLogger, useTestDatabase } from "../support/database.js";
import { countRows, expectRefusal } from "../support/registry-helpers.js";

const t = useTestDatabase();
const gateway = actor();

/** The pools a test opens, closed once it ends: each test's pools take up to twenty connections, which would otherwise stay open until the last test. */
const testPools: pg.Pool[] = [];
function openTestPool(settings: Parameters<typeof t.openPool>[0]): pg.Pool {
  const pool = t.openPool(settings);
  testPools.push(pool);
  return pool;
}
afterEach(async () => {
  await Promise.all(testPools.splice(0).map((pool) => pool.end()));
});

const policies = [testPolicy(), testPolicy({ operation: "holds.create", maxActivePerPrincipal: 3 })];

/** A coalescing registry (one transaction in flight per lane, so that concurrent requests batch) over a Db that counts its transactions by name. */
function coalescing(hooks?: FaultHooks): { registry: Registry; db: Db; committed: Map<string, number> } {
  const committed = new Map<string, number>();
  const db = poolDb(openTestPool({ role: SERVER_ROLE }), silentLogger, {
    crossTenantPool: openTestPool({ role: CROSS_TENANT_ROLE, max: 2 }),
    committed: (name) => committed.set(name, (committed.get(name) ?? 0) + 1),
  });
  const registry = new Registry({ policies: new StaticPolicies(policies), coalesce: { maxBatch: 64, maxInFlight: 1 }, ...(hooks ? { hooks } : {}) });
  return { registry, db, committed };
}

const snapshot = (body: string) => ({ statusCode: 201, mediaType: "application/json", location: "", businessVersion: "", headers: [], body: new TextEncoder().encode(body) });

describe("coalesced Reserves", () => {
  it("answers 40 concurrent new scopes, replays, owners at work and conflicts each as alone, in fewer transactions than requests", async () => {
    const { registry, db, committed } = coalescing();
    const principal = `p-${newKey()}`;
    const subject = { tenant: "acme", principal };
    const done = newKey();
    const busy = newKey();
    const first = await registry.reserve(db, reserveInput(done, { amount: 1 }, { subject, claim: true }), gateway);
    await registry.complete(db, { ref: { tenant: "acme", operationId: first.record!.operationId }, generation: 1, outcome: "SUCCEEDED", snapshot: snapshot("{}") }, gateway);
    await registry.reserve(db, reserveInput(busy, { amount: 1 }, { subject, claim: true }), gateway);
    committed.clear();

    const fresh = Array.from({ length: 40 }, () => newKey());
    const results = await Promise.all([
      ...fresh.map((key) => registry.reserve(db, reserveInput(key, { amount: 1 }, { subject }), gateway)),
      registry.reserve(db, reserveInput(done, { amount: 1 }, { subject }), gateway),
      registry.reserve(db, reserveInput(busy, { amount: 1 }, { subject }), gateway),
      registry.reserve(db, reserveInput(done, { amount: 2 }, { subject }), gateway),
    ]);
    expect(results.slice(0, 40).map((r) => r.decision)).toEqual(fresh.map(() => "ACCEPTED"));
    expect(new Set(results.slice(0, 40).map((r) => r.record!.operationId)).size).toBe(40);
    expect(results.slice(40).map((r) => r.decision)).toEqual(["REPLAY", "IN_PROGRESS", "PAYLOAD_CONFLICT"]);
    expect(results[41]!.retryAfterMs).toBeGreaterThan(0);
    // Batches happened: far fewer reservation transactions than the 43 requests (the conflict's is its own).
    expect(committed.get("reserve")).toBeLessThan(20);

    // Each new record is stored once, with its ACCEPTED event; the conflict logged once.
    const { rows } = await t.pool.query<{ kind: string; n: number }>(
      "SELECT e.kind, count(*)::int AS n FROM idem_event e JOIN idem_record r USING (tenant_id, operation_id) WHERE r.principal = $1 GROUP BY e.kind ORDER BY e.kind",
      [principal],
    );
    expect(rows).toEqual([
      { kind: "ACCEPTED", n: 42 },
      { kind: "COMPLETED", n: 1 },
      { kind: "CONFLICT", n: 1 },
    ]);
  });

  it("accepts one of many concurrent requests of the same scope, in a batch or not", async () => {
    const { registry, db } = coalescing();
    const key = newKey();
    const subject = { tenant: "acme", principal: `p-${newKey()}` };
    const results = await Promise.all(Array.from({ length: 30 }, () => registry.reserve(db, reserveInput(key, { amount: 5 }, { subject }), gateway)));
    expect(results.filter((r) => r.decision === "ACCEPTED")).toHaveLength(1);
    expect(results.filter((r) => r.decision === "IN_PROGRESS")).toHaveLength(29);
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record WHERE principal = $1", [subject.principal]);
    expect(rows[0]!.n).toBe(1);
  });

  it("answers each request with its own scope's record when copies of one scope interleave with others in a batch", async () => {
    const { registry, db } = coalescing();
    const subject = { tenant: "acme", principal: `p-${newKey()}` };
    const keys = Array.from({ length: 10 }, () => newKey());
    // A, B, A, C, B, … : the second copy of a scope is decided after its batch, the others in it.
    const order = [...keys, ...keys, ...keys].sort(() => Math.random() - 0.5);
    const results = await Promise.all(order.map((key) => registry.reserve(db, reserveInput(key, { amount: 1 }, { subject }), gateway)));
    const { rows } = await t.pool.query<{ operation_id: string; scope: Buffer }>("SELECT operation_id, scope FROM idem_record WHERE principal = $1", [subject.principal]);
    expect(rows).toHaveLength(10);
    const operationOfKey = new Map<string, string>();
    order.forEach((key, i) => {
      const answered = results[i]!.record!.operationId;
      expect(operationOfKey.get(key) ?? answered).toBe(answered);
      operationOfKey.set(key, answered);
    });
    expect(new Set(operationOfKey.values()).size).toBe(10);
    expect(results.filter((r) => r.decision === "ACCEPTED")).toHaveLength(10);
  });

  it("keeps the quota exact: of 20 concurrent new scopes under a quota of 3, exactly 3 are accepted and nothing of the others is stored", async () => {
    const { registry, db } = coalescing();
    const subject = { tenant: "acme", principal: `p-${newKey()}` };
    const before = await countRows(t.pool);
    const results = await Promise.allSettled(
      Array.from({ length: 20 }, () => registry.reserve(db, reserveInput(newKey(), { amount: 1 }, { subject, operation: "holds.create" }), gateway)),
    );
    const accepted = results.filter((r) => r.status === "fulfilled" && r.value.decision === "ACCEPTED");
    const refused = results.filter((r) => r.status === "rejected" && (r.reason as { reason?: string }).reason === "QUOTA_EXCEEDED");
    expect([accepted.length, refused.length]).toEqual([3, 17]);
    const after = await countRows(t.pool);
    expect(after.records - before.records).toBe(3);
    expect(after.events - before.events).toBe(3);
  });

  for (const when of ["before its COMMIT was sent", "while its COMMIT's answer was on its way"] as const) {
    it(`gives every request of a batch whose connection died ${when} one definite answer: the batch is re-run, each recognizes its own record, nothing is doubled`, async () => {
      let armed = false;
      let died = false;
      // The batch's insert (with its quota counts) arms the fault; the COMMIT sent behind it (the batch's: one transaction in flight) meets it.
      const dying = interceptedPool(openTestPool({ role: SERVER_ROLE }), async (text, _values, send) => {
        if (text.includes("i_quota")) armed = !died;
        if (text !== "COMMIT" || !armed) return send();
        armed = false;
        died = true;
        if (when === "before its COMMIT was sent") throw new Error("Connection terminated unexpectedly");
        await send();
        throw new Error("Connection terminated unexpectedly");
      });
      const db = poolDb(dying, silentLogger);
      const registry = new Registry({ policies: new StaticPolicies(policies), coalesce: { maxBatch: 64, maxInFlight: 1 } });
      const subject = { tenant: "acme", principal: `p-${newKey()}` };
      const keys = Array.from({ length: 24 }, () => newKey());
      const results = await Promise.all(keys.map((key) => registry.reserve(db, reserveInput(key, { amount: 1 }, { subject }), gateway)));
      expect(died).toBe(true);
      expect(results.map((r) => r.decision)).toEqual(keys.map(() => "ACCEPTED"));
      const { rows } = await t.pool.query<{ records: number; events: number }>(
        "SELECT count(DISTINCT r.operation_id)::int AS records, count(e.*)::int AS events FROM idem_record r JOIN idem_event e USING (tenant_id, operation_id) WHERE r.principal = $1",
        [subject.principal],
      );
      expect(rows[0]).toEqual({ records: 24, events: 24 });
      const stored = await t.pool.query<{ operation_id: string }>("SELECT operation_id FROM idem_record WHERE principal = $1", [subject.principal]);
      expect(new Set(stored.rows.map((r) => r.operation_id))).toEqual(new Set(results.map((r) => r.record!.operationId)));
    });
  }
});

describe("coalesced Completes", () => {
  async function accepted(registry: Registry, db: Db, n: number): Promise<string[]> {
    const subject = { tenant: "acme", principal: `p-${newKey()}` };
    const results = await Promise.all(Array.from({ length: n }, () => registry.reserve(db, reserveInput(newKey(), { amount: 1 }, { subject, claim: true }), gateway)));
    return results.map((r) => r.record!.operationId);
  }

  it("finishes 30 concurrent operations in fewer transactions, answering refused neighbours with their own refusal and writing nothing for them", async () => {
    const { registry, db, committed } = coalescing();
    const ids = await accepted(registry, db, 30);
    committed.clear();
    const complete = (input: Partial<CompleteInput> & { operationId: string }) =>
      registry.complete(
        db,
        {
          ref: { tenant: "acme", operationId: input.operationId },
          generation: input.generation ?? 1,
          outcome: input.outcome ?? "SUCCEEDED",
          snapshot: snapshot(`{"id":"${input.operationId}"}`),
        },
        gateway,
      );
    const before = await countRows(t.pool);
    const results = await Promise.allSettled([
      ...ids.slice(0, 27).map((operationId) => complete({ operationId })),
      complete({ operationId: ids[27]!, generation: 7 }),
      complete({ operationId: newKey() }),
      complete({ operationId: ids[29]!, outcome: "REJECTED" }),
    ]);
    for (const r of results.slice(0, 27)) expect(r.status === "fulfilled" && r.value.state).toBe("SUCCEEDED");
    expect(
      results
        .slice(0, 27)
        .map((r) => (r.status === "fulfilled" ? new TextDecoder().decode(r.value.snapshot!.body) : ""))
        .sort(),
    ).toEqual(
      ids
        .slice(0, 27)
        .map((id) => `{"id":"${id}"}`)
        .sort(),
    );
    const [stale, missing, rejected] = results.slice(27) as [PromiseSettledResult<StoredRecord>, PromiseSettledResult<StoredRecord>, PromiseSettledResult<StoredRecord>];
    expect(stale.status === "rejected" && (stale.reason as { reason: string }).reason).toBe("STALE_GENERATION");
    expect(missing.status === "rejected" && (missing.reason as { reason: string }).reason).toBe("NOT_FOUND");
    expect(rejected.status === "fulfilled" && rejected.value.state).toBe("REJECTED");
    const after = await countRows(t.pool);
    expect(after.events - before.events).toBe(28);
    expect(committed.get("complete")).toBeLessThan(20);

    // An identical repeat is answered again; another snapshot is refused.
    await expect(complete({ operationId: ids[0]! })).resolves.toMatchObject({ state: "SUCCEEDED" });
    await expectRefusal(
      registry.complete(db, { ref: { tenant: "acme", operationId: ids[0]! }, generation: 1, outcome: "SUCCEEDED", snapshot: snapshot("{}") }, gateway),
      "ALREADY_COMPLETED",
    );
  });

  it("answers each Complete with its own operation when two Completes of one operation interleave with others in a batch", async () => {
    const { registry, db } = coalescing();
    const ids = await accepted(registry, db, 8);
    const order = [...ids, ...ids].sort(() => Math.random() - 0.5);
    const results = await Promise.all(
      order.map((operationId) =>
        registry.complete(db, { ref: { tenant: "acme", operationId }, generation: 1, outcome: "SUCCEEDED", snapshot: snapshot(`{"id":"${operationId}"}`) }, gateway),
      ),
    );
    expect(results.map((r) => r.operationId)).toEqual(order);
    expect(results.map((r) => new TextDecoder().decode(r.snapshot!.body))).toEqual(order.map((id) => `{"id":"${id}"}`));
  });

  it("keeps each principal's count of unfinished records equal to its records through batches, completions, releases, recovery, reconciliation and the jobs", async () => {
    const { registry, db } = coalescing();
    const subject = { tenant: "acme", principal: `p-${newKey()}` };
    const reserved = await Promise.all(Array.from({ length: 20 }, () => registry.reserve(db, reserveInput(newKey(), { amount: 1 }, { subject, claim: true }), gateway)));
    const refs = reserved.map((r) => ({ tenant: "acme", operationId: r.record!.operationId }));
    const counted = async () =>
      (
        await t.pool.query<{ active: number; actual: number }>(
          `SELECT g.active, (SELECT count(*)::int FROM idem_record r
                              WHERE r.tenant_id = g.tenant_id AND r.principal = g.principal AND r.operation = g.operation AND r.api_revision = g.api_revision
                                AND r.state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')) AS actual
             FROM idem_quota_gate g WHERE g.tenant_id = 'acme' AND g.principal = $1`,
          [subject.principal],
        )
      ).rows;
    expect(await counted()).toEqual([{ active: 20, actual: 20 }]);
    // Eight finish together, three are handed back (still unfinished), two go UNKNOWN after an effect, one of which an operator settles.
    await Promise.all(refs.slice(0, 8).map((ref) => registry.complete(db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: snapshot("{}") }, gateway)));
    await Promise.all(refs.slice(8, 11).map((ref) => registry.release(db, { ref, generation: 1 }, gateway)));
    for (const ref of refs.slice(11, 13)) {
      await registry.recordEffectAttempt(db, { ref, generation: 1, effect: "card.charge", provider: "cards" }, gateway);
      await registry.abandon(db, { ref, generation: 1 }, gateway);
    }
    const operator = actor({ operator: true });
    await registry.reconcile(db, { ref: refs[11]!, outcome: "SUCCEEDED", snapshot: snapshot("{}"), evidence: "provider dashboard", operatorName: "olga" }, operator);
    expect(await counted()).toEqual([{ active: 11, actual: 11 }]);
    // Reopened by an operator, swept by the recoverer once leases end, tombstoned by the retention sweep: still unfinished, or still finished.
    await registry.reconcile(db, { ref: refs[12]!, reopen: true, evidence: "nothing at the provider", operatorName: "olga" }, operator);
    await t.pool.query("UPDATE idem_record SET lease_expires_at = now() - interval '1 second' WHERE principal = $1 AND lease_expires_at IS NOT NULL", [subject.principal]);
    await registry.recoverExpiredLeases(t.db, { batchSize: 100, caller: "recoverer" });
    await t.pool.query("UPDATE idem_record SET retain_until = now() - interval '1 second' WHERE principal = $1 AND retain_until IS NOT NULL", [subject.principal]);
    expect((await registry.sweepRetention(t.db, { batchSize: 100, caller: "sweeper" })).tombstoned).toBeGreaterThanOrEqual(9);
    expect(await counted()).toEqual([{ active: 11, actual: 11 }]);
  });

  it("commits all of a batch or none of it: after a failure before its COMMIT, each operation is finished once, alone", async () => {
    // The first Complete runs alone (nothing else is in flight); the next ones batch, and the batch fails.
    let reached = 0;
    const hooks: FaultHooks = {
      reached(point) {
        if (point === "registry.complete.before-commit" && ++reached === 2) throw new Error("injected failure before COMMIT");
      },
    };
    const { registry, db, committed } = coalescing(hooks);
    const ids = await accepted(registry, db, 10);
    committed.clear();
    const before = await countRows(t.pool);
    const results = await Promise.all(
      ids.map((operationId) => registry.complete(db, { ref: { tenant: "acme", operationId }, generation: 1, outcome: "SUCCEEDED", snapshot: snapshot("{}") }, gateway)),
    );
    expect(results.map((r) => r.state)).toEqual(ids.map(() => "SUCCEEDED"));
    // The failed batch wrote nothing that survived: one COMPLETED event per operation, each from a transaction of its own.
    expect((await countRows(t.pool)).events - before.events).toBe(10);
    expect(committed.get("complete")).toBe(10);
  });
});
