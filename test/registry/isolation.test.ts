import { randomBytes } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ALL_TENANTS } from "../../src/registry/db.js";
import { requireLeastPrivilege, servingLoginCanWiden } from "../../src/registry/privileges.js";
import { CROSS_TENANT_ROLE, SERVER_ROLE, useTestDatabase } from "../support/database.js";
import { actor, newKey, reserveInput, testRegistry } from "../support/fixtures.js";

const t = useTestDatabase();
const registry = testRegistry();
const everyone = actor();

/**
 * A login whose only membership is the server's role, as a deployment gives
 * the coordinator: unlike the superuser's `-c role=`, it cannot switch back to
 * a role that sees more.
 */
let serverLogin: { name: string; password: string };

/** A connection of that login, for hand-written queries. */
async function asServerRole<T>(work: (client: pg.Client) => Promise<T>): Promise<T> {
  const url = new URL(t.url);
  url.username = serverLogin.name;
  url.password = serverLogin.password;
  const client = new pg.Client({ connectionString: url.toString(), options: `-c search_path=${t.schema}` });
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end();
  }
}

beforeAll(async () => {
  serverLogin = { name: `idem_probe_${randomBytes(4).toString("hex")}`, password: randomBytes(12).toString("hex") };
  await t.pool.query(`CREATE ROLE ${serverLogin.name} LOGIN PASSWORD '${serverLogin.password}' IN ROLE ${SERVER_ROLE}`);
});
afterAll(async () => {
  if (serverLogin) await t.pool.query(`DROP ROLE IF EXISTS ${serverLogin.name}`);
});

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
      "idem_quota_gate",
      "idem_record",
      "idem_schema_migrations",
    ]);
    for (const row of rows) {
      expect({ table: row.table, enabled: row.enabled, forced: row.forced }).toEqual({ table: row.table, enabled: true, forced: true });
      expect(row.policies?.length ?? 0, `${row.table} has no policy`).toBeGreaterThan(0);
    }
    // The server's role gets exactly one policy per tenant table: the bound tenant, in both the rows
    // it shows (USING) and the rows it accepts (WITH CHECK), and nothing it could set to see more.
    const serving = await t.pool.query<{ table: string; policy: string }>(
      `SELECT c.relname AS table, pg_get_expr(p.polqual, p.polrelid) || ' / ' || pg_get_expr(p.polwithcheck, p.polrelid) AS policy
         FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
        WHERE c.relnamespace = $1::regnamespace AND $2::regrole = ANY (p.polroles)
          AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped)
        ORDER BY c.relname`,
      [t.schema, SERVER_ROLE],
    );
    expect(serving.rows.map((r) => r.table)).toEqual(rows.filter((r) => r.tenant_column).map((r) => r.table));
    for (const { table, policy } of serving.rows) {
      expect(policy.match(/idem\.tenant/g), `${table}: ${policy}`).toHaveLength(2);
      expect(policy, table).not.toMatch(/all_tenants| OR /i);
    }
    // And no policy of a tenant table applies to every role.
    const everyRole = await t.pool.query(
      `SELECT c.relname FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
        WHERE c.relnamespace = $1::regnamespace AND 0::oid = ANY (p.polroles) AND c.relname IN ('idem_record', 'idem_effect_attempt', 'idem_event', 'idem_quota_gate')`,
      [t.schema],
    );
    expect(everyRole.rows).toEqual([]);
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
      // Requests only: jobs, operators' switches and policy publications run as the cross-tenant role.
      expect(Object.fromEntries(rows.map((r) => [r.table, r.privileges]))).toEqual({
        idem_effect_attempt: "SELECT,INSERT,UPDATE",
        idem_event: "SELECT,INSERT",
        idem_job_lease: "",
        idem_operation: "SELECT",
        idem_policy: "SELECT",
        idem_quota_gate: "SELECT,INSERT,UPDATE",
        idem_record: "SELECT,INSERT,UPDATE",
        idem_schema_migrations: "",
      });
      // Not the owner: it cannot switch the policies off.
      await expect(client.query("ALTER TABLE idem_record DISABLE ROW LEVEL SECURITY")).rejects.toMatchObject({ code: "42501" });
    });
  });

  it("gives the cross-tenant role what jobs and operators need: it never inserts or deletes a record", async () => {
    const { rows } = await t.pool.query<{ table: string; privileges: string }>(
      `SELECT c.relname AS table,
              concat_ws(',', CASE WHEN has_table_privilege($2, c.oid, 'SELECT') THEN 'SELECT' END,
                             CASE WHEN has_table_privilege($2, c.oid, 'INSERT') THEN 'INSERT' END,
                             CASE WHEN has_table_privilege($2, c.oid, 'UPDATE') THEN 'UPDATE' END,
                             CASE WHEN has_table_privilege($2, c.oid, 'DELETE') THEN 'DELETE' END,
                             CASE WHEN has_table_privilege($2, c.oid, 'TRUNCATE') THEN 'TRUNCATE' END) AS privileges
         FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'r' ORDER BY c.relname`,
      [t.schema, CROSS_TENANT_ROLE],
    );
    expect(Object.fromEntries(rows.map((r) => [r.table, r.privileges]))).toEqual({
      idem_effect_attempt: "SELECT,DELETE",
      idem_event: "SELECT,INSERT",
      idem_job_lease: "SELECT,INSERT,UPDATE,DELETE",
      idem_operation: "SELECT,INSERT,UPDATE",
      idem_policy: "SELECT,INSERT",
      idem_quota_gate: "",
      idem_record: "SELECT,UPDATE",
      idem_schema_migrations: "",
    });
  });

  it("refuses to serve as a superuser or the tables' owner", async () => {
    await expect(requireLeastPrivilege(t.pool)).rejects.toThrow(/is a superuser: serve as a role that owns nothing/);
  });
});

describe("hand-written queries as the server's role", () => {
  it("see nothing of any tenant without a binding", async () => {
    const owner = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record");
    expect(owner.rows[0]?.n).toBeGreaterThanOrEqual(2);
    await asServerRole(async (client) => {
      for (const table of ["idem_record", "idem_effect_attempt", "idem_event"]) {
        const { rows } = await client.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`);
        expect({ table, n: rows[0]?.n }).toEqual({ table, n: 0 });
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
      const after = await client.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record");
      expect(after.rows[0]?.n).toBe(0);
    });
    const untouched = await t.pool.query("SELECT tenant_id, state FROM idem_record WHERE operation_id = ANY($1) ORDER BY tenant_id", [[acmeOperation, globexOperation]]);
    expect(untouched.rows).toEqual([
      { tenant_id: "acme", state: "RESERVED" },
      { tenant_id: "globex", state: "RESERVED" },
    ]);
  });
});

describe("a serving connection cannot widen its binding", () => {
  it("sees only its tenant after setting idem.all_tenants, and cannot become the cross-tenant role", async () => {
    await asServerRole(async (client) => {
      await client.query("BEGIN");
      await client.query("SELECT set_config('idem.tenant', 'acme', true), set_config('idem.all_tenants', 'on', true)");
      for (const table of ["idem_record", "idem_effect_attempt", "idem_event", "idem_quota_gate"]) {
        const { rows } = await client.query(`SELECT DISTINCT tenant_id FROM ${table} WHERE tenant_id <> 'acme'`);
        expect({ table, tenants: rows }).toEqual({ table, tenants: [] });
      }
      const globex = await client.query("UPDATE idem_record SET state = 'UNKNOWN' WHERE operation_id = $1", [globexOperation]);
      expect(globex.rowCount).toBe(0);
      await client.query("SAVEPOINT s");
      await expect(client.query(`SELECT set_config('role', '${CROSS_TENANT_ROLE}', false)`)).rejects.toMatchObject({ code: "42501" });
      await client.query("ROLLBACK TO SAVEPOINT s");
      await expect(client.query(`SET ROLE ${CROSS_TENANT_ROLE}`)).rejects.toMatchObject({ code: "42501" });
      await client.query("ROLLBACK");

      // Bound to nothing, even with idem.all_tenants on for the session, nothing shows.
      await client.query("SELECT set_config('idem.all_tenants', 'on', false)");
      const { rows } = await client.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record");
      expect(rows[0]?.n).toBe(0);
    });
  });

  it("is what the boot check asks of the serving login, which warns of one that could switch roles", async () => {
    await asServerRole(async (client) => expect(await servingLoginCanWiden(client, CROSS_TENANT_ROLE)).toBeUndefined());
    expect(await servingLoginCanWiden(t.pool, CROSS_TENANT_ROLE)).toMatch(/is a superuser/);
  });
});

describe("the registry's bindings", () => {
  it("bind each unit of work to its tenant, and operators' work to every tenant", async () => {
    const seen = (tenant: string | typeof ALL_TENANTS) =>
      t.db.transaction(tenant, async (q) => (await q.query<{ tenant_id: string }>("SELECT DISTINCT tenant_id FROM idem_record ORDER BY tenant_id")).rows.map((r) => r.tenant_id));
    expect(await seen("acme")).toEqual(["acme"]);
    expect(await seen("globex")).toEqual(["globex"]);
    expect(await seen(ALL_TENANTS)).toEqual(["acme", "globex"]);
    // A tenant id is a value, never SQL.
    expect(await seen("acme' OR true OR '")).toEqual([]);
  });
});
