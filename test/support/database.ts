import { randomBytes } from "node:crypto";
import pg from "pg";
import pino from "pino";
import { afterAll, afterEach, beforeAll, beforeEach, inject } from "vitest";
import { openPool, poolDb, type Db, type PoolSettings } from "../../src/registry/db.js";
import { migrate } from "../../src/registry/migrate.js";

export const silentLogger = pino({ level: "silent" });

/** The role the coordinator serves as (migrations/000007). */
export const SERVER_ROLE = "idem_server";
/** The role of the coordinator's cross-tenant work: jobs and operators' listings (migrations/000010). */
export const CROSS_TENANT_ROLE = "idem_cross_tenant";

/** A migrated schema of its own for one test file, on the run's PostgreSQL. */
export interface TestDatabase {
  url: string;
  schema: string;
  /** The owner's pool (a superuser here): sees every row, for setting up and checking. */
  pool: pg.Pool;
  /** The registry as the server uses it: acting as idem_server under row-level security, and as idem_cross_tenant for work across tenants. */
  db: Db;
  /** Pool settings that reach this schema, for servers started by the test. */
  settings: PoolSettings;
  /** Opens another pool on the same schema (as the owner unless `role` is given). */
  openPool(overrides?: Partial<PoolSettings>): pg.Pool;
  /** Drops the schema and closes the pools. */
  drop(): Promise<void>;
}

export async function createTestDatabase(): Promise<TestDatabase> {
  const url = inject("databaseUrl");
  const schema = `t_${randomBytes(6).toString("hex")}`;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query(`CREATE SCHEMA ${schema}`);
  await admin.end();

  const settings: PoolSettings = {
    connectionString: url,
    max: 20,
    connectionTimeoutMs: 10_000,
    statementTimeoutMs: 10_000,
    lockTimeoutMs: 5_000,
    idleInTransactionTimeoutMs: 30_000,
    options: `-c search_path=${schema}`,
    applicationName: `idem-test-${schema}`,
  };
  const pools: pg.Pool[] = [];
  const open = (overrides: Partial<PoolSettings> = {}) => {
    const pool = openPool({ ...settings, ...overrides }, silentLogger);
    pools.push(pool);
    return pool;
  };
  const pool = open();
  await migrate(pool, silentLogger);
  return {
    url,
    schema,
    pool,
    db: poolDb(open({ role: SERVER_ROLE }), silentLogger, { crossTenantPool: open({ role: CROSS_TENANT_ROLE, max: 4 }) }),
    settings,
    openPool: open,
    async drop() {
      await Promise.all(pools.map((p) => p.end().catch(() => undefined)));
      const cleanup = new pg.Client({ connectionString: url });
      await cleanup.connect();
      await cleanup.query(`DROP SCHEMA ${schema} CASCADE`);
      await cleanup.end();
    },
  };
}

/**
 * Gives the calling test file its own migrated schema for all its tests:
 * created before the first test, dropped after the last. The returned object
 * is filled in by the time tests run.
 */
export function useTestDatabase(): TestDatabase {
  const database = {} as TestDatabase;
  beforeAll(async () => {
    Object.assign(database, await createTestDatabase());
  });
  afterAll(async () => {
    await database.drop?.();
  });
  return database;
}

/**
 * Gives each test of the calling file a migrated schema of its own: created
 * before it, dropped after it. For tests that read everything a schema holds
 * (every tenant's records), so that none depends on what another left behind
 * and each passes alone or in any order. The returned object is filled in by
 * the time each test runs.
 */
export function useTestDatabasePerTest(): TestDatabase {
  const database = {} as TestDatabase;
  beforeEach(async () => {
    Object.assign(database, await createTestDatabase());
  });
  afterEach(async () => {
    await database.drop?.();
  });
  return database;
}

/**
 * A pool whose connections send every query through `intercept`, which runs
 * it with `send` (or not, or sends another text instead on the same
 * connection): to count round trips, or to lose a COMMIT's answer.
 * Only `connect` is intercepted: the registry and co-located mode run their
 * transactions on checked-out connections. `preparedName` is the name a
 * statement was sent under (prepared once per connection), if any.
 */
export function interceptedPool(
  pool: pg.Pool,
  intercept: (text: string, values: unknown[] | undefined, send: (instead?: string) => Promise<pg.QueryResult>, preparedName?: string) => Promise<pg.QueryResult>,
): pg.Pool {
  return new Proxy(pool, {
    get(target, property) {
      if (property !== "connect") return Reflect.get(target, property) as unknown;
      return async () => {
        const client = await target.connect();
        return new Proxy(client, {
          get(inner, name) {
            const value = Reflect.get(inner, name) as unknown;
            if (name !== "query") return typeof value === "function" ? (value as (...args: unknown[]) => unknown).bind(inner) : value;
            // The registry sends its statements by prepared name ({ name, text, values }) and everything else as text.
            return (sent: string | pg.QueryConfig, values?: unknown[]) => {
              const config = typeof sent === "string" ? { text: sent, values } : sent;
              return intercept(config.text, config.values, (instead) => (instead === undefined ? inner.query(config) : inner.query(instead)), config.name);
            };
          },
        });
      };
    },
  });
}

/**
 * The registry on one connection of `database`, counting its messages to
 * PostgreSQL (BEGIN with the tenant binding, statements, COMMIT) and its
 * round trips: a message sent while an earlier one is still unanswered
 * travels in the same round trip.
 */
export function roundTripCounting(database: TestDatabase): { db: Db; counts: () => { roundTrips: number; messages: number } } {
  let messages = 0;
  let roundTrips = 0;
  let unanswered = 0;
  const counted = interceptedPool(database.openPool({ max: 1 }), (_text, _values, send) => {
    messages++;
    if (unanswered++ === 0) roundTrips++;
    return send().finally(() => unanswered--);
  });
  return { db: poolDb(counted, silentLogger), counts: () => ({ roundTrips, messages }) };
}
