import { randomUUID } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { missingEngines, startPgBouncer, type LocalPgBouncer } from "../../harness/ha/engines.js";
import { loadConfig, type Config } from "../../src/config.js";
import { CoordinatorClient } from "../../src/gateway/index.js";
import { useTestDatabase } from "../support/database.js";
import { startTestServer, type TestServer } from "../support/server.js";

/**
 * The coordinator behind PgBouncer in transaction mode (deploy/ha/pgbouncer.ini):
 * three replicas share two server connections, and no named statement ever
 * reaches them. PgBouncer comes from Debian's packages; CI installs it.
 */
const missing = missingEngines(["pgbouncer"]);
if (missing.length > 0 && process.env.CI) throw new Error(`CI must install ${missing.join(", ")} (apt-get install -y ${missing.join(" ")})`);

const POOL_SIZE = 2;
const t = useTestDatabase();

/** The coordinator's settings behind the pooler; `preparedStatements` forced on shows what the test would catch. */
function pooledConfig(url: string, preparedStatements = false): Partial<Config> {
  const config = loadConfig({ DATABASE_URL: url, IDEM_DB_POOLER: "transaction", IDEM_MIGRATE_ON_BOOT: "false", IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: "true" });
  return { db: { ...config.db, preparedStatements }, migrateOnBoot: false };
}

/** What every server connection of the pooler holds prepared: each held by a transaction of its own at once, so that each is seen. */
async function preparedOnServerConnections(bouncer: LocalPgBouncer, url: string): Promise<string[]> {
  const clients = Array.from({ length: POOL_SIZE }, () => new pg.Client({ connectionString: bouncer.through(url) }));
  try {
    await Promise.all(clients.map((c) => c.connect()));
    const seen = await Promise.all(
      clients.map(async (c) => {
        await c.query("BEGIN");
        const { rows } = await c.query<{ name: string }>("SELECT name FROM pg_prepared_statements");
        return rows.map((r) => r.name);
      }),
    );
    return seen.flat();
  } finally {
    await Promise.all(clients.map((c) => c.end().catch(() => undefined)));
  }
}

describe.skipIf(missing.length > 0)("the coordinator behind PgBouncer in transaction mode", () => {
  let bouncer: LocalPgBouncer;
  const servers: TestServer[] = [];

  beforeAll(async () => {
    bouncer = await startPgBouncer({ serverUrl: t.url, poolSize: POOL_SIZE });
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop()));
    await bouncer?.stop();
  });

  const operation = (client: CoordinatorClient, key: string, amount: number) =>
    client.reserve({
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: key,
      parts: { method: "POST", path: "/v1/payments", query: "", mediaType: "application/json", headers: [], body: new TextEncoder().encode(JSON.stringify({ amount })) },
      claim: true,
    });

  it("serves three replicas over two server connections, each decision exact, with no named statement on any connection", async () => {
    const url = bouncer.through(t.url);
    servers.push(await startTestServer(t, { databaseUrl: url, config: pooledConfig(url) }));
    servers.push(await startTestServer(t, { databaseUrl: url, config: pooledConfig(url), replicaOf: servers[0] }));
    servers.push(await startTestServer(t, { databaseUrl: url, config: pooledConfig(url), replicaOf: servers[0] }));
    const client = new CoordinatorClient({ baseUrl: servers.map((s) => s.baseUrl), token: servers[0]!.tokens.gateway, connections: 6 });
    try {
      const keys = Array.from({ length: 120 }, () => randomUUID());
      // Concurrent new keys: each accepted once, completed, then replayed; a changed payload conflicts.
      const accepted = await Promise.all(keys.map((key, i) => operation(client, key, i)));
      expect(accepted.map((r) => r.decision)).toEqual(keys.map(() => "ACCEPTED"));
      await Promise.all(
        accepted.map((r) =>
          client.complete({
            ref: { tenant: "acme", operationId: r.operationId },
            generation: r.generation,
            outcome: "SUCCEEDED",
            snapshot: { statusCode: 201, mediaType: "application/json", location: "", businessVersion: "", headers: [], body: new TextEncoder().encode("{}") },
          }),
        ),
      );
      const again = await Promise.all(keys.map((key, i) => operation(client, key, i)));
      expect(again.map((r) => r.decision)).toEqual(keys.map(() => "REPLAY"));
      expect(again.map((r) => r.operationId)).toEqual(accepted.map((r) => r.operationId));
      const changed = await Promise.all(keys.slice(0, 10).map((key) => operation(client, key, -1)));
      expect(changed.map((r) => r.decision)).toEqual(keys.slice(0, 10).map(() => "PAYLOAD_CONFLICT"));

      // The replicas' connections are PgBouncer's clients; PostgreSQL saw only the pool's few.
      const clients = (await bouncer.admin("SHOW CLIENTS")).filter((c) => c.database === new URL(t.url).pathname.slice(1));
      const serverConnections = (await bouncer.admin("SHOW SERVERS")).filter((c) => c.database === new URL(t.url).pathname.slice(1));
      expect(clients.length).toBeGreaterThan(3 * POOL_SIZE);
      expect(serverConnections.length).toBeLessThanOrEqual(POOL_SIZE);
      expect(await preparedOnServerConnections(bouncer, t.url)).toEqual([]);
    } finally {
      client.close();
    }
  });

  it("would be caught sending named statements: they stay prepared on the shared server connections", async () => {
    // The check above is only worth something if it sees named statements when they are sent.
    const url = bouncer.through(t.url);
    let named: TestServer | undefined;
    try {
      named = await startTestServer(t, { databaseUrl: url, config: pooledConfig(url, true), replicaOf: servers[0] });
    } catch (error) {
      // Its start may already fail of it: a second client connection handed the server connection
      // where the first prepared a statement finds that statement there.
      expect((error as Error).message).toMatch(/prepared statement "idem_\w+" already exists/);
    }
    if (named) {
      servers.push(named);
      const client = new CoordinatorClient({ baseUrl: named.baseUrl, token: named.tokens.gateway, retry: { attempts: 1 } });
      try {
        await Promise.allSettled(Array.from({ length: 20 }, () => operation(client, randomUUID(), 1)));
      } finally {
        client.close();
      }
    }
    const prepared = await preparedOnServerConnections(bouncer, t.url);
    expect(prepared.filter((name) => name.startsWith("idem_")).length).toBeGreaterThan(0);
  });
});
