import { randomBytes, randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startChild, type Child } from "../../harness/lib/process.js";
import { parseKeyring } from "../../src/crypto/sealing.js";
import { CoordinatorClient, CoordinatorError } from "../../src/gateway/index.js";
import { useTestDatabase } from "../support/database.js";
import { startTestServer, type TestServer } from "../support/server.js";
import { useServiceRole } from "../support/service-role.js";
import { until } from "../support/wait.js";

// A service whose whole lifecycle runs in its own process (co-located), killed
// with SIGKILL at its failpoints: between its acceptance and its business
// COMMIT, and after that COMMIT. What it leaves is recovered by the
// coordinator (its recoverer, then a retry's takeover) exactly as what a
// service calling it over RPC leaves at the same points: the same decisions,
// the same events, the same final state, one order row.

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const t = useTestDatabase();
const service = useServiceRole(t);
const keyRing = JSON.stringify({ active: "faults", keys: { faults: randomBytes(32).toString("base64") } });
let coordinator: TestServer;
let lookups: CoordinatorClient;
const alice = { tenant: "acme", principal: "alice" };
type Mode = "rpc" | "colocated" | "local-only";

beforeAll(async () => {
  coordinator = await startTestServer(t, { config: { recovererIntervalMs: 100, snapshotKeys: parseKeyring(JSON.parse(keyRing)) } });
  lookups = new CoordinatorClient({ baseUrl: coordinator.baseUrl, token: coordinator.tokens.gateway });
  await t.pool.query("CREATE TABLE orders (id serial PRIMARY KEY, operation_id uuid UNIQUE NOT NULL, amount int NOT NULL)");
  await service.grant("orders");
}, 60_000);

afterAll(async () => {
  lookups?.close();
  await coordinator?.stop();
});

/** The orders service in a process of its own (test/faults/orders-service.ts), armed at `failpoint` when given. */
async function startService(mode: Mode, failpoint?: string): Promise<{ child: Child; url: string }> {
  // Co-located, its connections act as the service's role, bound by the registry's row-level security.
  const role = mode === "rpc" ? "" : ` -c role=${service.role}`;
  const child = startChild({
    command: process.execPath,
    args: ["--import", "tsx", "test/faults/orders-service.ts"],
    cwd: ROOT,
    env: {
      ...process.env,
      DATABASE_URL: t.url,
      PGOPTIONS: `-c search_path=${t.schema}${role}`,
      COORDINATOR_URL: coordinator.baseUrl,
      GATEWAY_TOKEN: coordinator.tokens.gateway,
      IDEM_SNAPSHOT_KEYS: keyRing,
      ORDERS_MODE: mode,
      IDEM_FAILPOINTS: failpoint ? `${failpoint}=kill` : "",
    },
  });
  await child.printed(/^ready /m, `the orders service (${mode})`);
  return { child, url: /^ready (\S+)/m.exec(child.output())![1]! };
}

const post = async (url: string, key: string) => {
  const res = await fetch(`${url}/v1/orders`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": key }, body: '{"amount":25}' });
  return { status: res.status, text: await res.text() };
};

/** The record of `key` (undefined when there is none), its events, and its order rows. */
async function recordOf(key: string) {
  let operationId: string;
  try {
    operationId = (await lookups.lookup({ scope: { subject: alice, operation: "payments.create", apiRevision: 1, idempotencyKey: key } })).operationId;
  } catch (error) {
    if (error instanceof CoordinatorError && error.reason === "NOT_FOUND") return undefined;
    throw error;
  }
  const { rows } = await t.pool.query<{ state: string; generation: number }>("SELECT state, generation::int FROM idem_record WHERE operation_id = $1", [operationId]);
  const { rows: events } = await t.pool.query<{ kind: string }>("SELECT kind FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [operationId]);
  const { rows: orders } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM orders WHERE operation_id = $1", [operationId]);
  return { ...rows[0]!, events: events.map((e) => e.kind), orders: orders[0]!.n };
}

/**
 * Kills the service of `mode` at `failpoint` in the middle of a request, starts
 * it again, lets the coordinator's recoverer find what it left (a lease that
 * ended), and retries like a client until a final answer. Returns what the
 * crash left and how it ended.
 */
async function killedAt(mode: Mode, failpoint: "gateway.business.before-commit" | "gateway.business.after-commit") {
  const key = randomUUID();
  const dying = await startService(mode, failpoint);
  await expect(post(dying.url, key)).rejects.toThrow();
  await dying.child.exited;
  expect(dying.child.process.signalCode).toBe("SIGKILL");
  const left = await recordOf(key);
  if (left && (left.state === "EXECUTING" || left.state === "RESERVED")) {
    await until(async () => (await recordOf(key))?.events.includes("LEASE_EXPIRED") === true, "the coordinator's recoverer to find the ended lease");
  }
  const restarted = await startService(mode);
  try {
    const answer = await post(restarted.url, key);
    const again = await post(restarted.url, key);
    expect(again).toEqual(answer);
    return { left: left && { state: left.state, orders: left.orders }, status: answer.status, final: await recordOf(key) };
  } finally {
    await restarted.child.stop("SIGKILL");
  }
}

describe("a co-located service killed mid-request is recovered exactly as one over RPC", () => {
  it("killed between its acceptance and its business COMMIT: the lease ends, the retry takes it over and runs it once", async () => {
    const rpc = await killedAt("rpc", "gateway.business.before-commit");
    expect(rpc).toEqual({
      left: { state: "EXECUTING", orders: 0 },
      status: 201,
      final: { state: "SUCCEEDED", generation: 2, events: ["ACCEPTED", "LEASE_EXPIRED", "TAKEOVER", "COMPLETED"], orders: 1 },
    });
    expect(await killedAt("colocated", "gateway.business.before-commit")).toEqual(rpc);
  }, 90_000);

  it("killed after its business COMMIT: the terminal state was committed with the row, and the retry replays it", async () => {
    const rpc = await killedAt("rpc", "gateway.business.after-commit");
    expect(rpc).toEqual({
      left: { state: "SUCCEEDED", orders: 1 },
      status: 201,
      final: { state: "SUCCEEDED", generation: 1, events: ["ACCEPTED", "COMPLETED"], orders: 1 },
    });
    expect(await killedAt("colocated", "gateway.business.after-commit")).toEqual(rpc);
  }, 90_000);

  it("a local-only route killed before its one COMMIT leaves nothing, and the retry runs it once; after it, the retry replays", async () => {
    expect(await killedAt("local-only", "gateway.business.before-commit")).toEqual({
      left: undefined,
      status: 201,
      final: { state: "SUCCEEDED", generation: 1, events: ["ACCEPTED", "COMPLETED"], orders: 1 },
    });
    expect(await killedAt("local-only", "gateway.business.after-commit")).toEqual({
      left: { state: "SUCCEEDED", orders: 1 },
      status: 201,
      final: { state: "SUCCEEDED", generation: 1, events: ["ACCEPTED", "COMPLETED"], orders: 1 },
    });
  }, 90_000);
});
