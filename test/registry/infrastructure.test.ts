import { randomBytes, randomUUID } from "node:crypto";
import { copyFile, mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { once } from "node:events";
import { describe, expect, it } from "vitest";
import { openPool, poolDb, transactionDb, type Db } from "../../src/registry/db.js";
import { loadMigrations, migrate, MIGRATIONS_DIR } from "../../src/registry/migrate.js";
import { actor, newKey, reserveInput, testRegistry } from "../support/fixtures.js";
import { silentLogger, useTestDatabase } from "../support/database.js";
import { expectRefusal } from "../support/registry-helpers.js";

const t = useTestDatabase();

const registry = testRegistry();
const gateway = actor();

/**
 * Runs `check` on a schema of its own migrated up to (not including)
 * `version`, so that a test can store what older releases stored before
 * applying the rest; the schema and the copied migrations go afterwards.
 */
async function withMigrationsBefore(version: string, check: (pool: ReturnType<typeof openPool>) => Promise<void>): Promise<void> {
  const schema = `m_${randomBytes(5).toString("hex")}`;
  await t.pool.query(`CREATE SCHEMA ${schema}`);
  const before = await mkdtemp(join(tmpdir(), "idem-migrations-"));
  for (const file of (await readdir(MIGRATIONS_DIR)).filter((f) => f < version)) await copyFile(join(MIGRATIONS_DIR, file), join(before, file));
  const pool = openPool({ ...t.settings, options: `-c search_path=${schema}` }, silentLogger);
  try {
    await migrate(pool, silentLogger, before);
    await check(pool);
  } finally {
    await pool.end();
    await t.pool.query(`DROP SCHEMA ${schema} CASCADE`);
    await rm(before, { recursive: true, force: true });
  }
}

describe("migrations", () => {
  it("apply each version exactly once when several replicas boot at the same time, and then do nothing", async () => {
    const schema = `m_${randomBytes(5).toString("hex")}`;
    await t.pool.query(`CREATE SCHEMA ${schema}`);
    const pools = [1, 2, 3].map(() => openPool({ ...t.settings, options: `-c search_path=${schema}` }, silentLogger));
    try {
      const applied = await Promise.all(pools.map((p) => migrate(p, silentLogger)));
      const versions = (await loadMigrations()).map((m) => m.version);
      expect(applied.flat().sort((a, b) => a - b)).toEqual(versions);
      expect(await migrate(pools[0]!, silentLogger)).toEqual([]);
      const { rows } = await pools[0]!.query<{ version: number }>("SELECT version FROM idem_schema_migrations ORDER BY version");
      expect(rows.map((r) => r.version)).toEqual(versions);

      await pools[0]!.query("UPDATE idem_schema_migrations SET checksum = 'edited' WHERE version = 1");
      await expect(migrate(pools[0]!, silentLogger)).rejects.toThrow(/changed after it was applied/);
    } finally {
      await Promise.all(pools.map((p) => p.end()));
      await t.pool.query(`DROP SCHEMA ${schema} CASCADE`);
    }
  });
});

describe("migration 8 (every attempt counts)", () => {
  it("marks records whose earlier attempt may have had an effect, and sends one released in that state to recovery", async () => {
    await withMigrationsBefore("000008", async (pool) => {
      // Stored under the old rule: attempt 1 CONFIRMED, attempt 2 NO_EFFECT, flag cleared; one of them released.
      const legacy = async (operationId: string, state: string, lease: string | null) => {
        await pool.query(
          `INSERT INTO idem_record (tenant_id, scope, operation_id, principal, operation, api_revision, schema_revision,
                                    fingerprint, state, generation, lease_expires_at, acquisition_id, effect_possible)
           VALUES ('acme', $1, $2, 'alice', 'payments.create', 1, 1, $3, $4, 1, $5, gen_random_uuid(), false)`,
          [randomBytes(32), operationId, randomBytes(32), state, lease],
        );
        await pool.query(
          `INSERT INTO idem_effect_attempt (tenant_id, operation_id, attempt_number, effect, provider, downstream_key, status, generation)
           VALUES ('acme', $1, 1, 'card.charge', 'cards', 'k', 'CONFIRMED', 1), ('acme', $1, 2, 'card.charge', 'cards', 'k', 'NO_EFFECT', 1)`,
          [operationId],
        );
      };
      const executing = randomUUID();
      const released = randomUUID();
      await legacy(executing, "EXECUTING", new Date(Date.now() + 60_000).toISOString());
      await legacy(released, "RESERVED", null);

      expect(await migrate(pool, silentLogger)).toEqual([8, ...(await loadMigrations()).map((m) => m.version).filter((v) => v > 8)]);
      const { rows } = await pool.query("SELECT operation_id, state, effect_possible, lease_expires_at IS NOT NULL AS leased FROM idem_record ORDER BY state");
      expect(rows).toEqual([
        { operation_id: executing, state: "EXECUTING", effect_possible: true, leased: true },
        { operation_id: released, state: "UNKNOWN", effect_possible: true, leased: true },
      ]);
      const events = await pool.query("SELECT operation_id, kind, state FROM idem_event");
      expect(events.rows).toEqual([{ operation_id: released, kind: "UNKNOWN", state: "UNKNOWN" }]);
    });
  });
});

describe("migration 13 (quota counts kept by the database)", () => {
  it("counts the unfinished records already there, per principal", async () => {
    await withMigrationsBefore("000013", async (pool) => {
      const record = (principal: string, state: string) =>
        pool.query(
          `INSERT INTO idem_record (tenant_id, scope, operation_id, principal, operation, api_revision, schema_revision,
                                    fingerprint, state, generation, acquisition_id, snapshot_digest)
           VALUES ('acme', $1, gen_random_uuid(), $2, 'payments.create', 1, 1, $3, $4, 1, gen_random_uuid(), $5)`,
          [randomBytes(32), principal, randomBytes(32), state, ["SUCCEEDED", "FAILED_FINAL", "REJECTED"].includes(state) ? randomBytes(32) : null],
        );
      for (const state of ["RESERVED", "EXECUTING", "UNKNOWN", "SUCCEEDED", "REJECTED"]) await record("alice", state);
      await record("bob", "SUCCEEDED");
      await record("carol", "EXECUTING");

      expect(await migrate(pool, silentLogger)).toEqual((await loadMigrations()).map((m) => m.version).filter((v) => v >= 13));
      const counts = async () =>
        (await pool.query<{ principal: string; active: number }>("SELECT principal, active FROM idem_quota_gate WHERE tenant_id = 'acme' ORDER BY principal")).rows;
      expect(await counts()).toEqual([
        { principal: "alice", active: 3 },
        { principal: "carol", active: 1 },
      ]);
    });
  });
});

describe("migration 16 (quota counts kept by the statements)", () => {
  it("counts every principal's unfinished records afresh, drops the triggers, and leaves older coordinators' count without its function", async () => {
    await withMigrationsBefore("000016", async (pool) => {
      const record = (principal: string, state: string) =>
        pool.query(
          `INSERT INTO idem_record (tenant_id, scope, operation_id, principal, operation, api_revision, schema_revision,
                                    fingerprint, state, generation, acquisition_id, snapshot_digest)
           VALUES ('acme', $1, gen_random_uuid(), $2, 'payments.create', 1, 1, $3, $4, 1, gen_random_uuid(), $5)`,
          [randomBytes(32), principal, randomBytes(32), state, ["SUCCEEDED", "FAILED_FINAL", "REJECTED"].includes(state) ? randomBytes(32) : null],
        );
      for (const state of ["RESERVED", "EXECUTING", "SUCCEEDED"]) await record("alice", state);
      await record("bob", "UNKNOWN");
      // Counts that drifted from the records: whatever they say, the migration counts afresh.
      await pool.query("UPDATE idem_quota_gate SET active = 42 WHERE principal = 'alice'");
      await pool.query("INSERT INTO idem_quota_gate (tenant_id, principal, operation, api_revision, active) VALUES ('acme', 'dora', 'payments.create', 1, 5)");

      expect(await migrate(pool, silentLogger)).toEqual((await loadMigrations()).map((m) => m.version).filter((v) => v >= 16));
      const { rows } = await pool.query<{ principal: string; active: number }>("SELECT principal, active FROM idem_quota_gate WHERE tenant_id = 'acme' ORDER BY principal");
      expect(rows).toEqual([
        { principal: "alice", active: 2 },
        { principal: "bob", active: 1 },
        { principal: "dora", active: 0 },
      ]);
      const triggers = await pool.query("SELECT tgname FROM pg_trigger WHERE tgrelid = 'idem_record'::regclass AND NOT tgisinternal");
      expect(triggers.rows).toEqual([]);
      // A coordinator from before counts nothing itself: its count fails, so that it admits nothing uncounted.
      await expect(pool.query("SELECT idem_within_quota(1, 2)")).rejects.toThrow(/idem_within_quota.*does not exist/);
      await expect(pool.query("SELECT idem_count_within_quota(3, 2)")).rejects.toMatchObject({ code: "IDQ01" });
    });
  });
});

describe("migration 15 (UNKNOWN is for good)", () => {
  it("marks the records that are or were UNKNOWN, and sends one handed back since to recovery", async () => {
    await withMigrationsBefore("000015", async (pool) => {
      const record = async (state: string, options: { recovering?: boolean; wentUnknownEvent?: boolean } = {}) => {
        const operationId = randomUUID();
        await pool.query(
          `INSERT INTO idem_record (tenant_id, scope, operation_id, principal, operation, api_revision, schema_revision,
                                    fingerprint, state, generation, recovering, lease_expires_at, acquisition_id)
           VALUES ('acme', $1, $2, 'alice', 'payments.create', 1, 1, $3, $4, 2, $5, $6, gen_random_uuid())`,
          [randomBytes(32), operationId, randomBytes(32), state, options.recovering ?? false, state === "RESERVED" ? null : new Date().toISOString()],
        );
        if (options.wentUnknownEvent) {
          await pool.query(
            `INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller)
             VALUES ('acme', $1, 'payments.create', 1, 'UNKNOWN', 1, 'UNKNOWN', 'recoverer')`,
            [operationId],
          );
        }
        return operationId;
      };
      const unknown = await record("UNKNOWN");
      const recovering = await record("EXECUTING", { recovering: true });
      // Went UNKNOWN, its attempts then resolved NO_EFFECT, and released: what the old rules let happen.
      const handedBack = await record("RESERVED", { wentUnknownEvent: true });
      const takenOver = await record("EXECUTING", { wentUnknownEvent: true });
      const untouched = await record("EXECUTING");

      expect(await migrate(pool, silentLogger)).toEqual((await loadMigrations()).map((m) => m.version).filter((v) => v >= 15));
      const { rows } = await pool.query<{ operation_id: string; state: string; went_unknown: boolean; leased: boolean }>(
        "SELECT operation_id, state, went_unknown, lease_expires_at IS NOT NULL AS leased FROM idem_record",
      );
      const byId = new Map(rows.map((row) => [row.operation_id, row]));
      expect(byId.get(unknown)).toMatchObject({ state: "UNKNOWN", went_unknown: true });
      expect(byId.get(recovering)).toMatchObject({ state: "EXECUTING", went_unknown: true });
      expect(byId.get(handedBack)).toMatchObject({ state: "UNKNOWN", went_unknown: true, leased: true });
      expect(byId.get(takenOver)).toMatchObject({ state: "EXECUTING", went_unknown: true });
      expect(byId.get(untouched)).toMatchObject({ state: "EXECUTING", went_unknown: false });
      const events = await pool.query("SELECT operation_id, kind, state, caller FROM idem_event WHERE caller = 'migration'");
      expect(events.rows).toEqual([{ operation_id: handedBack, kind: "UNKNOWN", state: "UNKNOWN", caller: "migration" }]);
      // From then on only a record that went UNKNOWN is held by recovery.
      await expect(pool.query("UPDATE idem_record SET recovering = true WHERE operation_id = $1", [untouched])).rejects.toThrow(/idem_record_recovery_follows_unknown/);
    });
  });
});

describe("connections", () => {
  it("survives the server killing an idle pooled connection, and keeps serving", async () => {
    const applicationName = `idem-kill-${randomBytes(4).toString("hex")}`;
    const pool = t.openPool({ applicationName, max: 2 });
    await pool.query("SELECT 1");
    const lost = once(pool, "error");
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name = $1", [applicationName]);
    expect(rows[0]?.n).toBe(1);
    const [error] = (await lost) as [Error & { code?: string }];
    expect(error.code).toBe("57P01");
    const result = await registry.reserve(poolDb(pool, silentLogger), reserveInput(newKey()), gateway);
    expect(result.decision).toBe("ACCEPTED");
  });

  it("re-runs a transaction whose connection was killed before COMMIT, on a new connection", async () => {
    const { record } = await registry.reserve(t.db, reserveInput(newKey()), gateway);
    const ref = { tenant: "acme", operationId: record!.operationId };
    const retried: string[] = [];
    const base = poolDb(t.pool, silentLogger, { retried: (cause) => retried.push(cause) });
    let killed = false;
    const killing: Db = {
      transaction: (tenant, work) =>
        base.transaction(tenant, async (q, commitWith) => {
          if (!killed) {
            killed = true;
            await q.query("SELECT pg_terminate_backend(pg_backend_pid())");
          }
          return work(q, commitWith);
        }),
    };
    const claimed = await registry.claim(killing, { ref, mode: "OWNER", generation: 1, writerEpoch: 0 }, gateway);
    expect(claimed.record.state).toBe("EXECUTING");
    expect(retried).toEqual(["57P01"]);
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_event WHERE operation_id = $1 AND kind = 'CLAIMED'", [ref.operationId]);
    expect(rows[0]?.n).toBe(1);
  });

  it("answers REGISTRY_UNAVAILABLE, deciding nothing, when no connection frees up in time", async () => {
    const pool = t.openPool({ max: 1, connectionTimeoutMs: 200 });
    const holder = await pool.connect();
    try {
      await expectRefusal(registry.reserve(poolDb(pool, silentLogger), reserveInput(newKey()), gateway), "REGISTRY_UNAVAILABLE");
    } finally {
      holder.release();
    }
  });

  it("answers REGISTRY_BUSY when a record stays locked beyond the lock timeout", async () => {
    const { record } = await registry.reserve(t.db, reserveInput(newKey()), gateway);
    const pool = t.openPool({ lockTimeoutMs: 200 });
    const locker = await t.pool.connect();
    try {
      await locker.query("BEGIN");
      await locker.query("SELECT 1 FROM idem_record WHERE operation_id = $1 FOR UPDATE", [record!.operationId]);
      await expectRefusal(
        registry.claim(poolDb(pool, silentLogger), { ref: { tenant: "acme", operationId: record!.operationId }, mode: "OWNER", generation: 1, writerEpoch: 0 }, gateway),
        "REGISTRY_BUSY",
      );
    } finally {
      await locker.query("ROLLBACK");
      locker.release();
    }
  });
});

describe("co-located mode", () => {
  it("runs inside the caller's own transaction: a rolled-back business transaction leaves no record", async () => {
    const client = await t.pool.connect();
    const key = newKey();
    try {
      await client.query("BEGIN");
      const inside = await registry.reserve(transactionDb(client), reserveInput(key, undefined, { claim: true }), gateway);
      expect(inside.decision).toBe("ACCEPTED");
      await client.query("ROLLBACK");
      const after = await registry.reserve(t.db, reserveInput(key), gateway);
      expect(after.decision).toBe("ACCEPTED");
      expect(after.record!.operationId).not.toBe(inside.record!.operationId);
    } finally {
      client.release();
    }
  });

  it("commits the business row and the terminal state together", async () => {
    await t.pool.query("CREATE TABLE IF NOT EXISTS business_payment (operation_id uuid PRIMARY KEY, amount int NOT NULL)");
    const { record } = await registry.reserve(t.db, reserveInput(newKey(), undefined, { claim: true }), gateway);
    const ref = { tenant: "acme", operationId: record!.operationId };
    const client = await t.pool.connect();
    try {
      await client.query("BEGIN");
      await client.query("INSERT INTO business_payment VALUES ($1, 10)", [ref.operationId]);
      const db = transactionDb(client);
      await registry.complete(
        db,
        {
          ref,
          generation: 1,
          outcome: "SUCCEEDED",
          snapshot: { statusCode: 201, mediaType: "application/json", location: "", businessVersion: "", headers: [], body: new Uint8Array() },
        },
        gateway,
      );
      await client.query("COMMIT");
    } finally {
      client.release();
    }
    const { rows } = await t.pool.query("SELECT r.state, p.amount FROM idem_record r JOIN business_payment p USING (operation_id) WHERE operation_id = $1", [ref.operationId]);
    expect(rows).toEqual([{ state: "SUCCEEDED", amount: 10 }]);
  });
});

describe("the event log", () => {
  it("only grows", async () => {
    await registry.reserve(t.db, reserveInput(newKey()), gateway);
    await expect(t.pool.query("UPDATE idem_event SET kind = 'X'")).rejects.toThrow(/append-only/);
    await expect(t.pool.query("DELETE FROM idem_event")).rejects.toThrow(/append-only/);
  });

  it("never holds keys or payloads: records keep only digests", async () => {
    const key = newKey();
    await registry.reserve(t.db, reserveInput(key, { card: "4242424242424242" }), gateway);
    const dump = JSON.stringify((await t.pool.query("SELECT * FROM idem_record")).rows) + JSON.stringify((await t.pool.query("SELECT * FROM idem_event")).rows);
    expect(dump).not.toContain(key);
    expect(dump).not.toContain("4242424242424242");
  });
});
