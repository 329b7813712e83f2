import { randomBytes } from "node:crypto";
import { afterAll } from "vitest";
import type { TestDatabase } from "./database.js";
import { SERVER_ROLE } from "./database.js";

/**
 * The database role of a co-located business service, as docs/adopting.md
 * (section 5) tells to make one: a member of idem_server, so that it holds
 * the serving role's privileges on the registry's tables and is bound by
 * their row-level security, plus the privileges on its own tables. Roles are
 * the cluster's: each test file gets its own, dropped after its last test.
 * Connect as it with `t.openPool({ role })`.
 */
export function useServiceRole(t: TestDatabase): { role: string; grant(...tables: string[]): Promise<void> } {
  const role = `idem_test_service_${randomBytes(4).toString("hex")}`;
  let created = false;
  afterAll(async () => {
    if (!created) return;
    await t.pool.query(`DROP OWNED BY ${role}`);
    await t.pool.query(`DROP ROLE ${role}`);
  });
  return {
    role,
    /** Creates the role on first use, and grants it `tables` (and their sequences) to read and write. */
    async grant(...tables: string[]) {
      if (!created) {
        await t.pool.query(`CREATE ROLE ${role} NOLOGIN NOSUPERUSER NOBYPASSRLS`);
        created = true;
        await t.pool.query(`GRANT ${SERVER_ROLE} TO ${role}`);
        await t.pool.query(`GRANT USAGE ON SCHEMA ${t.schema} TO ${role}`);
      }
      for (const table of tables) {
        await t.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ${table} TO ${role}`);
        const { rows } = await t.pool.query<{ sequence: string | null }>(
          "SELECT pg_get_serial_sequence($1, column_name) AS sequence FROM information_schema.columns WHERE table_schema = $2 AND table_name = $1",
          [table, t.schema],
        );
        for (const { sequence } of rows) if (sequence) await t.pool.query(`GRANT USAGE ON SEQUENCE ${sequence} TO ${role}`);
      }
    },
  };
}
