import pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { ALL_TENANTS } from "../../src/registry/db.js";
import { requireLeastPrivilege } from "../../src/registry/privileges.js";
import { SERVER_ROLE, useTestDatabase } from "../support/database.js";
import { actor, newKey, reserveInput, testRegistry } from "../support/fixtures.js";

const t = useTestDatabase();
const registry = testRegistry();
const everyone = actor();

/** A connection acting as the server's role, for hand-written queries. */
async function asServerRole<T>(work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: t.url, options: `-c search_path=${t.schema} -c role=${SERVER_ROLE}` });
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end();
  }
}

let acmeOperation: string;
let globexOperation: string;

beforeAll(async () => {
  acmeOperation = (await registry.reserve(t.db, reserveInput(newKey(), { amount: 1 }, { subject: { tenant: "acme", principal: "alice" } }), everyone)).record!.operationId;
  globexOperation = (await registry.reserve(t.db, reserveInput(newKey(), { amount: 2 }, { subject: { tenant: "globex", principal: "gus" } }), everyone)).record!.operationId;
});

describe("the catalog", () => {
  it("gives every registry table forced row-level security with a policy, and every tenant table a policy on the bound tenant", async () => {
    const { rows } = await t.pool.query<{ table: string; enabled: boolean; forced: boolean; tenant_column: boolean; policies: string[] | null }>(
      `SELECT c.relname AS table, c.relrowsecurity AS enabled, c.relforcerowsecurity AS forced,
              EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped) AS tenant_column,
              (SELECT array_agg(pg_get_expr(p.polqual, p.polrelid) || ' / ' || pg_get_expr(p.polwithcheck, p.polrelid))
                 FROM pg_policy p WHERE p.polrelid = c.oid) AS policies
         FROM pg_class c
        WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p')
        ORDER BY c.relname`,
      [t.schema],
    );
    // Every table the migrations made, so that a new one cannot slip by unnoticed.
    expect(rows.map((r) => r.table)).toEqual([
      "idem_effect_attempt",
      "idem_event",
      "idem_job_lease",
      "idem_operation",
      "idem_policy",
      "idem_record",
      "idem_schema_migrations",
    ]);
    for (const row of rows) {
      expect({ table: row.table, enabled: row.enabled, forced: row.forced }).toEqual({ table: row.table, enabled: true, forced: true });
      expect(row.policies?.length ?? 0, `${row.table} has no policy`).toBeGreaterThan(0);
      if (row.tenant_column) {
        // Both the rows it shows (USING) and the rows it accepts (WITH CHECK) follow the binding.
        for (const policy of row.policies!) expect(policy.match(/idem\.tenant/g), `${row.table}: ${policy}`).toHaveLength(2);
      }
    }
  });

  it("makes the server's role own nothing, bypass nothing, and hold only the grants the registry needs", async () => {
    await asServerRole(async (client) => {
      await expect(requireLeastPrivilege(client)).resolves.toBeUndefined();
      const { rows } = await client.query<{ table: string; privileges: string }>(
        `SELECT c.relname AS table,
                concat_ws(',', CASE WHEN has_table_privilege(c.oid, 'SELECT') THEN 'SELECT' END,
                               CASE WHEN has_table_privilege(c.oid, 'INSERT') THEN 'INSERT' END,
                               CASE WHEN has_table_privilege(c.oid, 'UPDATE') THEN 'UPDATE' END,
                               CASE WHEN has_table_privilege(c.oid, 'DELETE') THEN 'DELETE' END,
                               CASE WHEN has_table_privilege(c.oid, 'TRUNCATE') THEN 'TRUNCATE' END,
                               CASE WHEN has_table_privilege(c.oid, 'TRIGGER') THEN 'TRIGGER' END) AS privileges
           FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'r' ORDER BY c.relname`,
        [t.schema],
      );
      expect(Object.fromEntries(rows.map((r) => [r.table, r.privileges]))).toEqual({
        idem_effect_attempt: "SELECT,INSERT,UPDATE,DELETE",
        idem_event: "SELECT,INSERT",
        idem_job_lease: "SELECT,INSERT,UPDATE,DELETE",
        idem_operation: "SELECT,INSERT,UPDATE",
        idem_policy: "SELECT,INSERT",
        idem_record: "SELECT,INSERT,UPDATE",
        idem_schema_migrations: "",
      });
      // Not the owner: it cannot switch the policies off.
      await expect(client.query("ALTER TABLE idem_record DISABLE ROW LEVEL SECURITY")).rejects.toMatchObject({ code: "42501" });
    });
  });

  it("refuses to serve as a superuser or the tables' owner", async () => {
    await expect(requireLeastPrivilege(t.pool)).rejects.toThrow(/is a superuser: serve as a role that owns nothing/);
  });
});

describe("hand-written queries as the server's role", () => {
  it("see nothing of any tenant without a binding", async () => {
    const owner = await t.pool.query("SELECT count(*)::int AS n FROM idem_record");
    expect(owner.rows[0].n).toBeGreaterThanOrEqual(2);
    await asServerRole(async (client) => {
      for (const table of ["idem_record", "idem_effect_attempt", "idem_event"]) {
        const { rows } = await client.query(`SELECT count(*)::int AS n FROM ${table}`);
        expect({ table, n: rows[0].n }).toEqual({ table, n: 0 });
      }
      const updated = await client.query("UPDATE idem_record SET updated_at = now()");
      expect(updated.rowCount).toBe(0);
    });
  });

  it("bound to one tenant, cannot read, change or create another tenant's rows", async () => {
    await asServerRole(async (client) => {
      await client.query("BEGIN");
      await client.query("SELECT set_config('idem.tenant', 'acme', true)");
      const read = await client.query("SELECT tenant_id, operation_id FROM idem_record WHERE tenant_id = 'globex' OR operation_id = $1", [globexOperation]);
      expect(read.rows).toEqual([]);
      const own = await client.query("SELECT tenant_id FROM idem_record WHERE operation_id = $1", [acmeOperation]);
      expect(own.rows).toEqual([{ tenant_id: "acme" }]);
      const events = await client.query("SELECT DISTINCT tenant_id FROM idem_event");
      expect(events.rows).toEqual([{ tenant_id: "acme" }]);
      const changed = await client.query("UPDATE idem_record SET state = 'UNKNOWN' WHERE operation_id = $1", [globexOperation]);
      expect(changed.rowCount).toBe(0);
      // Moving an own row into another tenant, or writing one there, breaks the policy's WITH CHECK.
      await client.query("SAVEPOINT s");
      await expect(client.query("UPDATE idem_record SET tenant_id = 'globex' WHERE operation_id = $1", [acmeOperation])).rejects.toMatchObject({ code: "42501" });
      await client.query("ROLLBACK TO SAVEPOINT s");
      await expect(
        client.query(
          `INSERT INTO idem_event (tenant_id, operation_id, kind, generation, state, caller)
           VALUES ('globex', $1, 'FORGED', 1, 'SUCCEEDED', 'mallory')`,
          [globexOperation],
        ),
      ).rejects.toMatchObject({ code: "42501" });
      await client.query("ROLLBACK");

      // The binding ended with its transaction: the same connection sees nothing again.
      const after = await client.query("SELECT count(*)::int AS n FROM idem_record");
      expect(after.rows[0].n).toBe(0);
    });
    const untouched = await t.pool.query("SELECT tenant_id, state FROM idem_record WHERE operation_id = ANY($1) ORDER BY tenant_id", [[acmeOperation, globexOperation]]);
    expect(untouched.rows).toEqual([
      { tenant_id: "acme", state: "RESERVED" },
      { tenant_id: "globex", state: "RESERVED" },
    ]);
  });
});

describe("the registry's bindings", () => {
  it("bind each unit of work to its tenant, and operators' work to every tenant", async () => {
    const seen = (tenant: string | typeof ALL_TENANTS) =>
      t.db.transaction(tenant, async (q) => (await q.query("SELECT DISTINCT tenant_id FROM idem_record ORDER BY tenant_id")).rows.map((r) => r.tenant_id));
    expect(await seen("acme")).toEqual(["acme"]);
    expect(await seen("globex")).toEqual(["globex"]);
    expect(await seen(ALL_TENANTS)).toEqual(["acme", "globex"]);
    // A tenant id is a value, never SQL.
    expect(await seen("acme' OR true OR '")).toEqual([]);
  });
});
