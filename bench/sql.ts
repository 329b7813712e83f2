/**
 * The SQL of one Reserve (claim, new scope) and one Complete (SUCCEEDED), as
 * src/registry/registry.ts sends it, for the pgbench baseline: the registry's
 * own statements, imported, so that the baseline cannot drift from them.
 */
import { BIND_SQL } from "../src/registry/db.js";
import type { Statement } from "../src/registry/statement.js";
import { loadAttempts } from "../src/registry/statements/attempts.js";
import { finishReady, insertOrFind, lockRecord } from "../src/registry/statements/records.js";

/** The tenant binding each transaction starts with (sent with BEGIN in one message). */
export const BINDING = BIND_SQL;

/** The statements of one Reserve + Complete, in the order the coordinator sends them. */
export const STATEMENTS = {
  reserve: insertOrFind,
  lock: lockRecord,
  attempts: loadAttempts,
  finish: finishReady,
};

const squash = (text: string) => text.replace(/\s+/g, " ").trim();

/** What one benchmark operation writes: the same values on both sides. */
export interface OperationValues {
  tenant: string;
  principal: string;
  operation: string;
  apiRevision: number;
  schemaRevision: number;
  leaseMs: number;
  keepMs: number;
  quota: number;
  caller: string;
  keyId: string;
  /** The snapshot Complete stores; its body is sealed (nonce ‖ ciphertext ‖ tag) by the coordinator. */
  snapshot: { statusCode: number; mediaType: string; body: Uint8Array };
}

/** AES-256-GCM framing of a sealed body (src/registry/sealing.ts): 12-byte nonce, 16-byte tag. */
const SEAL_OVERHEAD = 12 + 16;

const hex = (bytes: Uint8Array) => `\\x${Buffer.from(bytes).toString("hex")}`;

/**
 * A pgbench script whose one transaction is one Reserve and one Complete, for
 * `pgbench -M prepared`: the statements above with each `$n` replaced by a
 * pgbench variable (`:tenant`), which pgbench binds as a parameter of a
 * statement it prepares once per connection, untyped until PostgreSQL
 * resolves it from its context, as node-postgres binds the coordinator's.
 * The values the coordinator mints per request are computed in SQL from
 * parameters: the scope from a random seed (a new scope every time), a
 * time-ordered operation id like the coordinator's UUIDv7 (a per-client
 * counter over the run's start, `start_ms`, and the seed), an acquisition id
 * from the seed.
 *
 * Every unit of work is a transaction bound to its tenant as
 * src/registry/db.ts does it, and grouped into round trips as the registry
 * sends it: Reserve is one pipeline (BEGIN, the binding, the insert-or-find
 * with its quota count, and COMMIT); Complete, of a record the coordinator
 * reserved, one too (BEGIN, the binding, the locking read, the attempts, the
 * guarded finish and COMMIT).
 * pgbench cannot read a result inside a pipeline (`\gset`), so Complete
 * names the operation by the same expression of the seed, and the generation
 * a new record starts at.
 */
export function pgbenchScript(v: OperationValues): { script: string; pipelines: string[][]; variables: Record<string, string> } {
  const seed = ":seed::text";
  const scope = `sha256(convert_to('scope:' || ${seed}, 'UTF8'))`;
  const operationId = `(lpad(to_hex(:start_ms::bigint + :n::bigint), 12, '0') || '7' || substr(md5(${seed}), 1, 3) || '8' || substr(md5(${seed}), 4, 15))::uuid`;
  const acquisitionId = `md5('acquisition:' || ${seed})::uuid`;
  /** A statement's text with each parameter written as the pgbench expression given for it. */
  const bind = <Values extends object>(statement: Statement<Values>, values: { [name in keyof Values]: string }) =>
    statement.text.replace(/\$(\d+)/g, (_, n: string) => {
      const name = statement.parameters[Number(n) - 1]!;
      const value = (values as Record<string, string | undefined>)[name];
      if (value === undefined) throw new Error(`no pgbench binding for :${name} of ${statement.name}`);
      return value;
    });
  // One principal per client, as the coordinator's side has one per worker.
  const principal = "(:principal::text || '-' || :client_id::text)";
  const owner = { state: ":state", leaseMs: ":lease_ms", acquisitionId, writerEpoch: ":writer_epoch" };
  const reserve = bind(STATEMENTS.reserve, {
    tenant: ":tenant",
    scope,
    operationId,
    principal,
    operation: ":operation",
    apiRevision: ":api_revision",
    schemaRevision: ":schema_revision",
    fingerprint: ":fingerprint",
    ...owner,
    caller: ":caller",
    quota: ":quota",
  });
  const ref = { tenant: ":tenant", operationId };
  const finish = bind(STATEMENTS.finish, {
    ...ref,
    generation: ":generation",
    operation: ":operation",
    apiRevision: ":api_revision",
    schemaRevision: ":schema_revision",
    caller: ":caller",
    eventDetail: ":event_detail",
    outcome: ":outcome",
    keepMs: ":keep_ms",
    // pgbench cannot define an empty variable: the empty location and business version are written as such.
    snapshotStatus: ":status_code",
    snapshotMediaType: ":media_type",
    snapshotLocation: "''",
    snapshotBusinessVersion: "''",
    snapshotHeaders: ":headers",
    snapshotBody: ":snapshot_body",
    snapshotDigest: ":snapshot_digest",
    snapshotKeyId: ":key_id",
  });
  // The binding as src/registry/db.ts sends it: the tenant, and cross-tenant access off.
  const binding = BINDING.replace("$1", ":tenant").replace("$2", "'off'");
  // Reserve's round trip, then Complete's: each statement with its pgbench variables, without its semicolon.
  const pipelines = [
    ["BEGIN", binding, reserve, "COMMIT"],
    ["BEGIN", binding, bind(STATEMENTS.lock, ref), bind(STATEMENTS.attempts, ref), finish, "COMMIT"],
  ];
  const script = [
    "-- One Reserve (claim, new scope) and one Complete (SUCCEEDED) of the idempotency coordinator, for pgbench -M prepared:",
    "-- the statements of src/registry/registry.ts (bench/sql.ts), written by bench/run.ts.",
    "\\set seed random(1, 9223372036854775806)",
    "\\set n :n + 1",
    ...pipelines.flatMap((statements) => ["\\startpipeline", ...statements.map((statement) => `${statement};`), "\\endpipeline"]),
    "",
  ].join("\n");
  const sealedBody = new Uint8Array(v.snapshot.body.byteLength + SEAL_OVERHEAD).map(() => Math.floor(Math.random() * 256));
  const variables: Record<string, string> = {
    tenant: v.tenant,
    principal: v.principal,
    operation: v.operation,
    api_revision: String(v.apiRevision),
    schema_revision: String(v.schemaRevision),
    fingerprint: hex(new Uint8Array(32).fill(0xf1)),
    state: "EXECUTING",
    lease_ms: String(v.leaseMs),
    writer_epoch: "0",
    caller: v.caller,
    quota: String(v.quota),
    generation: "1",
    event_detail: JSON.stringify({ outcome: "SUCCEEDED" }),
    outcome: "SUCCEEDED",
    keep_ms: String(v.keepMs),
    status_code: String(v.snapshot.statusCode),
    media_type: v.snapshot.mediaType,
    headers: "[]",
    snapshot_body: hex(sealedBody),
    snapshot_digest: hex(new Uint8Array(32).fill(0xd1)),
    key_id: v.keyId,
    // Each client's operation counter (the time part of its operation ids, over start_ms).
    n: "0",
  };
  return { script, pipelines, variables };
}

/** The variables of one pgbench run: the script's, and the run's start as the time base of its operation ids. */
export function runVariables(variables: Record<string, string>): Record<string, string> {
  return { ...variables, start_ms: String(Date.now()) };
}

/** Which step of an operation a pg_stat_statements entry is, from its text. */
export function classify(query: string): "reserve" | "begin" | "bind" | "lock" | "attempts" | "finish" | "commit" | "probe" | "other" {
  const q = squash(query);
  // The coordinator's readiness probe (src/registry/reachability.ts), once a second, as pg_stat_statements normalizes it.
  if (q === "SELECT $1") return "probe";
  if (/^BEGIN\b/i.test(q)) return "begin";
  if (/^COMMIT\b/i.test(q)) return "commit";
  // The tenant binding: its parameters are numbered differently when the tenant is a literal (the coordinator's simple-protocol BEGIN) or a parameter (pgbench).
  if (/^SELECT set_config\(.*\), set_config\(/.test(q)) return "bind";
  if (q.startsWith("WITH inserted AS (") && q.includes("INSERT INTO idem_record")) return "reserve";
  if (q.startsWith("WITH updated AS ( UPDATE idem_record SET state =") && q.includes("snapshot_digest =")) return "finish";
  if (q.includes("FROM idem_record") && /FOR UPDATE$/.test(q) && q.includes("operation_id =")) return "lock";
  if (q.includes("FROM idem_effect_attempt") && q.endsWith("ORDER BY attempt_number")) return "attempts";
  return "other";
}
