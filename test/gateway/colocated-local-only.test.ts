import { randomUUID } from "node:crypto";
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ColocatedRegistry } from "../../src/colocated/index.js";
import { downstreamKey } from "../../src/contract/effects.js";
import { CoordinatorClient, IdempotencyGateway, toHttpResponse, type HttpResponse, type IdempotencyContext } from "../../src/gateway/index.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { startTestServer, type TestServer } from "../support/server.js";
import { useServiceRole } from "../support/service-role.js";
import { until } from "../support/wait.js";
import { CREATE_ORDERS, createOrder, orderRequest } from "./orders.js";

/**
 * A local-only route in co-located mode: Reserve, the business rows, the
 * local effects' attempts and the terminal state in one transaction of the
 * service's own pool, committed together or rolled back together.
 */

const t = useTestDatabase();
const service = useServiceRole(t);
let coordinator: TestServer;
let pool: pg.Pool;
let colocated: ColocatedRegistry;
let gateway: IdempotencyGateway;
const alice = { tenant: "acme", principal: "alice" };
const route = { operation: "payments.create", apiRevision: 1, localOnly: true };
const quiet = { warn: () => undefined, error: () => undefined };

beforeAll(async () => {
  coordinator = await startTestServer(t, { operations: [testDocument(), testDocument({ operation: "orders.quota", maxActivePerPrincipal: 1 })] });
  await t.pool.query(CREATE_ORDERS);
  await t.pool.query("CREATE TABLE ledger (entry_key text PRIMARY KEY, amount int NOT NULL)");
  await service.grant("orders", "ledger");
  pool = t.openPool({ role: service.role, max: 6 });
  colocated = await ColocatedRegistry.open({ pool, caller: "orders-service", tenants: ["acme"], snapshotKeys: coordinator.snapshotKeys! });
  // Nothing goes over RPC: the client points at the coordinator, whose metrics would show a call.
  const client = new CoordinatorClient({ baseUrl: "http://127.0.0.1:9", token: "none" });
  gateway = new IdempotencyGateway({ client, colocated, logger: quiet });
});

afterAll(async () => {
  colocated?.stop();
  gateway?.client.close();
  await coordinator?.stop();
});

const never = async (): Promise<HttpResponse> => {
  throw new Error("this request never runs the handler");
};

const run = (key: string, handler: (ctx: IdempotencyContext) => Promise<HttpResponse>, options: { amount?: number; route?: Record<string, unknown> } = {}) =>
  gateway.execute({ ...route, ...options.route }, alice, orderRequest(key, options.amount), handler);

/** The record, its events' kinds and the transactions they were written in, as the owner reads them. */
async function recordOf(operationId: string) {
  const { rows } = await t.pool.query<{ state: string; generation: number }>("SELECT state, generation::int FROM idem_record WHERE operation_id = $1", [operationId]);
  const { rows: events } = await t.pool.query<{ kind: string; txid: string }>("SELECT kind, txid::text FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [operationId]);
  return { ...rows[0], kinds: events.map((e) => e.kind), transactions: new Set(events.map((e) => e.txid)).size };
}
const counts = async (operationId: string) =>
  (
    await t.pool.query<{ records: number; orders: number; attempts: number }>(
      `SELECT (SELECT count(*) FROM idem_record WHERE operation_id = $1)::int AS records,
              (SELECT count(*) FROM orders WHERE operation_id = $1)::int AS orders,
              (SELECT count(*) FROM idem_effect_attempt WHERE operation_id = $1)::int AS attempts`,
      [operationId],
    )
  ).rows[0]!;
const problemType = (response: HttpResponse) => (JSON.parse(Buffer.from(response.body).toString()) as { type: string }).type;

describe("a local-only route: one transaction", () => {
  it("commits the acceptance, the business row and the terminal state in one transaction, seen by nobody before", async () => {
    const key = randomUUID();
    let operationId = "";
    const answer = await run(key, async (ctx) => {
      operationId = ctx.operationId;
      // Not committed yet: another connection does not see the record.
      expect((await counts(ctx.operationId)).records).toBe(0);
      return createOrder(ctx);
    });
    expect(answer.status).toBe(201);
    expect(await recordOf(operationId)).toMatchObject({ state: "SUCCEEDED", generation: 1, kinds: ["ACCEPTED", "COMPLETED"], transactions: 1 });
    expect(await counts(operationId)).toEqual({ records: 1, orders: 1, attempts: 0 });

    const replay = await run(key, never);
    expect(replay.status).toBe(201);
    expect(replay.headers).toContainEqual(["idempotent-replayed", "true"]);
    expect(Buffer.from(replay.body).toString()).toBe(Buffer.from(answer.body).toString());
    expect((await run(key, never, { amount: 12 })).status).toBe(422);
  });

  it("resolves a declared local effect in the same transaction, under its stable downstream key", async () => {
    const key = randomUUID();
    let operationId = "";
    const answer = await run(
      key,
      async (ctx) => {
        operationId = ctx.operationId;
        return toHttpResponse(
          await ctx.transaction(async (tx) => {
            const entry = await ctx.effect("ledger.post", "ledger", async (downstream) => {
              await tx.query("INSERT INTO ledger (entry_key, amount) VALUES ($1, 10)", [downstream]);
              return downstream;
            });
            return { status: 201, json: { entry } };
          }),
        );
      },
      { route: { effects: [{ effect: "ledger.post", provider: "ledger" }] } },
    );
    expect(answer.status).toBe(201);
    const downstream = downstreamKey("acme", operationId, "ledger.post");
    expect(JSON.parse(Buffer.from(answer.body).toString())).toEqual({ entry: downstream });
    expect(await recordOf(operationId)).toMatchObject({ state: "SUCCEEDED", kinds: ["ACCEPTED", "EFFECT_RECORDED", "EFFECT_RESOLVED", "COMPLETED"], transactions: 1 });
    const { rows } = await t.pool.query("SELECT status, downstream_key FROM idem_effect_attempt WHERE operation_id = $1", [operationId]);
    expect(rows).toEqual([{ status: "CONFIRMED", downstream_key: downstream }]);
  });

  it("rolls everything back when the handler fails, leaving no record: the retry runs anew and commits once", async () => {
    const key = randomUUID();
    const operationIds: string[] = [];
    let runs = 0;
    const handler = async (ctx: IdempotencyContext) => {
      operationIds.push(ctx.operationId);
      return toHttpResponse(
        await ctx.transaction(async (tx) => {
          await tx.query("INSERT INTO orders (operation_id, amount) VALUES ($1, 10)", [ctx.operationId]);
          if (++runs === 1) throw new Error("the business failed");
          return { status: 201, json: { run: runs } };
        }),
      );
    };
    const failed = await run(key, handler);
    expect(failed.status).toBe(503);
    expect(problemType(failed)).toMatch(/retryable-failure$/);
    expect(await counts(operationIds[0]!)).toEqual({ records: 0, orders: 0, attempts: 0 });

    expect((await run(key, handler)).status).toBe(201);
    expect(await counts(operationIds[1]!)).toEqual({ records: 1, orders: 1, attempts: 0 });
    expect(await recordOf(operationIds[1]!)).toMatchObject({ state: "SUCCEEDED", generation: 1 });
  });

  it("rolls back a 5xx with nothing possible, and a local effect whose outcome is unknown", async () => {
    const unavailable = randomUUID();
    let first = "";
    const answer = await run(unavailable, async (ctx) => {
      first = ctx.operationId;
      return toHttpResponse(
        await ctx.transaction(async (tx) => {
          await tx.query("INSERT INTO orders (operation_id, amount) VALUES ($1, 10)", [ctx.operationId]);
          return { status: 503, json: { title: "try later" } };
        }),
      );
    });
    expect(answer.status).toBe(503);
    expect(await counts(first)).toEqual({ records: 0, orders: 0, attempts: 0 });

    let second = "";
    const unknown = await run(randomUUID(), async (ctx) => {
      second = ctx.operationId;
      await ctx.effect("ledger.post", "ledger", () => Promise.reject(new Error("lost"))).catch(() => undefined);
      return createOrder(ctx);
    });
    expect(problemType(unknown)).toMatch(/retryable-failure$/);
    expect(await counts(second)).toEqual({ records: 0, orders: 0, attempts: 0 });
  });

  it("keeps a duplicate waiting in the database while the first holds its transaction, then answers it the replay", async () => {
    const key = randomUUID();
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let entered: () => void = () => undefined;
    const inside = new Promise<void>((resolve) => (entered = resolve));
    const first = run(key, async (ctx) => {
      entered();
      await gate;
      return createOrder(ctx);
    });
    await inside;
    const duplicate = run(key, never, { route: { waitForOwnerMs: 0 } });
    // The duplicate's guarded insert waits for the first transaction's lock on the scope.
    await until(async () => {
      const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", [
        `idem-test-${t.schema}`,
      ]);
      return rows[0]!.n === 1;
    }, "the duplicate to wait for the first request's lock");
    release();
    expect((await first).status).toBe(201);
    const replayed = await duplicate;
    expect(replayed.status).toBe(201);
    expect(replayed.headers).toContainEqual(["idempotent-replayed", "true"]);
  });

  it("rolls back a refusal inside the transaction (the quota): nothing of it is stored", async () => {
    const quota = { route: { operation: "orders.quota" } };
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let entered: () => void = () => undefined;
    const inside = new Promise<void>((resolve) => (entered = resolve));
    // An unfinished record of the principal (accepted, not local-only), holding its one place.
    const holder = run(
      randomUUID(),
      async (ctx) => {
        entered();
        await gate;
        return createOrder(ctx);
      },
      { route: { operation: "orders.quota", localOnly: false } },
    );
    await inside;
    const refused = await run(randomUUID(), never, quota);
    expect(refused.status).toBe(429);
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record WHERE operation = 'orders.quota'");
    expect(rows[0]!.n).toBe(1);
    release();
    expect((await holder).status).toBe(201);
    expect((await run(randomUUID(), createOrder, quota)).status).toBe(201);
  });
});
