import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { useTestDatabase } from "../support/database.js";
import { everyStatement, type MadeStatement } from "../support/statements.js";

/**
 * The registry's readiness for sharding by tenant (docs/scaling.md, "Sharding
 * the registry on Citus"), read from the migrated schema in the catalog and
 * from the plans PostgreSQL makes of the statements layer's statements: a
 * migration or a statement that would stop a table from being distributed by
 * tenant_id, or a request from being answered by one tenant's shard, fails
 * here.
 */

/** Every statement the statements layer makes, exported or not (support/statements.ts). */
const made = vi.hoisted(() => [] as MadeStatement[]);
vi.mock("../../src/registry/statement.js", async (importOriginal) => (await import("../support/statements.js")).recordingStatements(await importOriginal(), made));

const t = useTestDatabase();

/**
 * The tables distributed by tenant_id, colocated with idem_record (the
 * order of the create_distributed_table calls in docs/scaling.md). Each has
 * a tenant_id column, and every row of one tenant lives in one shard group.
 */
const DISTRIBUTED: Record<string, string> = {
  idem_record: "one row per scope: the record, its state, lease and snapshot",
  idem_effect_attempt: "a record's effect attempts, referencing it by (tenant_id, operation_id)",
  idem_event: "the append-only event log; operation-level events are tenant ''",
  idem_quota_gate: "each principal's count of unfinished records, kept by the statements that change records",
};

/**
 * The tables without tenant_id: small, written by operators or by one job
 * replica at a time, read by every coordinator. Reference tables (a copy on
 * every node) in the plan.
 */
const REFERENCE: Record<string, string> = {
  idem_policy: "published policy revisions: a few rows per operation, never changed",
  idem_operation: "one row of switches (mode, writer epoch) per operation and API revision",
  idem_job_lease: "one leader lease per background job (the recoverer, the retention sweep)",
  idem_schema_migrations: "one row per applied migration",
};

/**
 * The request path: the statements of Reserve, Claim, RenewLease,
 * RecordEffectAttempt, ResolveEffectAttempt, Complete, Release, Abandon and
 * Lookup, alone or coalesced into batches (src/registry/commands/,
 * batching.ts). Each must reach one tenant's rows only, named by its
 * `tenant` parameter.
 */
const REQUEST_PATH: Record<string, string> = {
  insertOrFind: "Reserve: the guarded insert, its ACCEPTED event and the principal's count against its quota",
  findByScope: "Reserve: a record committed after the insert's snapshot",
  takeOverByScope: "Reserve: taking over a record whose lease ended with nothing possible",
  recycleByScope: "Reserve: a reusable tombstone made a new operation, counted against the quota",
  markUnknownByScope: "Reserve: an ended lease with a possible effect",
  appendEvent: "Reserve (a conflict logged) and Claim RECOVER (the UNKNOWN step)",
  lockRecord: "Claim, RenewLease, RecordEffectAttempt, ResolveEffectAttempt, Complete, Release, Abandon: the record's lock",
  ownerMoved: "Reserve waiting for its owner: the recheck without a lock",
  loadAttempts: "the same, and Reserve's declared effects: the record's attempts under its lock",
  insertAttempt: "RecordEffectAttempt and Reserve's declared effects",
  resolveAttempt: "ResolveEffectAttempt and Complete's resolutions",
  claimOwnership: "Claim OWNER",
  renewLease: "RenewLease, and Claim OWNER again",
  claimTakeover: "Claim TAKEOVER",
  claimRecovery: "Claim RECOVER",
  markEffectPossible: "RecordEffectAttempt and Reserve's declared effects",
  setEffectPossible: "ResolveEffectAttempt and Complete's resolutions",
  finish: "Complete",
  finishReady: "Complete in one round trip, for a record this process handed to its owner",
  release: "Release, and Abandon with nothing possible",
  handToRecovery: "Abandon with a possible effect",
  viewById: "Lookup by operation id",
  viewByScope: "Lookup by scope",
  insertOrFindMany: "coalesced Reserves: the guarded insert of a batch, with the principals' counts",
  lockRecords: "coalesced Completes: the batch's locks",
  loadAttemptsMany: "coalesced Completes: the batch's attempts",
  finishMany: "coalesced Completes: the batch's finish",
};

/**
 * Every other statement: operators' work, background jobs, listings across
 * tenants, the policy cache. `reach` is what its plan touches: one tenant's
 * rows, every tenant's (a statement sent to every shard), or reference tables
 * only. The statements that reach every tenant are the ones docs/scaling.md
 * lists as cross-tenant.
 */
const ELSEWHERE: Record<string, { does: string; reach: Reach }> = {
  reconcile: { does: "Reconcile: an operator settles one UNKNOWN record", reach: "one tenant" },
  reopen: { does: "Reconcile with reopen: an operator opens one UNKNOWN record to a fresh execution", reach: "one tenant" },
  resolveOpenAttempts: { does: "Reconcile with reopen: the record's open attempts resolved NO_EFFECT", reach: "one tenant" },
  recoverableViews: { does: "ListRecoverable: recovery workers' listing, over the tenants it names or all", reach: "every tenant" },
  listedViews: { does: "ListRecords: operators' listing, over the tenants it names or all", reach: "every tenant" },
  eventsAfter: { does: "StreamEvents: the event log in commit order, of one tenant or all", reach: "every tenant" },
  recentEvents: { does: "the operators' console: recent events of some kinds", reach: "every tenant" },
  census: { does: "metrics and operators: records per state", reach: "every tenant" },
  newestViews: { does: "the operators' console: records by state, newest first", reach: "every tenant" },
  viewsByOperationId: { does: "the operators' console: a search by operation id over the tenants it names or all", reach: "every tenant" },
  unknownViews: { does: "the operators' console: the UNKNOWN queue, longest UNKNOWN first", reach: "every tenant" },
  recordEvents: { does: "the operators' console: one record's timeline", reach: "one tenant" },
  eventCounts: { does: "the operators' console: events per kind over the last minutes (charts)", reach: "every tenant" },
  unknownSpells: { does: "the operators' console: UNKNOWN records and the oldest one's age over the last minutes (charts)", reach: "every tenant" },
  recoverExpiredLeases: { does: "the recoverer (background job): records whose lease ended", reach: "every tenant" },
  tombstoneBatch: { does: "the retention sweep (background job): records whose retention ended", reach: "every tenant" },
  holdJobLease: { does: "background jobs: take or keep a job's leader lease", reach: "reference tables" },
  releaseJobLease: { does: "background jobs: give a job's lease up on shutdown", reach: "reference tables" },
  ensureOperation: { does: "operators: an operation's switch row exists before it is locked", reach: "reference tables" },
  lockOperation: { does: "operators: publications and switch changes of one operation one after the other", reach: "reference tables" },
  revisionsOf: { does: "operators: the published revisions of one operation, when publishing", reach: "reference tables" },
  insertPolicy: { does: "operators: publish a policy revision", reach: "reference tables" },
  changeControl: { does: "operators: set a mode or raise a writer epoch, with its operation-level event (tenant '')", reach: "one tenant" },
  listPolicies: { does: "the policy cache's load, in the background and when a request names an operation not loaded yet", reach: "reference tables" },
  listControls: { does: "the policy cache's load: every operation's switches", reach: "reference tables" },
};

/** The triggers on the tables, each with what it does: they only refuse. */
const TRIGGERS: Record<string, string> = {
  "idem_event.idem_event_append_only": "refuses UPDATE and DELETE of events",
  "idem_policy.idem_policy_immutable": "refuses UPDATE and DELETE of published revisions",
};

type Reach = "one tenant" | "every tenant" | "reference tables";

/** The tables of the test's schema, with whether each has a tenant_id column (information_schema). */
async function tables(): Promise<Map<string, boolean>> {
  const { rows } = await t.pool.query<{ table: string; tenant: boolean }>(
    `SELECT c.relname AS table,
            EXISTS (SELECT FROM information_schema.columns col
                     WHERE col.table_schema = n.nspname AND col.table_name = c.relname AND col.column_name = 'tenant_id') AS tenant
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
      ORDER BY c.relname`,
  );
  return new Map(rows.map((r) => [r.table, r.tenant]));
}

describe("the tables", () => {
  it("are the distributed ones, each with tenant_id, and the reference ones, without: a new table must join one list", async () => {
    const found = await tables();
    expect(
      [...found].filter(([, tenant]) => tenant).map(([table]) => table),
      "tables with tenant_id",
    ).toEqual(Object.keys(DISTRIBUTED).sort());
    expect(
      [...found].filter(([, tenant]) => !tenant).map(([table]) => table),
      "tables without tenant_id",
    ).toEqual(Object.keys(REFERENCE).sort());
  });

  it("have one distribution column: tenant_id of one type and collation, never NULL", async () => {
    const { rows } = await t.pool.query<{ table: string; type: string; collation: string | null; nullable: string }>(
      `SELECT table_name AS table, data_type AS type, collation_name AS collation, is_nullable AS nullable
         FROM information_schema.columns WHERE table_schema = current_schema() AND column_name = 'tenant_id' ORDER BY table_name`,
    );
    expect(rows.map((r) => r.table)).toEqual(Object.keys(DISTRIBUTED).sort());
    // Colocated tables need distribution columns of one type and one collation.
    expect(new Set(rows.map((r) => `${r.type} ${r.collation ?? "(default collation)"}`)).size).toBe(1);
    expect(rows.filter((r) => r.nullable !== "NO").map((r) => r.table)).toEqual([]);
  });

  it("lead every primary key and unique index of a tenant table with tenant_id", async () => {
    // Indexes (pg_index) and the constraints they back (pg_constraint): a unique
    // index made without a constraint counts as much as a constraint.
    const indexes = await t.pool.query<{ table: string; index: string; columns: Array<string | null> }>(
      `SELECT c.relname AS table, i.relname AS index,
              ARRAY(SELECT a.attname::text FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
                      LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
                     ORDER BY k.n) AS columns
         FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid
        WHERE c.relnamespace = current_schema()::regnamespace AND (x.indisunique OR x.indisprimary)
        ORDER BY 1, 2`,
    );
    const constraints = await t.pool.query<{ table: string; constraint: string; kind: string; columns: string[] }>(
      `SELECT c.relname AS table, k.conname AS constraint, k.contype::text AS kind,
              ARRAY(SELECT a.attname::text FROM unnest(k.conkey) WITH ORDINALITY AS u(attnum, n)
                      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = u.attnum
                     ORDER BY u.n) AS columns
         FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE c.relnamespace = current_schema()::regnamespace AND k.contype IN ('p', 'u', 'x')
        ORDER BY 1, 2`,
    );
    const tenantTables = new Set(Object.keys(DISTRIBUTED));
    const unique = [
      ...indexes.rows.map((r) => ({ table: r.table, name: `index ${r.index}`, columns: r.columns })),
      ...constraints.rows.map((r) => ({ table: r.table, name: `constraint ${r.constraint} (${r.kind})`, columns: r.columns })),
    ].filter((u) => tenantTables.has(u.table));
    // The schema has some of each; an empty list would mean the queries read nothing.
    expect(unique.length).toBeGreaterThanOrEqual(tenantTables.size);
    expect(unique.filter((u) => u.columns[0] !== "tenant_id").map((u) => `${u.table}: ${u.name} on (${u.columns.join(", ")})`)).toEqual([]);
  });

  it("join tenant tables by foreign keys that carry tenant_id to tenant_id, and no reference table points at a tenant table", async () => {
    const { rows } = await t.pool.query<{ constraint: string; from: string; to: string; pairs: Array<[string, string]> }>(
      `SELECT k.conname AS constraint, c.relname AS from, f.relname AS to,
              ARRAY(SELECT json_build_array(a.attname, b.attname) FROM unnest(k.conkey, k.confkey) AS u(fromnum, tonum)
                      JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.fromnum
                      JOIN pg_attribute b ON b.attrelid = k.confrelid AND b.attnum = u.tonum) AS pairs
         FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_class f ON f.oid = k.confrelid
        WHERE k.contype = 'f' AND c.relnamespace = current_schema()::regnamespace
        ORDER BY 1`,
    );
    const tenantTables = new Set(Object.keys(DISTRIBUTED));
    const between = rows.filter((r) => tenantTables.has(r.from) && tenantTables.has(r.to));
    // A foreign key between distributed tables must join their distribution columns.
    expect(between.filter((r) => !r.pairs.some(([from, to]) => from === "tenant_id" && to === "tenant_id")).map((r) => `${r.from}.${r.constraint}`)).toEqual([]);
    // A reference table (a copy on every node) cannot reference a distributed one.
    expect(rows.filter((r) => !tenantTables.has(r.from) && tenantTables.has(r.to)).map((r) => `${r.from}.${r.constraint}`)).toEqual([]);
  });

  it("number rows of tenant tables by identity columns of bigint only", async () => {
    // Distributed, an identity column takes its values from a range of its own
    // on each node, which only a bigint has room for.
    const { rows } = await t.pool.query<{ column: string; type: string }>(
      `SELECT table_name || '.' || column_name AS column, data_type AS type
         FROM information_schema.columns WHERE table_schema = current_schema() AND (is_identity = 'YES' OR column_default LIKE 'nextval(%')`,
    );
    expect(rows.filter((r) => DISTRIBUTED[r.column.split(".")[0]!] !== undefined && r.type !== "bigint")).toEqual([]);
  });

  it("have only the known triggers, none of which takes an advisory lock or skips locked rows", async () => {
    const { rows } = await t.pool.query<{ trigger: string }>(
      `SELECT c.relname || '.' || g.tgname AS trigger
         FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
        WHERE c.relnamespace = current_schema()::regnamespace AND NOT g.tgisinternal
        ORDER BY 1`,
    );
    expect(rows.map((r) => r.trigger)).toEqual(Object.keys(TRIGGERS).sort());
    // Any function of the schema, whoever calls it (triggers, idem_count_within_quota on the request path).
    const functions = await t.pool.query<{ name: string; source: string }>(
      `SELECT proname AS name, prosrc AS source FROM pg_proc WHERE pronamespace = current_schema()::regnamespace`,
    );
    expect(functions.rows.length).toBeGreaterThan(0);
    expect(functions.rows.filter((f) => UNSHARDABLE_LOCKING.test(f.source)).map((f) => f.name)).toEqual([]);
  });
});

/**
 * Advisory locks hold on one node only; SKIP LOCKED makes an answer depend on
 * what other transactions hold, and row locks across shards are refused.
 * Neither belongs on the request path.
 */
const UNSHARDABLE_LOCKING = /pg_advisory|pg_try_advisory|skip\s+locked/i;

/** A node of a plan as EXPLAIN (FORMAT JSON, VERBOSE) shows it. */
interface PlanNode {
  "Node Type": string;
  "Relation Name"?: string;
  Alias?: string;
  Operation?: string;
  "CTE Name"?: string;
  "Subplan Name"?: string;
  Output?: string[];
  Plans?: PlanNode[];
  [condition: string]: unknown;
}

/** Where each of a plan's accesses to a tenant table is pinned: `$n` (a parameter), a literal, or nowhere (undefined). */
interface TenantAccess {
  relation: string;
  alias: string;
  pin: string | undefined;
}

/**
 * The generic plan of a statement (the plan of a prepared statement, with
 * its parameters as `$1`, `$2`, …), as the registry's prepared statements
 * are planned once a connection has run them a few times.
 */
async function genericPlan(client: pg.PoolClient, text: string, parameters: number): Promise<PlanNode> {
  await client.query(`PREPARE sharding_probe AS ${text}`);
  try {
    const args = parameters > 0 ? `(${Array.from({ length: parameters }, () => "NULL").join(", ")})` : "";
    const { rows } = await client.query<{ "QUERY PLAN": Array<{ Plan: PlanNode }> }>(`EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE sharding_probe${args}`);
    return rows[0]!["QUERY PLAN"][0]!.Plan;
  } finally {
    await client.query("DEALLOCATE sharding_probe");
  }
}

/** The conditions a plan node may carry. */
const CONDITIONS = ["Index Cond", "Recheck Cond", "Filter", "Join Filter", "Hash Cond", "Merge Cond", "TID Cond", "One-Time Filter"];

/**
 * The conjuncts of a condition as PostgreSQL prints it: `((a = b) AND (c =
 * d))` gives `a = b` and `c = d`. A disjunction stays whole (it pins nothing:
 * `($1 IS NULL) OR (x.tenant_id = $1)` is no tenant equality).
 */
function conjuncts(condition: string): string[] {
  const unwrapped = stripParentheses(condition.trim());
  const parts = splitTopLevel(unwrapped, " AND ");
  if (parts.length === 1) return [unwrapped];
  return parts.flatMap(conjuncts);
}

/** `(x)` without its parentheses when they enclose all of it. */
function stripParentheses(text: string): string {
  while (text.startsWith("(") && closingOf(text, 0) === text.length - 1) text = text.slice(1, -1).trim();
  return text;
}

/** The index of the parenthesis closing the one at `open`, skipping quoted text. */
function closingOf(text: string, open: number): number {
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    const c = text[i];
    if (c === "'") i = text.indexOf("'", i + 1);
    else if (c === "(") depth++;
    else if (c === ")" && --depth === 0) return i;
    if (i < 0) return -1;
  }
  return -1;
}

/** `text` split at `separator` where it stands outside parentheses and quotes. */
function splitTopLevel(text: string, separator: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "'") {
      i = text.indexOf("'", i + 1);
      if (i < 0) break;
    } else if (c === "(") depth++;
    else if (c === ")") depth--;
    else if (depth === 0 && text.startsWith(separator, i)) {
      parts.push(text.slice(start, i));
      start = i + separator.length;
      i = start - 1;
    }
  }
  parts.push(text.slice(start));
  return parts.map((p) => p.trim());
}

/** `x.tenant_id = <value>` or `<value> = x.tenant_id`, with its sides; undefined for anything else. */
function tenantEquality(conjunct: string): { alias: string; value: string } | undefined {
  const side = String.raw`(\$\d+|'(?:[^']|'')*'::text|[a-z_][a-z0-9_$]*\.tenant_id)`;
  const left = new RegExp(String.raw`^([a-z_][a-z0-9_$]*)\.tenant_id = ${side}$`).exec(conjunct);
  if (left) return { alias: left[1]!, value: left[2]! };
  const right = new RegExp(String.raw`^${side} = ([a-z_][a-z0-9_$]*)\.tenant_id$`).exec(conjunct);
  if (right) return { alias: right[2]!, value: right[1]! };
  return undefined;
}

/**
 * Where the plan's accesses to tenant tables are pinned to one tenant. An
 * access is pinned by a conjunct `alias.tenant_id = $n` (or a literal), by
 * `alias.tenant_id = other.tenant_id` with `other` pinned, and, for the rows
 * an INSERT writes, by a tenant_id taken from a parameter, a literal or
 * pinned rows (a data-modifying CTE's). UPDATE and DELETE write the rows of
 * the scan under them, pinned as that scan is.
 */
function tenantAccesses(plan: PlanNode, tenantTables: ReadonlyMap<string, number>): TenantAccess[] {
  const nodes: Array<{ node: PlanNode; cte: string | undefined }> = [];
  const walk = (node: PlanNode, cte: string | undefined) => {
    const subplan = node["Subplan Name"];
    const inner = subplan?.startsWith("CTE ") ? subplan.slice(4) : cte;
    nodes.push({ node, cte: inner });
    for (const child of node.Plans ?? []) walk(child, inner);
  };
  walk(plan, undefined);

  // Parameters an InitPlan returns are printed like the statement's own ($0, $1, …): they pin nothing.
  const internal = new Set(nodes.flatMap(({ node }) => [...(node["Subplan Name"] ?? "").matchAll(/\$\d+/g)].map((m) => m[0])));
  const equalities = nodes.flatMap(({ node }) =>
    CONDITIONS.flatMap((key) => (typeof node[key] === "string" ? conjuncts(node[key]) : []))
      .map(tenantEquality)
      .filter((e) => e !== undefined),
  );
  const fixed = (value: string) => (value.startsWith("'") || (value.startsWith("$") && !internal.has(value)) ? value : undefined);

  const pins = new Map<string, string>();
  const accesses = nodes.filter(({ node }) => node["Relation Name"] !== undefined && tenantTables.has(node["Relation Name"]));
  for (let changed = true; changed;) {
    changed = false;
    const pin = (alias: string, value: string | undefined) => {
      if (value === undefined || pins.has(alias)) return;
      pins.set(alias, value);
      changed = true;
    };
    for (const { alias, value } of equalities) {
      if (value.endsWith(".tenant_id")) {
        const other = value.slice(0, -".tenant_id".length);
        pin(alias, pins.get(other));
        pin(other, pins.get(alias));
      } else pin(alias, fixed(value));
    }
    // The rows of a CTE are pinned when every access to a tenant table inside it is, to one tenant.
    for (const { node } of nodes) {
      const cte = node["CTE Name"];
      if (node["Node Type"] !== "CTE Scan" || cte === undefined || node.Alias === undefined) continue;
      const inside = accesses.filter((a) => a.cte === cte).map((a) => pins.get(a.node.Alias!));
      if (inside.length > 0 && inside.every((p) => p !== undefined && p === inside[0])) pin(node.Alias, inside[0]);
    }
    // An INSERT's rows: the tenant_id its subplan produces (its output lists every column in the table's order).
    for (const { node } of accesses) {
      if (node["Node Type"] !== "ModifyTable" || node.Operation !== "Insert") continue;
      const value = node.Plans?.[0]?.Output?.[tenantTables.get(node["Relation Name"]!)!];
      if (value === undefined) continue;
      pin(node.Alias!, value.endsWith(".tenant_id") ? pins.get(value.slice(0, -".tenant_id".length)) : fixed(value));
    }
  }
  return accesses.map(({ node }) => ({ relation: node["Relation Name"]!, alias: node.Alias!, pin: pins.get(node.Alias!) }));
}

/** What a statement's plan reaches: one tenant (and which parameter or literal names it), every tenant, or reference tables only. */
function reachOf(accesses: readonly TenantAccess[]): { reach: Reach; pin?: string } {
  if (accesses.length === 0) return { reach: "reference tables" };
  const pin = accesses[0]!.pin;
  if (pin !== undefined && accesses.every((a) => a.pin === pin)) return { reach: "one tenant", pin };
  return { reach: "every tenant" };
}

describe("the statements layer", () => {
  let client: pg.PoolClient;
  /** Tenant tables, each with the position of tenant_id among its columns (an INSERT's subplan lists them in this order). */
  let tenantTables: Map<string, number>;
  const statements = new Map<string, { text: string; parameters: readonly string[] }>();
  const reached = new Map<string, { reach: Reach; pin?: string; accesses: TenantAccess[] }>();

  beforeAll(async () => {
    for (const [name, s] of await everyStatement(made)) statements.set(name, s);

    const { rows } = await t.pool.query<{ table: string; position: number }>(
      `SELECT c.relname AS table,
              (SELECT count(*)::int FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                  AND a.attnum < (SELECT attnum FROM pg_attribute WHERE attrelid = c.oid AND attname = 'tenant_id')) AS position
         FROM pg_class c
        WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
          AND EXISTS (SELECT FROM pg_attribute WHERE attrelid = c.oid AND attname = 'tenant_id' AND NOT attisdropped)`,
    );
    tenantTables = new Map(rows.map((r) => [r.table, r.position]));

    client = await t.pool.connect();
    // The plan a prepared statement keeps: parameters stay parameters, nothing is folded from their values.
    await client.query("SET plan_cache_mode = force_generic_plan");
    for (const [name, s] of statements) {
      const accesses = tenantAccesses(await genericPlan(client, s.text, s.parameters.length), tenantTables);
      reached.set(name, { ...reachOf(accesses), accesses });
    }
  });
  afterAll(() => client?.release());

  it("classifies every statement once: on the request path or elsewhere", () => {
    expect(statements.size).toBeGreaterThan(0);
    const named = [...statements.keys()].sort();
    expect(
      named.filter((n) => !(n in REQUEST_PATH) && !(n in ELSEWHERE)),
      "statements to classify in REQUEST_PATH or ELSEWHERE",
    ).toEqual([]);
    expect(
      named.filter((n) => n in REQUEST_PATH && n in ELSEWHERE),
      "statements in both lists",
    ).toEqual([]);
    expect(
      [...Object.keys(REQUEST_PATH), ...Object.keys(ELSEWHERE)].filter((n) => !statements.has(n)),
      "listed statements that no longer exist",
    ).toEqual([]);
  });

  it("routes every request-path statement by one tenant: each access to a tenant table pinned by tenant_id = the tenant parameter", () => {
    const unrouted = Object.keys(REQUEST_PATH).flatMap((name) => {
      const { parameters } = statements.get(name)!;
      const { reach, pin, accesses } = reached.get(name)!;
      const tenantParameter = `$${parameters.indexOf("tenant") + 1}`;
      if (reach === "one tenant" && pin === tenantParameter) return [];
      return [`${name}: ${accesses.map((a) => `${a.relation} ${a.alias} pinned by ${a.pin ?? "nothing"}`).join("; ")} (tenant is ${tenantParameter})`];
    });
    expect(unrouted).toEqual([]);
    // Every request-path statement reaches a tenant table: a request is about one tenant's records.
    expect(Object.keys(REQUEST_PATH).filter((name) => reached.get(name)!.reach === "reference tables")).toEqual([]);
  });

  it("reaches, elsewhere, as far as each statement is listed to reach: the ones across every tenant are the known ones", () => {
    expect(Object.fromEntries(Object.keys(ELSEWHERE).map((name) => [name, reached.get(name)!.reach]))).toEqual(
      Object.fromEntries(Object.entries(ELSEWHERE).map(([name, { reach }]) => [name, reach])),
    );
  });

  it("takes no advisory lock and skips no locked row on the request path", () => {
    expect(Object.keys(REQUEST_PATH).filter((name) => UNSHARDABLE_LOCKING.test(statements.get(name)!.text))).toEqual([]);
  });

  it("sees through the plan a statement that forgets its tenant (the check checks)", async () => {
    // An access pinned only inside a disjunction, one pinned by ANY, and one pinned through a join.
    const probe = async (text: string, parameters: number) => reachOf(tenantAccesses(await genericPlan(client, text, parameters), tenantTables));
    expect(await probe("SELECT 1 FROM idem_record WHERE ($1::text IS NULL OR tenant_id = $1) AND scope = $2", 2)).toEqual({ reach: "every tenant" });
    expect(await probe("SELECT 1 FROM idem_record WHERE tenant_id = ANY($1::text[]) AND operation_id = $2", 2)).toEqual({ reach: "every tenant" });
    expect(await probe("SELECT 1 FROM idem_effect_attempt WHERE operation_id = $1", 1)).toEqual({ reach: "every tenant" });
    expect(
      await probe("SELECT 1 FROM idem_record r JOIN idem_effect_attempt a ON a.tenant_id = r.tenant_id AND a.operation_id = r.operation_id WHERE r.tenant_id = $1", 1),
    ).toEqual({ reach: "one tenant", pin: "$1" });
    expect(
      await probe(
        "WITH x AS (UPDATE idem_record SET updated_at = now() WHERE operation_id = $1 RETURNING tenant_id, operation_id) INSERT INTO idem_event (tenant_id, operation_id, kind, caller) SELECT tenant_id, operation_id, 'K', 'c' FROM x",
        1,
      ),
    ).toEqual({ reach: "every tenant" });
  });
});
