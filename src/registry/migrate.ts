import { createHash } from "node:crypto";
import { readdir, readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import type pg from "pg";
import type { Logger } from "pino";
import { sqlState } from "./db.js";

/** The folder of numbered SQL migrations, beside src/ and dist/ alike. */
export const MIGRATIONS_DIR = fileURLToPath(new URL("../../migrations/", import.meta.url));

interface Migration {
  version: number;
  name: string;
  sql: string;
  checksum: string;
}

/** Reads `NNNNNN_name.sql` files in version order. */
export async function loadMigrations(dir = MIGRATIONS_DIR): Promise<Migration[]> {
  const files = (await readdir(dir)).filter((f) => f.endsWith(".sql")).sort();
  const migrations: Migration[] = [];
  for (const file of files) {
    const match = /^(\d{6})_([a-z0-9_]+)\.sql$/.exec(file);
    if (!match) throw new Error(`migration file ${file} is not named NNNNNN_name.sql`);
    const sql = await readFile(`${dir}/${file}`, "utf8");
    migrations.push({
      version: Number(match[1]),
      name: match[2]!,
      sql,
      checksum: createHash("sha256").update(sql).digest("hex"),
    });
  }
  migrations.forEach((m, i) => {
    if (m.version !== i + 1) throw new Error(`migrations must be numbered 1, 2, 3, …: found ${m.version} at position ${i + 1}`);
  });
  return migrations;
}

/**
 * Applies pending migrations to the connection's current schema, each in its
 * own transaction that also records its version. A session advisory lock keyed
 * by the schema makes concurrent boots of several replicas apply each
 * migration exactly once (the others wait, then find nothing to do). An
 * applied migration whose file changed since is refused: migrations are
 * forward-only and never edited.
 */
export async function migrate(pool: pg.Pool, logger: Logger, dir = MIGRATIONS_DIR): Promise<number[]> {
  const migrations = await loadMigrations(dir);
  const client = await pool.connect();
  const onError = (error: Error) => logger.warn({ err: error }, "connection lost while migrating");
  client.on("error", onError);
  try {
    // Migrations may wait for the lock and run long: lift the request-path bounds.
    await client.query("SET statement_timeout = 0");
    await client.query("SET lock_timeout = 0");
    await client.query("SELECT pg_advisory_lock(hashtext(current_schema() || '.idem_schema_migrations'))");
    try {
      await client.query(`
        CREATE TABLE IF NOT EXISTS idem_schema_migrations (
          version    integer     PRIMARY KEY,
          name       text        NOT NULL,
          checksum   text        NOT NULL,
          applied_at timestamptz NOT NULL DEFAULT now()
        )`);
      const applied = new Map(
        (await client.query<{ version: number; checksum: string }>("SELECT version, checksum FROM idem_schema_migrations")).rows.map((r) => [r.version, r.checksum]),
      );
      const newest = migrations.at(-1)?.version ?? 0;
      const unknown = [...applied.keys()].filter((v) => v > newest);
      if (unknown.length > 0) {
        throw new Error(`the database has migrations ${unknown.join(", ")} that this build does not know; deploy a newer build`);
      }
      const done: number[] = [];
      for (const m of migrations) {
        const checksum = applied.get(m.version);
        if (checksum !== undefined) {
          if (checksum !== m.checksum) {
            throw new Error(`migration ${m.version} (${m.name}) changed after it was applied; add a new migration instead`);
          }
          continue;
        }
        logger.info({ version: m.version, name: m.name }, "applying migration");
        await client.query("BEGIN");
        try {
          await client.query(m.sql);
          await client.query("INSERT INTO idem_schema_migrations (version, name, checksum) VALUES ($1, $2, $3)", [m.version, m.name, m.checksum]);
          await client.query("COMMIT");
        } catch (error) {
          await client.query("ROLLBACK").catch(() => undefined);
          throw new Error(`migration ${m.version} (${m.name}) failed: ${(error as Error).message}`, { cause: error });
        }
        done.push(m.version);
      }
      return done;
    } finally {
      await client.query("SELECT pg_advisory_unlock(hashtext(current_schema() || '.idem_schema_migrations'))").catch(() => undefined);
    }
  } finally {
    client.removeListener("error", onError);
    // The session's timeouts were changed above: close it rather than pool it.
    client.release(true);
  }
}

/** When each applied migration was applied, by version; empty before the first migration. */
export async function appliedMigrations(pool: pg.Pool): Promise<Map<number, Date>> {
  const { rows } = await pool
    .query<{ version: number; applied_at: Date }>("SELECT version, applied_at FROM idem_schema_migrations ORDER BY version")
    // No table yet (42P01): nothing is applied.
    .catch((error: unknown) => {
      if (sqlState(error) === "42P01") return { rows: [] as Array<{ version: number; applied_at: Date }> };
      throw error;
    });
  return new Map(rows.map((r) => [r.version, r.applied_at]));
}
