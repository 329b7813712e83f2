import { randomUUID } from "node:crypto";
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ColocatedRegistry } from "../../src/colocated/index.js";
import { downstreamKey } from "../../src/contract/effects.js";
import { CoordinatorClient, IdempotencyGateway, toHttpResponse, type HttpResponse, type IdempotencyContext } from "../../src/gateway/index.js";
import { RecoveryWorker } from "../../src/gateway/recovery.js";
import { PolicyStore } from "../../src/registry/policy-store.js";
import { recoverExpiredLeases, sweepRetention } from "../../src/registry/jobs.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { expireLease } from "../support/registry-helpers.js";
import { startTestServer, type TestServer } from "../support/server.js";
import { useServiceRole } from "../support/service-role.js";
import { until } from "../support/wait.js";
import { CREATE_ORDERS, createOrder, orderRequest } from "./orders.js";

/**
 * Co-located mode with its whole lifecycle: Reserve, effects, leases and
 * Complete run in the service's process on its own pool, acting as a role
 * bound by row-level security, and the gateway makes no RPC at all (its
 * client refuses every call). The coordinator runs beside it only to publish
 * the policies and to show that it sees, recovers and sweeps these records
 * as its own.
 */

const t = useTestDatabase();
const service = useServiceRole(t);
let coordinator: TestServer;
let pool: pg.Pool;
let colocated: ColocatedRegistry;
let gateway: IdempotencyGateway;
/** Every RPC the gateway tried (none may happen). */
const rpcs: string[] = [];
const alice = { tenant: "acme", principal: "alice" };
const route = { operation: "payments.create", apiRevision: 1 };
const brief = { keep: "1s", clientRetryWindow: "0s", queueBacklogWindow: "0s", reconciliationWindow: "0s", backupRestoreWindow: "0s" };

/** A coordinator client that refuses every call: the co-located gateway must not need it. */
function noRpcClient(): CoordinatorClient {
  const refuse = (method: string) => () => {
    rpcs.push(method);
    return Promise.reject(new Error(`${method} was sent over RPC`));
  };
  const methods = ["reserve", "claim", "renewLease", "recordEffectAttempt", "resolveEffectAttempt", "complete", "release", "abandon", "lookup", "listRecoverable"];
  return Object.fromEntries(methods.map((m) => [m, refuse(m)])) as unknown as CoordinatorClient;
}

beforeAll(async () => {
  coordinator = await startTestServer(t, {
    operations: [
      testDocument(),
      testDocument({ operation: "orders.shadow" }),
      testDocument({ operation: "orders.drain" }),
      testDocument({ operation: "orders.quota", maxActivePerPrincipal: 1 }),
      testDocument({ operation: "orders.epoch" }),
      testDocument({ operation: "orders.brief", retention: brief }),
    ],
  });
  const controls = new PolicyStore(t.db);
  await controls.setControl({ operation: "orders.shadow", apiRevision: 1, change: { mode: "SHADOW" }, updatedBy: "test" });
  await controls.setControl({ operation: "orders.drain", apiRevision: 1, change: { mode: "DRAINING" }, updatedBy: "test" });
  await controls.setControl({ operation: "orders.epoch", apiRevision: 1, change: { writerEpoch: 1 }, updatedBy: "test" });
  await t.pool.query(CREATE_ORDERS);
  await service.grant("orders");
  pool = t.openPool({ role: service.role, max: 6 });
  colocated = await ColocatedRegistry.open({ pool, caller: "orders-service", tenants: ["acme"], snapshotKeys: coordinator.snapshotKeys! });
  gateway = new IdempotencyGateway({ client: noRpcClient(), colocated, logger: { warn: () => undefined, error: () => undefined } });
});

afterAll(async () => {
  colocated?.stop();
  await coordinator?.stop();
  expect(rpcs, "RPCs the co-located gateway sent").toEqual([]);
});

const run = (
  key: string,
  handler: (ctx: IdempotencyContext) => Promise<HttpResponse>,
  options: { amount?: number; route?: Record<string, unknown>; subject?: typeof alice } = {},
) => gateway.execute({ ...route, ...options.route }, options.subject ?? alice, orderRequest(key, options.amount), handler);

/** The record and its events as the registry's owner reads them (no tenant binding needed). */
async function recordOf(operationId: string) {
  const { rows } = await t.pool.query<{ state: string; generation: number }>("SELECT state, generation::int FROM idem_record WHERE operation_id = $1", [operationId]);
  const { rows: events } = await t.pool.query<{ kind: string; caller: string }>("SELECT kind, caller FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [operationId]);
  return { ...rows[0], events };
}
const orderCount = async (operationId: string) => (await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM orders WHERE operation_id = $1", [operationId])).rows[0]!.n;
const recordsOfOperation = async (operation: string) =>
  (await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record WHERE operation = $1", [operation])).rows[0]!.n;
const problem = (response: HttpResponse) => JSON.parse(Buffer.from(response.body).toString()) as { type: string; operationId?: string };

/** A handler that waits inside until `release()`; `entered` settles once it runs. */
function heldHandler(then: (ctx: IdempotencyContext) => Promise<HttpResponse> = createOrder) {
  let release: () => void = () => undefined;
  let entered: (ctx: IdempotencyContext) => void = () => undefined;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const inside = new Promise<IdempotencyContext>((resolve) => (entered = resolve));
  return {
    release: () => release(),
    inside,
    handler: async (ctx: IdempotencyContext) => {
      entered(ctx);
      await gate;
      return then(ctx);
    },
  };
}

describe("the whole lifecycle in the service's process", () => {
  it("accepts a new key, commits the acceptance before the handler runs, and the terminal state with its row", async () => {
    const key = randomUUID();
    let operationId = "";
    const first = await run(key, async (ctx) => {
      operationId = ctx.operationId;
      // The acceptance is committed before the handler runs: everyone sees the record executing.
      expect((await recordOf(ctx.operationId)).state).toBe("EXECUTING");
      return createOrder(ctx);
    });
    expect(first.status).toBe(201);
    const record = await recordOf(operationId);
    expect(record).toMatchObject({ state: "SUCCEEDED", generation: 1 });
    expect(record.events.map((e) => e.kind)).toEqual(["ACCEPTED", "COMPLETED"]);
    expect(new Set(record.events.map((e) => e.caller))).toEqual(new Set(["orders-service"]));
    expect(await orderCount(operationId)).toBe(1);

    // The coordinator reads it as its own: same tables, same key ring.
    const client = new CoordinatorClient({ baseUrl: coordinator.baseUrl, token: coordinator.tokens.gateway });
    try {
      const looked = await client.lookup({ ref: { tenant: "acme", operationId }, subject: alice });
      expect(looked.state).toBe("SUCCEEDED");
      expect(Buffer.from(looked.snapshot!.body).toString()).toBe(Buffer.from(first.body).toString());
    } finally {
      client.close();
    }
  });

  it("replays a retry without running the handler, and refuses the key with another payload (422)", async () => {
    const key = randomUUID();
    const first = await run(key, createOrder);
    const replay = await run(key, async () => {
      throw new Error("a replay never runs the handler");
    });
    expect(replay.status).toBe(201);
    expect(replay.headers).toContainEqual(["idempotent-replayed", "true"]);
    expect(Buffer.from(replay.body).toString()).toBe(Buffer.from(first.body).toString());

    const conflict = await run(
      key,
      async () => {
        throw new Error("a conflict never runs the handler");
      },
      { amount: 11 },
    );
    expect(conflict.status).toBe(422);
    expect(problem(conflict).type).toMatch(/payload-conflict$/);
  });

  it("answers a duplicate of a request still running 409, or waits for it and replays its answer", async () => {
    const key = randomUUID();
    const held = heldHandler();
    const first = run(key, held.handler);
    const owner = await held.inside;

    const busy = await run(
      key,
      async () => {
        throw new Error("a duplicate never runs the handler");
      },
      { route: { waitForOwnerMs: 0 } },
    );
    expect(busy.status).toBe(409);
    expect(problem(busy).operationId).toBe(owner.operationId);

    const waiting = run(
      key,
      async () => {
        throw new Error("a duplicate never runs the handler");
      },
      { route: { waitForOwnerMs: 10_000 } },
    );
    held.release();
    expect((await first).status).toBe(201);
    const waited = await waiting;
    expect(waited.status).toBe(201);
    expect(waited.headers).toContainEqual(["idempotent-replayed", "true"]);
    expect(await orderCount(owner.operationId)).toBe(1);
  });

  it("records declared and undeclared effects with their stable downstream keys, resolved with the Complete", async () => {
    const key = randomUUID();
    let operationId = "";
    const seen: string[] = [];
    const answer = await run(
      key,
      async (ctx) => {
        operationId = ctx.operationId;
        await ctx.effect("card.charge", "cards", async (downstream) => seen.push(downstream), { resolveWithComplete: true });
        await ctx.effect("receipt.send", "mailer", async (downstream) => seen.push(downstream));
        return createOrder(ctx);
      },
      { route: { effects: [{ effect: "card.charge", provider: "cards" }] } },
    );
    expect(answer.status).toBe(201);
    expect(seen).toEqual([downstreamKey("acme", operationId, "card.charge"), downstreamKey("acme", operationId, "receipt.send")]);
    const { rows } = await t.pool.query("SELECT effect, status, downstream_key FROM idem_effect_attempt WHERE operation_id = $1 ORDER BY attempt_number", [operationId]);
    expect(rows).toEqual([
      { effect: "card.charge", status: "CONFIRMED", downstream_key: seen[0] },
      { effect: "receipt.send", status: "CONFIRMED", downstream_key: seen[1] },
    ]);
    expect((await recordOf(operationId)).state).toBe("SUCCEEDED");
  });

  it("rolls the business rows back with a refused completion; the operation, whose effect is unknown, is never run again", async () => {
    const key = randomUUID();
    let operationId = "";
    const answer = await run(key, async (ctx) => {
      operationId = ctx.operationId;
      await ctx.effect("card.charge", "cards", () => Promise.reject(new Error("timeout"))).catch(() => undefined);
      return createOrder(ctx);
    });
    expect(answer.status).toBe(500);
    expect(await orderCount(operationId)).toBe(0);
    expect((await recordOf(operationId)).state).toBe("UNKNOWN");
    const retry = await run(
      key,
      async () => {
        throw new Error("an UNKNOWN operation never runs again");
      },
      { route: { waitForOwnerMs: 0 } },
    );
    expect(retry.status).toBe(409);
  });

  it("releases when the handler fails before any effect, so that the retry runs once and commits once", async () => {
    const key = randomUUID();
    let runs = 0;
    let operationId = "";
    const handler = async (ctx: IdempotencyContext) => {
      operationId = ctx.operationId;
      if (++runs === 1) await ctx.transaction(() => Promise.reject(new Error("deadlock detected")));
      return createOrder(ctx);
    };
    expect((await run(key, handler)).status).toBe(503);
    expect((await recordOf(operationId)).state).toBe("RESERVED");
    expect((await run(key, handler)).status).toBe(201);
    expect(await orderCount(operationId)).toBe(1);
    expect(runs).toBe(2);
  });
});

describe("the policies, modes and grants the coordinator applies", () => {
  const refused = async (operation: string, options: { subject?: typeof alice } = {}) => {
    const before = await recordsOfOperation(operation);
    const answer = await run(
      randomUUID(),
      async () => {
        throw new Error("a refused request never runs the handler");
      },
      { route: { operation }, ...options },
    );
    // Nothing of a refused request is stored.
    expect(await recordsOfOperation(operation)).toBe(before);
    return answer;
  };

  it("shadow mode records the decision but runs the handler for a retry too", async () => {
    const key = randomUUID();
    const contexts: IdempotencyContext[] = [];
    const handler = async (ctx: IdempotencyContext) => {
      contexts.push(ctx);
      return toHttpResponse({ status: 201, json: { run: contexts.length } });
    };
    expect((await run(key, handler, { route: { operation: "orders.shadow" } })).status).toBe(201);
    expect((await run(key, handler, { route: { operation: "orders.shadow" } })).status).toBe(201);
    expect(contexts.map((c) => [c.decision, c.enforced])).toEqual([
      ["ACCEPTED", false],
      ["REPLAY", false],
    ]);
    expect((await recordOf(contexts[0]!.operationId)).state).toBe("SUCCEEDED");
  });

  it("a draining operation accepts nothing new (503)", async () => {
    expect(problem(await refused("orders.drain")).type).toMatch(/operation-draining$/);
  });

  it("holds each principal to its quota of unfinished records (429)", async () => {
    const held = heldHandler(async () => toHttpResponse({ status: 201, json: {} }));
    const first = run(randomUUID(), held.handler, { route: { operation: "orders.quota" } });
    await held.inside;
    expect(problem(await refused("orders.quota")).type).toMatch(/too-many-pending-requests$/);
    held.release();
    expect((await first).status).toBe(201);
  });

  it("refuses a deployment whose writer epoch was fenced out (503)", async () => {
    expect(problem(await refused("orders.epoch")).type).toMatch(/coordinator-unavailable$/);
  });

  it("acts for its granted tenants only, and its role sees no row outside its transaction's tenant", async () => {
    expect(problem(await refused("payments.create", { subject: { tenant: "globex", principal: "gina" } })).type).toMatch(/gateway-misconfigured$/);
    // Row-level security binds the service's role: unbound, it sees none of the records above.
    const { rows } = await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record");
    expect(rows[0]!.n).toBe(0);
    expect(await recordsOfOperation("payments.create")).toBeGreaterThan(0);
  });

  it("answers EXPIRED once the coordinator's sweep made a tombstone of the record, and still refuses another payload", async () => {
    const key = randomUUID();
    let operationId = "";
    const brief = { route: { operation: "orders.brief" } };
    expect((await run(key, async (ctx) => ((operationId = ctx.operationId), createOrder(ctx)), brief)).status).toBe(201);
    await until(async () => {
      await sweepRetention(t.db, { batchSize: 100, caller: "test-sweep" });
      const { rows } = await t.pool.query("SELECT 1 FROM idem_record WHERE operation_id = $1 AND tombstoned_at IS NOT NULL", [operationId]);
      return rows.length === 1;
    }, "the sweep to make a tombstone of the record");
    const never = async () => {
      throw new Error("a tombstone never runs the handler");
    };
    expect((await run(key, never, brief)).status).toBe(410);
    expect((await run(key, never, { ...brief, amount: 99 })).status).toBe(422);
  });
});

describe("recovery of a co-located record", () => {
  it("is the coordinator's, as for a record made over RPC: its recoverer makes it UNKNOWN, a recovery worker settles it", async () => {
    const key = randomUUID();
    // The owner goes silent after its charge: accepted and charged, never finished.
    const admission = await gateway.admit({ ...route, effects: [{ effect: "card.charge", provider: "cards" }] }, alice, orderRequest(key));
    if (!admission.run) throw new Error(`not accepted: ${admission.response.status}`);
    const ctx = admission.context;
    await ctx.effect("card.charge", "cards", async () => "ch_1", { handle: (c) => c, resolveWithComplete: true });
    ctx.stopLease();
    await expireLease(t.pool, ctx.operationId);
    await recoverExpiredLeases(t.db, { batchSize: 100, caller: "test-recoverer" });
    expect((await recordOf(ctx.operationId)).state).toBe("UNKNOWN");

    const client = new CoordinatorClient({ baseUrl: coordinator.baseUrl, token: coordinator.tokens.worker });
    const worker = new RecoveryWorker({
      client,
      tenant: "acme",
      logger: { warn: () => undefined, error: () => undefined },
      resolvers: {
        "payments.create": async (recovering) => {
          const attempt = recovering.latestAttempt("card.charge")!;
          await recovering.resolve({ attemptNumber: attempt.attemptNumber, status: "CONFIRMED", providerHandle: "ch_1" });
          await recovering.completeWith({ status: 201, json: { charge: "ch_1" } });
        },
      },
    });
    try {
      // Other tests' UNKNOWN records are recovered on the same pass.
      expect((await worker.runOnce()).completed).toBeGreaterThanOrEqual(1);
    } finally {
      client.close();
    }
    const record = await recordOf(ctx.operationId);
    expect(record).toMatchObject({ state: "SUCCEEDED", generation: 2 });
    expect(record.events.map((e) => e.kind)).toEqual(["ACCEPTED", "EFFECT_RECORDED", "UNKNOWN", "RECOVERY_CLAIMED", "EFFECT_RESOLVED", "COMPLETED"]);
    const replay = await run(key, async () => {
      throw new Error("a settled operation never runs again");
    });
    expect(JSON.parse(Buffer.from(replay.body).toString())).toEqual({ charge: "ch_1" });
  });
});
