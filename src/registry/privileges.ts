import type { Queryable } from "./db.js";

/**
 * Refuses to serve with a database role that could step around row-level
 * security: a superuser, a role with BYPASSRLS, or one that owns (or inherits
 * ownership of) a registry table, which could disable the policies. The
 * server serves as idem_server (IDEM_DB_ROLE) and migrates as the owner.
 */
export async function requireLeastPrivilege(q: Queryable): Promise<void> {
  const { rows } = await q.query<{ role: string; superuser: boolean; bypass: boolean; owned: string[] | null }>(
    `SELECT current_user AS role, r.rolsuper AS superuser, r.rolbypassrls AS bypass,
            (SELECT array_agg(c.relname::text ORDER BY c.relname) FROM pg_class c
              WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
                AND c.relname LIKE 'idem\\_%' AND pg_has_role(current_user, c.relowner, 'USAGE')) AS owned
       FROM pg_roles r WHERE r.rolname = current_user`,
  );
  const { role, superuser, bypass, owned } = rows[0]!;
  const problem = superuser
    ? "is a superuser"
    : bypass
      ? "bypasses row-level security"
      : owned?.length
        ? `owns ${owned.join(", ")}`
        : undefined;
  if (problem) {
    throw new Error(
      `the coordinator would serve as database role ${role}, which ${problem}: serve as a role that owns nothing ` +
        "(IDEM_DB_ROLE=idem_server, granted to the login of DATABASE_URL) and migrate as the owner (IDEM_MIGRATION_DATABASE_URL); see SECURITY.md",
    );
  }
}
