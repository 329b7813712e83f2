import { randomUUID } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import pg from "pg";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { ColocatedRegistry } from "../../src/colocated/index.js";
import { CoordinatorClient, IdempotencyGateway } from "../../src/gateway/index.js";
import { withIdempotency, writeResponse } from "../../src/gateway/node.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";
import { post } from "./helpers.js";
import { CREATE_ORDERS } from "./orders.js";

/**
 * Co-located completion on a service's own node-postgres connections, opened
 * without `pipeline` (as a service opens its pool): the registry's statements
 * must go out one at a time there. A query sent while another is in flight
 * is queued by node-postgres 8 with a deprecation warning, and refused by pg 9.
 */

const t = useTestDatabase();
const coordinator = useTestServer(t, { operations: [testDocument({ operation: "payments.create" })] });
let client: CoordinatorClient;
/** The service's pool: plain node-postgres, no pipelining. */
let servicePool: pg.Pool;
let colocated: ColocatedRegistry;
let http: Server;
let base: string;
const alice = { tenant: "acme", principal: "alice" };

/** Queries sent on a connection while an earlier one on it had not answered yet. */
const overlapping: string[] = [];
/** Wraps a client's `query` to note every query sent while another is in flight on it. */
function watchOverlap(connection: pg.Client | pg.PoolClient): void {
  const send = connection.query.bind(connection) as (...args: unknown[]) => unknown;
  let inFlight = 0;
  (connection as { query: unknown }).query = (...args: unknown[]) => {
    const sent = send(...args);
    if (!(sent instanceof Promise)) return sent;
    if (inFlight > 0) overlapping.push(typeof args[0] === "string" ? args[0] : String((args[0] as { text?: unknown }).text));
    inFlight++;
    return sent.finally(() => inFlight--);
  };
}

/** Warnings the process emitted (node-postgres's deprecation among them). */
const warnings: Error[] = [];
const onWarning = (warning: Error) => warnings.push(warning);

beforeAll(async () => {
  process.on("warning", onWarning);
  client = coordinator.sdkClient();
  servicePool = new pg.Pool({ connectionString: t.url, max: 4, options: `-c search_path=${t.schema}` });
  servicePool.on("connect", watchOverlap);
  colocated = await ColocatedRegistry.open({ pool: servicePool, caller: "orders-service", snapshotKeys: coordinator.snapshotKeys! });
  await t.pool.query(CREATE_ORDERS);

  const gateway = new IdempotencyGateway({ client, colocated });
  const createOrder = withIdempotency(gateway, { operation: "payments.create", apiRevision: 1, subject: () => alice }, async (_req, res, ctx) => {
    const response = await ctx.transaction(async (tx) => {
      const { rows } = await tx.query<{ id: number }>("INSERT INTO orders (operation_id, amount) VALUES ($1, $2) RETURNING id", [
        ctx.operationId,
        ctx.json<{ amount: number }>().amount,
      ]);
      return { status: 201, json: { id: rows[0]!.id } };
    });
    writeResponse(res, response);
  });
  http = createServer((req, res) => void createOrder(req, res));
  await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
});

afterEach(() => {
  overlapping.length = 0;
});

afterAll(async () => {
  process.off("warning", onWarning);
  http?.closeAllConnections();
  await new Promise((resolve) => http?.close(resolve));
  colocated?.stop();
  await servicePool?.end();
});

const recordOf = (key: string) => client.lookup({ scope: { subject: alice, operation: "payments.create", apiRevision: 1, idempotencyKey: key } });
const orderRows = async (operationId: string) => (await t.pool.query<{ amount: number }>("SELECT amount FROM orders WHERE operation_id = $1", [operationId])).rows;
/** The deprecation node-postgres emits (once per process) for a query queued behind a running one. */
const queuedQueryDeprecations = async () => {
  // Process warnings are emitted on the next tick.
  await new Promise((resolve) => setImmediate(resolve));
  return warnings.filter((w) => w.name === "DeprecationWarning" && /already executing a query/.test(w.message));
};

describe("co-located completion on a service's own connections", () => {
  it("sends the registry's statements one at a time on a pool opened without pipelining, and commits them with the business row", async () => {
    const key = randomUUID();
    const answer = await post(base, key, { amount: 25 });

    expect(answer.status).toBe(201);
    const record = await recordOf(key);
    expect(record.state).toBe("SUCCEEDED");
    expect(await orderRows(record.operationId)).toEqual([{ amount: 25 }]);
    expect(overlapping, "no query sent while another was in flight on the same connection").toEqual([]);
    expect(await queuedQueryDeprecations()).toEqual([]);
  });

  it("completes inside a transaction on a plain pg.Client", async () => {
    const key = randomUUID();
    const reserved = await client.reserve({
      subject: alice,
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: key,
      claim: true,
      parts: { method: "POST", path: "/v1/orders", query: "", mediaType: "application/json", headers: [], body: new TextEncoder().encode('{"amount":7}') },
    });
    expect(reserved.decision).toBe("ACCEPTED");

    const connection = new pg.Client({ connectionString: t.url, options: `-c search_path=${t.schema}` });
    await connection.connect();
    watchOverlap(connection);
    try {
      await connection.query("BEGIN");
      await connection.query("INSERT INTO orders (operation_id, amount) VALUES ($1, 7)", [reserved.operationId]);
      const completed = await colocated.complete(connection, {
        ref: { tenant: "acme", operationId: reserved.operationId },
        generation: reserved.generation,
        outcome: "SUCCEEDED",
        snapshot: { statusCode: 201, mediaType: "application/json", location: "", businessVersion: "", headers: [], body: new TextEncoder().encode('{"ok":true}') },
      });
      expect(completed.state).toBe("SUCCEEDED");
      // Not committed yet: the terminal state waits for the business transaction's COMMIT.
      expect((await recordOf(key)).state).toBe("EXECUTING");
      await connection.query("COMMIT");
    } finally {
      await connection.end();
    }

    expect((await recordOf(key)).state).toBe("SUCCEEDED");
    expect(await orderRows(reserved.operationId)).toEqual([{ amount: 7 }]);
    expect(overlapping, "no query sent while another was in flight on the connection").toEqual([]);
    expect(await queuedQueryDeprecations()).toEqual([]);
  });
});
