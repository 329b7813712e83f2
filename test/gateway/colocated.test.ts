import { randomUUID } from "node:crypto";
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ColocatedRegistry, CommitUnknownError } from "../../src/colocated/index.js";
import { CoordinatorClient, IdempotencyGateway, toHttpResponse, type HttpResponse, type IdempotencyContext } from "../../src/gateway/index.js";
import { interceptedPool, useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";
import { CREATE_ORDERS, orderRequest } from "./orders.js";

const t = useTestDatabase();
const coordinator = useTestServer(t, { operations: [testDocument({ operation: "payments.create" })] });
let client: CoordinatorClient;
let colocated: ColocatedRegistry;
let gateway: IdempotencyGateway;
const alice = { tenant: "acme", principal: "alice" };
const route = { operation: "payments.create", apiRevision: 1 };

beforeAll(async () => {
  client = coordinator.sdkClient();
  // The service's pool reaches the registry's tables (the same schema here).
  // The coordinator's key ring: bodies completed here are sealed as the coordinator seals them, and open there.
  colocated = await ColocatedRegistry.open({
    pool: t.openPool(),
    caller: "orders-service",
    tenants: ["acme"],
    operations: ["payments.create"],
    snapshotKeys: coordinator.snapshotKeys!,
  });
  gateway = new IdempotencyGateway({ client, colocated });
  await t.pool.query(CREATE_ORDERS);
});

afterAll(async () => {
  colocated?.stop();
});

const orderRows = async (operationId: string) => (await t.pool.query<Record<string, unknown>>("SELECT * FROM orders WHERE operation_id = $1", [operationId])).rows;
const recordOf = (key: string) => client.lookup({ scope: { subject: alice, operation: "payments.create", apiRevision: 1, idempotencyKey: key } });

/** The core without any framework: admit, run, finish. */
const run = (key: string, handler: (ctx: IdempotencyContext) => Promise<HttpResponse>, amount = 10) => gateway.execute(route, alice, orderRequest(key, amount), handler);

describe("co-located completion", () => {
  it("commits the business row and the terminal state in one transaction", async () => {
    const key = randomUUID();
    let operationId = "";
    const first = await run(key, async (ctx) => {
      operationId = ctx.operationId;
      const response = await ctx.transaction(async (tx) => {
        const { rows } = await tx.query<{ id: string }>("INSERT INTO orders (operation_id, amount) VALUES ($1, $2) RETURNING id", [
          ctx.operationId,
          ctx.json<{ amount: number }>().amount,
        ]);
        // Inside the transaction the record is still EXECUTING for everyone else.
        expect((await recordOf(key)).state).toBe("EXECUTING");
        const { id } = rows[0]!;
        return { status: 201, headers: { location: `/v1/orders/${id}` }, json: { id } };
      });
      expect(ctx.completedWithin?.outcome).toBe("SUCCEEDED");
      return toHttpResponse(response);
    });

    expect(first.status).toBe(201);
    expect(await orderRows(operationId)).toHaveLength(1);
    const record = await recordOf(key);
    expect(record.state).toBe("SUCCEEDED");
    expect(Buffer.from(record.snapshot!.body).toString()).toBe(Buffer.from(first.body).toString());
    const replay = await run(key, async () => {
      throw new Error("a replay never runs the handler");
    });
    expect(replay.status).toBe(201);
    expect(replay.headers).toContainEqual(["idempotent-replayed", "true"]);
  });

  it("rolls the business row back with the completion when the registry refuses it", async () => {
    const key = randomUUID();
    let operationId = "";
    let refusal: unknown;
    const answer = await run(key, async (ctx) => {
      operationId = ctx.operationId;
      // A charge whose outcome is unknown: the operation cannot complete yet.
      await ctx
        .effect("card.charge", "cards", async () => {
          throw new Error("timeout");
        })
        .catch(() => undefined);
      try {
        await ctx.transaction(async (tx) => {
          await tx.query("INSERT INTO orders (operation_id, amount) VALUES ($1, 10)", [ctx.operationId]);
          return { status: 201, json: { ok: true } };
        });
      } catch (error) {
        refusal = error;
        throw error;
      }
      return toHttpResponse({ status: 201, json: { ok: true } });
    });

    expect((refusal as { reason?: string }).reason).toBe("UNRESOLVED_EFFECTS");
    expect(answer.status).toBe(500);
    expect(await orderRows(operationId)).toHaveLength(0);
    // Handed to recovery at once (Abandon): the charge's outcome is unknown.
    const record = await recordOf(key);
    expect(record.state).toBe("UNKNOWN");
    expect(record.effectAttempts).toMatchObject([{ status: "INDETERMINATE" }]);
  });

  it("releases when the transaction fails before any effect, so the retry runs and commits once", async () => {
    const key = randomUUID();
    let attempts = 0;
    let operationId = "";
    const handler = async (ctx: IdempotencyContext) => {
      operationId = ctx.operationId;
      const response = await ctx.transaction(async (tx) => {
        await tx.query("INSERT INTO orders (operation_id, amount) VALUES ($1, 10)", [ctx.operationId]);
        if (++attempts === 1) throw new Error("deadlock detected");
        return { status: 201, json: { attempt: attempts } };
      });
      return toHttpResponse(response);
    };
    const failed = await run(key, handler);
    expect(failed.status).toBe(503);
    expect((await recordOf(key)).state).toBe("RESERVED");
    expect(await orderRows(operationId)).toHaveLength(0);

    const retried = await run(key, handler);
    expect(retried.status).toBe(201);
    expect(await orderRows(operationId)).toHaveLength(1);
    expect((await recordOf(key)).state).toBe("SUCCEEDED");
  });

  it("sends the stored response when the handler answers something else than it committed", async () => {
    const key = randomUUID();
    const answer = await run(key, async (ctx) => {
      await ctx.transaction(async () => ({ status: 201, json: { stored: true } }));
      return toHttpResponse({ status: 200, json: { stored: false } });
    });
    expect(answer.status).toBe(201);
    expect(JSON.parse(Buffer.from(answer.body).toString())).toEqual({ stored: true });
  });
});

describe("co-located sealing", () => {
  it("seals the stored body with the coordinator's key ring, and the coordinator replays it", async () => {
    const key = randomUUID();
    const secret = `card-holder-${randomUUID()}`;
    let operationId = "";
    const first = await run(key, async (ctx) => {
      operationId = ctx.operationId;
      return toHttpResponse(await ctx.transaction(async () => ({ status: 201, json: { secret } })));
    });
    expect(first.status).toBe(201);

    const { rows } = await t.pool.query<{ snapshot_body: Buffer; snapshot_key_id: string }>("SELECT snapshot_body, snapshot_key_id FROM idem_record WHERE operation_id = $1", [
      operationId,
    ]);
    expect(rows[0]?.snapshot_key_id).toBe("test");
    const stored = rows[0]!.snapshot_body;
    expect(stored.length).toBeGreaterThan(0);
    expect(stored.includes(Buffer.from(secret))).toBe(false);
    expect(stored.equals(Buffer.from(first.body))).toBe(false);

    // The coordinator opens it: a lookup and a replay show the plaintext.
    expect(JSON.parse(Buffer.from((await recordOf(key)).snapshot!.body).toString())).toEqual({ secret });
    const replay = await run(key, async () => {
      throw new Error("a replay never runs the handler");
    });
    expect(replay.headers).toContainEqual(["idempotent-replayed", "true"]);
    expect(JSON.parse(Buffer.from(replay.body).toString())).toEqual({ secret });
  });

  it("refuses to open without a key ring unless plaintext is asked for by name", async () => {
    const pool = t.openPool();
    try {
      // @ts-expect-error: the key ring (or the plaintext switch) is required.
      await expect(ColocatedRegistry.open({ pool, caller: "orders-service" })).rejects.toThrow(/snapshotKeys.*allowPlaintextSnapshots/);
      const plaintext = await ColocatedRegistry.open({ pool, caller: "orders-service", allowPlaintextSnapshots: true });
      plaintext.stop();
    } finally {
      await pool.end();
    }
  });
});

/**
 * A pool whose connections, once `arm()` is called, lose the answer to their
 * next COMMIT: `carried` says whether the database carried the COMMIT out
 * first (the answer was lost on its way back) or never got it.
 */
function commitAnswerLost(pool: pg.Pool, failure: { carried: boolean; error: () => Error }) {
  let armed = false;
  const losing = interceptedPool(pool, async (text, _values, send) => {
    if (text !== "COMMIT" || !armed) return send();
    armed = false;
    await send(failure.carried ? undefined : "ROLLBACK");
    throw failure.error();
  });
  return { pool: losing, arm: () => (armed = true) };
}

describe("the business transaction's COMMIT", () => {
  const connectionError = (message: string, fields: { code?: string; syscall?: string } = {}) => Object.assign(new Error(message), fields);

  it("throws the database's refusal at COMMIT as it is: the transaction rolled back", async () => {
    await t.pool.query("CREATE TABLE parcels (id int PRIMARY KEY, parent int REFERENCES parcels (id) DEFERRABLE INITIALLY DEFERRED)");
    const error = await colocated.transaction(async (tx) => tx.query("INSERT INTO parcels VALUES (1, 2)")).catch((e: unknown) => e);
    expect(error).not.toBeInstanceOf(CommitUnknownError);
    expect((error as { code?: string }).code).toBe("23503");
    expect((await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM parcels")).rows[0]?.n).toBe(0);
  });

  it.each([
    { name: "the connection ended while the answer was on its way", carried: true, error: () => connectionError("Connection terminated unexpectedly") },
    { name: "the socket broke before COMMIT reached the server", carried: false, error: () => connectionError("write EPIPE", { code: "EPIPE", syscall: "write" }) },
    { name: "the server shut down", carried: false, error: () => connectionError("terminating connection due to administrator command", { code: "57P01" }) },
  ])("reports an unknown outcome when $name: CommitUnknownError", async ({ carried, error }) => {
    await t.pool.query("CREATE TABLE IF NOT EXISTS shipments (id uuid PRIMARY KEY)");
    const losing = commitAnswerLost(t.openPool(), { carried, error });
    const registry = await ColocatedRegistry.open({ pool: losing.pool, caller: "orders-service", allowPlaintextSnapshots: true });
    try {
      const id = randomUUID();
      losing.arm();
      const failure = await registry.transaction(async (tx) => tx.query("INSERT INTO shipments VALUES ($1)", [id])).catch((e: unknown) => e);
      expect(failure).toBeInstanceOf(CommitUnknownError);
      // Unknown to the caller, not to the database: re-reading tells.
      expect((await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM shipments WHERE id = $1", [id])).rows[0]?.n).toBe(carried ? 1 : 0);
    } finally {
      registry.stop();
      await losing.pool.end();
    }
  });

  it.each([
    { name: "its answer was lost on the way back", carried: true },
    { name: "it never reached the server", carried: false },
  ])("reports an unknown outcome when the COMMIT sent with the Complete fails and $name: CommitUnknownError", async ({ carried }) => {
    const losing = commitAnswerLost(t.openPool(), { carried, error: () => connectionError("Connection terminated unexpectedly") });
    const registry = await ColocatedRegistry.open({ pool: losing.pool, caller: "orders-service", allowPlaintextSnapshots: true });
    try {
      const key = randomUUID();
      const reserved = await registry.lifecycle!.reserve({ ...reserveOf(key), claim: true });
      const ref = { tenant: "acme", operationId: reserved.operationId };
      const snapshot = { statusCode: 201, mediaType: "application/json", location: "", businessVersion: "", headers: [], body: new TextEncoder().encode("{}") };
      losing.arm();
      const failure = await registry
        .transaction(async (tx) => {
          await tx.query("INSERT INTO orders (operation_id, amount) VALUES ($1, 10)", [ref.operationId]);
          return registry.completeAndCommit(tx, { ref, generation: reserved.generation, outcome: "SUCCEEDED", snapshot });
        })
        .catch((e: unknown) => e);
      expect(failure).toBeInstanceOf(CommitUnknownError);
      // The terminal state and the row went with that COMMIT, or neither did.
      expect((await recordOf(key)).state).toBe(carried ? "SUCCEEDED" : "EXECUTING");
      expect(await orderRows(ref.operationId)).toHaveLength(carried ? 1 : 0);
    } finally {
      registry.stop();
      await losing.pool.end();
    }
  });
});

/** A Reserve of `key` for alice, as the gateway sends it. */
const reserveOf = (key: string) => ({
  subject: alice,
  operation: "payments.create",
  apiRevision: 1,
  idempotencyKey: key,
  parts: { method: "POST", path: "/v1/orders", query: "", mediaType: "application/json", headers: [], body: new TextEncoder().encode('{"amount":10}') },
});
