import { randomBytes } from "node:crypto";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import pino from "pino";
import { startEmbeddedPostgresOnFreePort, type EmbeddedPostgres } from "../../src/dev/embedded-postgres.js";

/**
 * The gate's PostgreSQL: a fresh schema in DATABASE_URL's database, or an
 * embedded server in a temporary folder, whose fresh database (schema
 * `public`) belongs to the run alone.
 */
export interface GateDatabase {
  url: string;
  /** The run's schema (DATABASE_URL); undefined on the embedded server, whose fresh database is the run's alone. */
  schema: string | undefined;
  kind: "external" | "embedded";
  /** Server settings the gate chose (embedded only). */
  settings: Record<string, string>;
  version: string;
  /** Reads in the run's schema. */
  pool: pg.Pool;
  dataDir: string | undefined;
  /** Drops the schema (external) or stops the server and removes its files (embedded), unless `keep`. */
  close(keep: boolean): Promise<void>;
}

/** Durability is not what the gate measures on a throwaway server; `durable` keeps it anyway. */
export const FAST_SETTINGS = { fsync: "off", synchronous_commit: "off", full_page_writes: "off" } as const;

export async function openGateDatabase(options: { databaseUrl: string | undefined; durable: boolean; keep: boolean }): Promise<GateDatabase> {
  let embedded: EmbeddedPostgres | undefined;
  let url = options.databaseUrl;
  const settings: Record<string, string> = {};
  if (!url) {
    Object.assign(settings, options.durable ? {} : FAST_SETTINGS, {
      // Room for the coordinator's and the service's pools across restarts (killed connections linger briefly).
      max_connections: "300",
      shared_buffers: "256MB",
    });
    embedded = await startEmbeddedPostgresOnFreePort({
      stateDir: await mkdtemp(join(tmpdir(), "idem-gate-pg-")),
      logger: pino({ level: "warn" }),
      ephemeral: !options.keep,
      settings,
    });
    url = embedded.url;
  }
  const schema = embedded ? undefined : `gate_${randomBytes(5).toString("hex")}`;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  let version: string;
  try {
    if (schema) await admin.query(`CREATE SCHEMA ${schema}`);
    version = (await admin.query<{ v: string }>("SELECT current_setting('server_version') AS v")).rows[0]!.v;
  } finally {
    await admin.end();
  }
  // The gate reads every tenant's rows (where row-level security binds transactions to a tenant, this binds to all).
  const pgOptions = [schema ? `-c search_path=${schema}` : "", "-c idem.all_tenants=on"].filter(Boolean).join(" ");
  const pool = new pg.Pool({ connectionString: url, max: 4, options: pgOptions, application_name: "idem-gate" });
  pool.on("error", () => undefined);
  return {
    url,
    schema,
    kind: embedded ? "embedded" : "external",
    settings,
    version,
    pool,
    dataDir: embedded?.dataDir,
    async close(keep) {
      await pool.end().catch(() => undefined);
      if (embedded) {
        await embedded.stop();
        return;
      }
      if (keep || !schema) return;
      const cleanup = new pg.Client({ connectionString: url });
      await cleanup.connect();
      try {
        await cleanup.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      } finally {
        await cleanup.end();
      }
    },
  };
}
