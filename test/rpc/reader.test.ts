import net from "node:net";
import { create } from "@bufbuild/protobuf";
import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import pg from "pg";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../src/config.js";
import { Health, HealthCheckResponse_ServingStatus as Status } from "../../src/gen/grpc/health/v1/health_pb.js";
import { AdminService, OperationMode } from "../../src/gen/idempotency/v1/admin_pb.js";
import { ClaimMode, CoordinatorService, Decision } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema, Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { consoleClient } from "../support/console.js";
import { newKey } from "../support/fixtures.js";
import { wireReason } from "../support/refusals.js";
import { driveToUnknown, startTestServer, type TestServer } from "../support/server.js";
import { until } from "../support/wait.js";

/**
 * IDEM_DB_READ_URL: the reads that decide nothing go to a hot standby, and
 * everything else to the primary. The standby here is a second migrated
 * schema of the same database, reached with `default_transaction_read_only`
 * on (so that any write through it fails, as on a standby), which holds what
 * `replay()` copied into it: a read that answers what only the standby holds
 * (or misses what only the primary holds) came from the standby.
 */
let primary: TestDatabase;
let standby: TestDatabase;

beforeAll(async () => {
  [primary, standby] = await Promise.all([createTestDatabase(), createTestDatabase()]);
});
afterAll(async () => {
  await Promise.all([primary?.drop(), standby?.drop()]);
});

/** The standby's connection string: its schema, read-only, on `port` (default: the database's own). */
function standbyUrl(port?: number): string {
  const url = new URL(primary.url);
  if (port !== undefined) url.host = `127.0.0.1:${port}`;
  url.searchParams.set("options", `-c search_path=${standby.schema} -c default_transaction_read_only=on`);
  return url.toString();
}

/** The registry's tables, in an order that inserts referenced rows first. */
const TABLES = ["idem_policy", "idem_operation", "idem_record", "idem_effect_attempt", "idem_event", "idem_job_lease", "idem_quota_gate"];

/** The standby replays everything the primary committed so far (triggers off, as in a replica's apply). */
async function replay(): Promise<void> {
  const client = await primary.pool.connect();
  try {
    await client.query("BEGIN");
    await client.query("SET LOCAL session_replication_role = replica");
    await client.query(`TRUNCATE ${TABLES.map((table) => `${standby.schema}.${table}`).join(", ")}`);
    for (const table of TABLES) {
      await client.query(`INSERT INTO ${standby.schema}.${table} OVERRIDING SYSTEM VALUE SELECT * FROM ${primary.schema}.${table}`);
    }
    await client.query("COMMIT");
  } catch (error) {
    await client.query("ROLLBACK");
    throw error;
  } finally {
    client.release();
  }
}

/** A standby that has replayed nothing yet. */
async function forget(): Promise<void> {
  await primary.pool.query(`TRUNCATE ${TABLES.map((table) => `${standby.schema}.${table}`).join(", ")}`);
}

const as = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });
const subject = { tenant: "acme", principal: "alice" };

function clients(server: TestServer): { coordinator: Client<typeof CoordinatorService>; admin: Client<typeof AdminService> } {
  const transport = createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" });
  return { coordinator: createClient(CoordinatorService, transport), admin: createClient(AdminService, transport) };
}

function reserve(server: TestServer, key: string, claim = false) {
  return clients(server).coordinator.reserve(
    {
      subject,
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: key,
      claim,
      request: {
        case: "parts",
        value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode('{"amount":10}') }),
      },
    },
    as(server.tokens.gateway),
  );
}

/** The record's state as Lookup (by id, as its gateway) answers it; "NOT_FOUND" when it says there is none. */
async function lookedUp(server: TestServer, operationId: string): Promise<string> {
  const lookup = clients(server).coordinator.lookup({ by: { case: "ref", value: { tenant: "acme", operationId } }, subject }, as(server.tokens.gateway));
  const reason = await wireReason(lookup.then(() => undefined));
  return reason ?? RecordState[(await lookup).record!.state];
}

async function readiness(server: TestServer): Promise<{ status: number; body: { reader?: boolean } }> {
  const response = await fetch(`${server.adminUrl}/readyz`);
  return { status: response.status, body: (await response.json()) as { reader?: boolean } };
}

describe("with a reader", () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer(primary, { config: { readDatabaseUrl: standbyUrl(), recovererIntervalMs: 200 } });
  });
  afterAll(async () => {
    await server?.stop();
  });
  beforeEach(forget);

  it("is a connection on which any write fails, as on a standby", async () => {
    const client = new pg.Client({ connectionString: standbyUrl() });
    await client.connect();
    try {
      await expect(client.query("INSERT INTO idem_job_lease (job, holder, expires_at) VALUES ('x', 'y', now())")).rejects.toMatchObject({ code: "25006" });
    } finally {
      await client.end();
    }
  });

  it("decides and writes on the primary, and looks records up on the standby as far as it has replayed", async () => {
    const key = newKey();
    const reserved = await reserve(server, key);
    expect(reserved.decision).toBe(Decision.ACCEPTED);
    const operationId = reserved.operationId;
    // Committed on the primary, not replayed yet: the standby has no such record.
    expect(await lookedUp(server, operationId)).toBe("NOT_FOUND");
    await replay();
    expect(await lookedUp(server, operationId)).toBe("RESERVED");

    const { coordinator } = clients(server);
    const ref = { tenant: "acme", operationId };
    await coordinator.claim({ ref, mode: ClaimMode.OWNER, generation: 1n }, as(server.tokens.gateway));
    await coordinator.complete(
      { ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201, mediaType: "application/json", body: new TextEncoder().encode('{"id":"p_1"}') } },
      as(server.tokens.gateway),
    );
    // Right after Complete the standby still shows the earlier state; Reserve, which reads the primary, already replays.
    expect(await lookedUp(server, operationId)).toBe("RESERVED");
    expect((await reserve(server, key)).decision).toBe(Decision.REPLAY);
    await replay();
    expect(await lookedUp(server, operationId)).toBe("SUCCEEDED");
    const byScope = await coordinator.lookup(
      { by: { case: "scope", value: { subject, operation: "payments.create", apiRevision: 1, idempotencyKey: key } } },
      as(server.tokens.gateway),
    );
    expect(byScope.record?.snapshot?.statusCode).toBe(201);
  });

  it("lists records, policies and switches from the standby; decisions follow the primary's switches", async () => {
    const { admin } = clients(server);
    const policy = () => admin.getPolicy({ operation: "payments.create", apiRevision: 1 }, as(server.tokens.operator));
    expect(await wireReason(policy())).toBe("NOT_FOUND");
    expect((await admin.listPolicies({}, as(server.tokens.operator))).policies).toEqual([]);
    const first = await reserve(server, newKey());
    await replay();
    expect((await policy()).published?.policy?.operation).toBe("payments.create");

    // A switch only the standby has: shown by the listing, never applied to a decision.
    await primary.pool.query(`UPDATE ${standby.schema}.idem_operation SET mode = 'DRAINING'`);
    const controls = await admin.listOperationControls({}, as(server.tokens.allTenantsOperator));
    expect(controls.controls.map((c) => c.mode)).toEqual([OperationMode.DRAINING]);
    const second = await reserve(server, newKey());
    expect(second.decision).toBe(Decision.ACCEPTED);

    // Bound to one tenant, and across tenants (the standby's cross-tenant login).
    for (const token of [server.tokens.operator, server.tokens.allTenantsOperator]) {
      const listed = await admin.listRecords({ states: [RecordState.RESERVED] }, as(token));
      const ids = listed.records.map((r) => r.operationId);
      expect(ids).toContain(first.operationId);
      expect(ids, "committed after the standby's replay").not.toContain(second.operationId);
    }
  });

  it("lists recoverable records from the standby; a claim on a stale listing is refused by the primary", async () => {
    const reserved = await reserve(server, newKey(), true);
    await driveToUnknown(primary, server, reserved.operationId);
    const { coordinator } = clients(server);
    const recoverable = async () => (await coordinator.listRecoverable({}, as(server.tokens.worker))).records.filter((r) => r.record?.operationId === reserved.operationId);
    expect(await recoverable()).toEqual([]);
    await replay();
    const [listed] = await recoverable();
    expect(listed?.claimMode).toBe(ClaimMode.RECOVER);

    const ref = { tenant: "acme", operationId: reserved.operationId };
    const claim = () => coordinator.claim({ ref, mode: ClaimMode.RECOVER, generation: listed!.record!.generation }, as(server.tokens.worker));
    expect((await claim()).generation).toBe(2n);
    // The standby still lists it at generation 1: another worker acting on that listing is turned away.
    expect((await recoverable()).map((r) => r.record?.generation)).toEqual([1n]);
    expect(["STALE_GENERATION", "LEASE_HELD"]).toContain(await wireReason(claim()));
  });

  it("shows the operator console from the standby", async () => {
    const reserved = await reserve(server, newKey());
    const admin = consoleClient(server);
    const call = as(server.tokens.operator);
    const reservedCount = async () => Number((await admin.getRecordCensus({}, call)).states.find((s) => s.state === RecordState.RESERVED)?.records);
    const reservedListed = async () => (await admin.listNewestRecords({ states: [RecordState.RESERVED] }, call)).records.map((r) => r.operationId);
    expect(await reservedCount()).toBe(0);
    expect(await reservedListed()).toEqual([]);
    await replay();
    const { rows } = await primary.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record WHERE state = 'RESERVED'");
    expect(await reservedCount()).toBe(rows[0]!.n);
    expect(await reservedListed()).toContain(reserved.operationId);
  });

  it("reports the reader on /readyz", async () => {
    expect(await readiness(server)).toEqual({ status: 200, body: { status: "ready", serving: true, database: true, reader: true } });
  });
});

/** A TCP proxy in front of PostgreSQL: "refusing" resets every connection and refuses new ones (the standby is gone). */
async function standbyProxy() {
  let refusing = false;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    if (refusing) return client.destroy();
    const upstream = net.connect(Number(new URL(primary.url).port || 5432), new URL(primary.url).hostname);
    for (const [from, to] of [
      [client, upstream],
      [upstream, client],
    ] as const) {
      sockets.add(from);
      from.pipe(to);
      from.on("error", () => to.destroy()).on("close", () => (to.destroy(), sockets.delete(from)));
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  return {
    port,
    set(mode: "forwarding" | "refusing") {
      refusing = mode === "refusing";
      if (refusing) for (const socket of sockets) socket.destroy();
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

describe("when the reader does not answer", () => {
  let proxy: Awaited<ReturnType<typeof standbyProxy>>;
  let server: TestServer;
  beforeAll(async () => {
    await forget();
    proxy = await standbyProxy();
    proxy.set("refusing");
    // Down from the start: the coordinator starts all the same.
    server = await startTestServer(primary, { config: { readDatabaseUrl: standbyUrl(proxy.port), db: { ...loadConfig({}).db, connectTimeoutMs: 500 } } });
  });
  afterAll(async () => {
    await server?.stop();
    await proxy?.close();
  });

  const fallbacks = async () => {
    const text = await (await fetch(`${server.adminUrl}/metrics`)).text();
    return [...text.matchAll(/^idem_db_reader_fallbacks_total\{why="(\w+)"\} (\d+)/gm)].reduce((sum, m) => sum + Number(m[2]), 0);
  };

  it("serves its reads from the primary and stays ready, then reads from it again once it answers", async () => {
    const health = createClient(Health, createGrpcTransport({ baseUrl: server.baseUrl }));
    const { operationId } = await reserve(server, newKey());
    // Not replayed anywhere: only the primary can answer it.
    expect(await lookedUp(server, operationId)).toBe("RESERVED");
    expect(await readiness(server)).toEqual({ status: 200, body: { status: "ready", serving: true, database: true, reader: false } });
    expect((await health.check({ service: "" })).status).toBe(Status.SERVING);
    expect(await fallbacks()).toBeGreaterThan(0);

    proxy.set("forwarding");
    await until(async () => (await readiness(server)).body.reader === true, "readiness to find the reader back", 15_000);
    expect(await lookedUp(server, operationId), "the standby has not replayed it").toBe("NOT_FOUND");

    // Gone while the coordinator runs: the read that meets it first, and every one after, is the primary's.
    proxy.set("refusing");
    expect(await lookedUp(server, operationId)).toBe("RESERVED");
    await until(async () => (await readiness(server)).body.reader === false, "readiness to find the reader gone", 15_000);
    expect(await lookedUp(server, operationId)).toBe("RESERVED");
    expect((await readiness(server)).status).toBe(200);
  }, 60_000);
});

describe("IDEM_DB_READ_URL settings", () => {
  const base = { DATABASE_URL: "postgres://db/registry", IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: "true" };
  const problem = (env: Record<string, string>) => {
    try {
      loadConfig(env);
    } catch (error) {
      expect(error).toBeInstanceOf(ConfigError);
      return (error as Error).message;
    }
    return undefined;
  };

  it("is off unless set, and its cross-tenant login defaults to its own", () => {
    expect(loadConfig(base)).toMatchObject({ readDatabaseUrl: undefined, crossTenantReadDatabaseUrl: undefined });
    expect(loadConfig({ ...base, IDEM_DB_READ_URL: "postgres://standby/registry" })).toMatchObject({
      readDatabaseUrl: "postgres://standby/registry",
      crossTenantReadDatabaseUrl: undefined,
    });
  });

  it("needs DATABASE_URL, and a cross-tenant login of its own where the primary has one", () => {
    expect(problem({ IDEM_DB_READ_URL: "postgres://standby/registry" })).toContain("IDEM_DB_READ_URL: needs DATABASE_URL");
    expect(problem({ ...base, IDEM_CROSS_TENANT_DB_READ_URL: "postgres://standby/registry" })).toContain("IDEM_CROSS_TENANT_DB_READ_URL: needs IDEM_DB_READ_URL");
    expect(problem({ ...base, IDEM_DB_READ_URL: "postgres://standby/registry", IDEM_CROSS_TENANT_DATABASE_URL: "postgres://x@db/registry" })).toContain(
      "IDEM_CROSS_TENANT_DB_READ_URL: required",
    );
    expect(problem({ ...base, IDEM_DB_READ_URL: "mysql://standby" })).toContain("IDEM_DB_READ_URL: must be a postgres:// connection string");
  });
});
