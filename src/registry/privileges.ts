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
  const problem = superuser ? "is a superuser" : bypass ? "bypasses row-level security" : owned?.length ? `owns ${owned.join(", ")}` : undefined;
  if (problem) {
    throw new Error(
      `the coordinator would serve as database role ${role}, which ${problem}: serve as a role that owns nothing ` +
        "(IDEM_DB_ROLE=idem_server, granted to the login of DATABASE_URL) and migrate as the owner (IDEM_MIGRATION_DATABASE_URL); see SECURITY.md",
    );
  }
}

/**
 * Why the login behind a serving connection could leave its role and step
 * around row-level security, or undefined when it cannot: a superuser, or a
 * member of the cross-tenant role or of the tables' owner can set its role
 * to one that sees every tenant (`set_config('role', …)` works inside any
 * statement). Checked at boot; the binding is only as strong as the login.
 */
export async function servingLoginCanWiden(q: Queryable, crossTenantRole: string | undefined): Promise<string | undefined> {
  const { rows } = await q.query<{ login: string; superuser: boolean; cross_tenant: boolean; owner: boolean }>(
    `SELECT session_user AS login, r.rolsuper AS superuser,
            coalesce(pg_has_role(session_user, (SELECT oid FROM pg_roles WHERE rolname = $1), 'MEMBER'), false) AS cross_tenant,
            EXISTS (SELECT FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = 'idem_record'
                       AND pg_has_role(session_user, c.relowner, 'MEMBER')) AS owner
       FROM pg_roles r WHERE r.rolname = session_user`,
    [crossTenantRole ?? null],
  );
  const { login, superuser, cross_tenant: crossTenant, owner } = rows[0]!;
  if (superuser) return `(${login}) is a superuser`;
  if (owner) return `(${login}) is or may become the owner of the registry's tables`;
  if (crossTenant) return `(${login}) is a member of ${crossTenantRole}`;
  return undefined;
}
