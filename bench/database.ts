/**
 * The benchmark's PostgreSQL: a dedicated embedded server (or --database-url),
 * its settings and version for the report, and pg_stat_statements for the
 * round trips of each RPC.
 */
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import type { Logger } from "pino";
import { startEmbeddedPostgresOnFreePort } from "../src/dev/embedded-postgres.js";
import { classify } from "./sql.js";

export interface BenchDatabase {
  url: string;
  embedded: boolean;
  /** The embedded server's postmaster, for CPU accounting. */
  postmasterPid?: number;
  stop(): Promise<void>;
}

/**
 * Server settings of the embedded cluster. Both sides use this one server,
 * so whatever is chosen applies to both. `synchronous_commit` is set for the
 * benchmark's database by synchronousCommit(), once per commit setting of a
 * run; fsync stays on.
 */
export function embeddedSettings(): Record<string, string> {
  return {
    shared_preload_libraries: "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_utility": "on",
    "pg_stat_statements.max": "10000",
    fsync: "on",
  };
}

export async function startDatabase(options: { databaseUrl?: string; logger: Logger }): Promise<BenchDatabase> {
  if (options.databaseUrl) return { url: options.databaseUrl, embedded: false, stop: () => Promise.resolve() };
  const stateDir = await mkdtemp(join(tmpdir(), "idem-bench-"));
  const embedded = await startEmbeddedPostgresOnFreePort({
    stateDir,
    logger: options.logger,
    ephemeral: true,
    settings: embeddedSettings(),
  });
  const pid = Number((await readFile(join(embedded.dataDir, "postmaster.pid"), "utf8").catch(() => "")).split("\n")[0]);
  return { url: embedded.url, embedded: true, ...(pid > 0 ? { postmasterPid: pid } : {}), stop: () => embedded.stop() };
}

/**
 * `synchronous_commit` for every connection opened to the benchmark's
 * database from now on (`ALTER DATABASE … SET`; open connections keep theirs,
 * so every process connects afresh after it), or the database's own default
 * again (`undefined`). Returns the setting a new connection sees.
 * `on`: every COMMIT waits for its WAL flush; `off`: it returns before it
 * (nothing can corrupt, a crash may lose the last commits).
 */
export async function synchronousCommit(url: string, setting: "on" | "off" | undefined): Promise<string> {
  await withClient(url, async (client) => {
    const name = (await client.query<{ db: string }>("SELECT current_database() AS db")).rows[0]!.db;
    const database = client.escapeIdentifier(name);
    await client.query(setting === undefined ? `ALTER DATABASE ${database} RESET synchronous_commit` : `ALTER DATABASE ${database} SET synchronous_commit = ${setting}`);
  });
  return withClient(url, async (client) => (await client.query<{ synchronous_commit: string }>("SHOW synchronous_commit")).rows[0]!.synchronous_commit);
}

/** One short-lived connection. */
export async function withClient<T>(url: string, work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url, application_name: "idem-bench" });
  client.on("error", () => undefined);
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** The server's version and the settings that shape the figures. */
export async function databaseFacts(url: string): Promise<{ version: string; settings: Record<string, string> }> {
  return withClient(url, async (client) => {
    const version = (await client.query<{ v: string }>("SELECT version() AS v")).rows[0]!.v;
    const names = [
      "server_version",
      "fsync",
      "synchronous_commit",
      "wal_sync_method",
      "full_page_writes",
      "shared_buffers",
      "max_connections",
      "checkpoint_timeout",
      "max_wal_size",
      "autovacuum",
      "jit",
      "shared_preload_libraries",
    ];
    const { rows } = await client.query<{ name: string; setting: string; unit: string | null }>("SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1)", [names]);
    const settings: Record<string, string> = {};
    for (const name of names) {
      const row = rows.find((r) => r.name === name);
      if (!row) continue;
      settings[name] = row.unit === "8kB" ? `${(Number(row.setting) * 8) / 1024}MB` : row.unit && row.unit !== "" ? `${row.setting}${row.unit}` : row.setting;
    }
    return { version, settings };
  });
}

/** Makes pg_stat_statements usable in the benchmark's database, or says why it is not. */
export async function enableStatements(url: string): Promise<{ available: true } | { available: false; reason: string }> {
  try {
    return await withClient(url, async (client) => {
      await client.query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
      await client.query("SELECT pg_stat_statements_reset()");
      await client.query("SELECT count(*) FROM pg_stat_statements");
      const { rows } = await client.query<{ setting: string }>("SELECT setting FROM pg_settings WHERE name = 'pg_stat_statements.track_utility'");
      if (rows[0]?.setting !== "on") return { available: false as const, reason: "pg_stat_statements.track_utility is off: BEGIN and COMMIT would not be counted" };
      return { available: true as const };
    });
  } catch (error) {
    return { available: false, reason: `pg_stat_statements is not usable on this server: ${(error as Error).message}` };
  }
}

export async function resetStatements(url: string): Promise<void> {
  await withClient(url, (client) => client.query("SELECT pg_stat_statements_reset()"));
}

export interface StatementCount {
  /** The step of an operation it is (bench/sql.ts classify), or "other". */
  step: ReturnType<typeof classify>;
  /** The step, or for other statements the start of their text. */
  name: string;
  query: string;
  calls: number;
  totalMs: number;
}

/** Top-level statements of the benchmark's database since the last reset, by step of an operation. */
export async function readStatements(url: string): Promise<StatementCount[]> {
  return withClient(url, async (client) => {
    const { rows } = await client.query<{ query: string; calls: string; total_exec_time: number }>(
      `SELECT query, calls, total_exec_time FROM pg_stat_statements
        WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND toplevel AND query NOT LIKE '%pg_stat_statements%'`,
    );
    return (
      rows
        .map((r) => {
          const query = r.query.replace(/\s+/g, " ").trim();
          const step = classify(query);
          const name = step === "other" ? (query.length > 60 ? `${query.slice(0, 57)}...` : query) : step;
          return { step, name, query, calls: Number(r.calls), totalMs: r.total_exec_time };
        })
        // The server's own readiness probe runs on a timer, not per operation: it is no cost of one.
        .filter((s) => s.step !== "probe")
        .sort((a, b) => b.calls - a.calls)
    );
  });
}

/**
 * Between phases: vacuum what the previous phase left behind and checkpoint,
 * so that every phase starts from a similar state. Best effort (needs the
 * privileges an external server may not grant).
 */
export async function settle(url: string): Promise<void> {
  await withClient(url, async (client) => {
    await client.query("VACUUM (ANALYZE) idem_record, idem_event, idem_effect_attempt").catch(() => undefined);
    await client.query("CHECKPOINT").catch(() => undefined);
  }).catch(() => undefined);
}
