/**
 * The database level of `npm run bench`: what one Reserve + Complete costs
 * PostgreSQL itself, beside a bare one-row insert measured the same way in
 * the same run, and beside the least a record can be (the floor of any
 * design that commits an acceptance before the effect and its answer after).
 * All are pgbench scripts run as the coordinator's role: the registry's
 * statements as bench/sql.ts generates them, one INSERT into a small table
 * with a primary key, and the floor record's insert and update. For each:
 * PostgreSQL's CPU per
 * operation at a fixed number of operations in flight (closed loop), and,
 * one operation at a time after a CHECKPOINT, the WAL, heap tuples and index
 * entries each operation writes.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import type pg from "pg";
import { CpuMeter } from "./cpu.js";
import { settle, withClient } from "./database.js";
import { summarize, type Summary } from "./load.js";
import { runPgbench, runPgbenchTransactions, type PgbenchTarget } from "./pgbench.js";

/** The baseline's table: small, a primary key, nothing else. */
export const BARE_TABLE = "bench_bare_insert";

/** The baseline's one statement, prepared by pgbench like the registry's. */
export const BARE_SCRIPT = [
  "-- A bare one-row insert into a table with a primary key, autocommitted: the database level's baseline (bench/write-path.ts).",
  `INSERT INTO ${BARE_TABLE} (amount, currency) VALUES (:amount, :currency);`,
  "",
].join("\n");

const BARE_VARIABLES = { amount: "10", currency: "EUR" };

/**
 * The least a record can be: its scope and operation id as keys, its
 * fingerprint, state, generation and lease, then its response. Accepted by
 * one autocommitted insert and answered by one autocommitted update that
 * changes no indexed column (a HOT update: no index entry), with no event,
 * no quota count, no index for the background jobs, no row security, no
 * tenant binding and nothing returned. What the registry writes beyond it
 * is what its rules ask for (docs/benchmark.md, "The floor").
 */
export const FLOOR_TABLE = "bench_floor_record";

const FLOOR_SCRIPT = [
  "-- The least a record can be (bench/write-path.ts): accepted by an insert, answered by a HOT update, each autocommitted.",
  "\\set seed random(1, 9223372036854775806)",
  `INSERT INTO ${FLOOR_TABLE} (tenant_id, scope, operation_id, fingerprint, state, generation, lease_expires_at)`,
  "  VALUES (:tenant, sha256(convert_to('scope:' || :seed::text, 'UTF8')), md5('operation:' || :seed::text)::uuid, :fingerprint, 'EXECUTING', 1,",
  "          now() + make_interval(secs => :lease_ms::double precision / 1000));",
  `UPDATE ${FLOOR_TABLE} SET state = :outcome, lease_expires_at = NULL, response = :snapshot_body`,
  "  WHERE tenant_id = :tenant AND operation_id = md5('operation:' || :seed::text)::uuid AND generation = 1;",
  "",
].join("\n");

/** The floor record's values, taken from the registry's script so that both store the same fingerprint and response. */
const floorVariables = (registry: Record<string, string>) =>
  Object.fromEntries(["tenant", "fingerprint", "lease_ms", "outcome", "snapshot_body"].map((name) => [name, registry[name] ?? ""]));

/** The tables whose rows one operation writes: the registry's tenant tables and the baselines'. */
const TABLES = ["idem_record", "idem_event", "idem_quota_gate", "idem_effect_attempt", BARE_TABLE, FLOOR_TABLE];

/** The WAL of `operations` operations run one at a time after a CHECKPOINT, per operation. */
export interface WalPerOperation {
  operations: number;
  /** Everything written, full-page images included. */
  bytes: number;
  /** Of which full-page images (pg_walinspect; undefined without it). */
  fpiBytes?: number;
  /** WAL records and full-page images (pg_stat_wal, or pg_walinspect). */
  records: number;
  fpi: number;
  /** B-tree leaf insertions: the index entries written (pg_walinspect). */
  indexEntries?: number;
  /** By record type (`Heap/INSERT`, `Btree/INSERT_LEAF`, `Transaction/COMMIT`, …): count and bytes without images, per operation. */
  byType?: Array<{ type: string; count: number; bytes: number; fpiBytes: number }>;
  /** By the relation a record's first block belongs to (PostgreSQL 16 and later); records of no relation (commits) under "-". */
  byRelation?: Array<{ relation: string; count: number; bytes: number; fpiBytes: number }>;
}

/** Heap tuples written per operation (pg_stat_user_tables), in all and by table. */
export interface TuplesPerOperation {
  inserted: number;
  updated: number;
  /** Of the updates, those that were HOT (no index entry). */
  hotUpdated: number;
  /** Of the updates, those whose new version went to another page (PostgreSQL 16 and later). */
  newPageUpdated?: number;
  deleted: number;
  byTable: Record<string, { inserted: number; updated: number; hotUpdated: number; newPageUpdated?: number; deleted: number }>;
}

export interface WritePathSide {
  /** pgbench at `clients` in flight, closed loop. */
  throughput: Summary;
  /** PostgreSQL's CPU per operation (its cores busy over the phase ÷ ops/s); undefined when not measurable (an external server). */
  postgresMsPerOp?: number;
  wal: WalPerOperation;
  tuples: TuplesPerOperation;
}

export interface WritePath {
  clients: number;
  method: string;
  registry: WritePathSide;
  bare: WritePathSide;
  /** The least a record can be (FLOOR_SCRIPT); absent from runs kept before it was measured. */
  floor?: WritePathSide;
  ratios: {
    /** PostgreSQL CPU per Reserve + Complete ÷ per bare insert. */
    cpu: number | null;
    /** WAL bytes per Reserve + Complete ÷ per bare insert, without full-page images (with them when they cannot be told apart). */
    wal: number | null;
    /** The same, full-page images included. */
    walWithImages: number | null;
    /** The floor record's CPU and WAL (as `wal` compares them) ÷ the bare insert's: below these no design of a record goes. */
    floorCpu?: number | null;
    floorWal?: number | null;
  };
  /** Whether the WAL figures exclude full-page images (pg_walinspect available). */
  walWithoutImages: boolean;
}

export interface WritePathRun {
  /** The benchmark's database, as its owner. */
  ownerUrl: string;
  /** pgbench acting as the coordinator's role. */
  target: PgbenchTarget;
  registryScript: string;
  registryVariables: Record<string, string>;
  workDir: string;
  clients: number;
  warmupMs: number;
  measureMs: number;
  /** Operations run one at a time for the WAL and tuple counts. */
  sequential: number;
  postmasterPid: number | undefined;
  progress: (line: string) => void;
  checkpoint: () => void;
  onChild: Parameters<typeof runPgbenchTransactions>[4];
}

/** The baselines' tables, writable by the coordinator's role (and nothing else of it). */
export async function prepareBaselineTables(ownerUrl: string, role: string | undefined): Promise<void> {
  await withClient(ownerUrl, async (client) => {
    await client.query(`CREATE TABLE IF NOT EXISTS ${BARE_TABLE} (
      id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
      amount integer NOT NULL,
      currency text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now())`);
    // Room on each page for the answered version, so that the update stays on its page (HOT).
    await client.query(`CREATE TABLE IF NOT EXISTS ${FLOOR_TABLE} (
      tenant_id text NOT NULL,
      scope bytea NOT NULL,
      operation_id uuid NOT NULL,
      fingerprint bytea NOT NULL,
      state text NOT NULL,
      generation bigint NOT NULL,
      lease_expires_at timestamptz,
      response bytea,
      PRIMARY KEY (tenant_id, scope),
      UNIQUE (tenant_id, operation_id)) WITH (fillfactor = 70)`);
    if (role) {
      await client.query(`GRANT INSERT ON ${BARE_TABLE} TO ${client.escapeIdentifier(role)}`);
      await client.query(`GRANT SELECT, INSERT, UPDATE ON ${FLOOR_TABLE} TO ${client.escapeIdentifier(role)}`);
    }
  });
}

type TableCounts = Map<string, { ins: number; upd: number; hot: number; moved?: number; del: number }>;

async function tableCounts(client: pg.Client): Promise<TableCounts> {
  await client.query("SELECT pg_stat_clear_snapshot()");
  const { rows } = await client.query<{ relname: string; ins: string; upd: string; hot: string; moved: string | null; del: string }>(
    `SELECT relname, n_tup_ins::text AS ins, n_tup_upd::text AS upd, n_tup_hot_upd::text AS hot, to_jsonb(s) ->> 'n_tup_newpage_upd' AS moved, n_tup_del::text AS del
       FROM pg_stat_user_tables s WHERE schemaname = current_schema() AND relname = ANY($1)`,
    [TABLES],
  );
  return new Map(
    rows.map((r) => [r.relname, { ins: Number(r.ins), upd: Number(r.upd), hot: Number(r.hot), ...(r.moved !== null ? { moved: Number(r.moved) } : {}), del: Number(r.del) }]),
  );
}

/**
 * Where the next WAL record will go (the insert position: always a record's
 * boundary, which the write position is not while the WAL writer writes
 * whole pages under synchronous_commit=off), and the WAL counters.
 */
async function walCounters(client: pg.Client): Promise<{ lsn: string; records: number; fpi: number }> {
  const { rows } = await client.query<{ lsn: string; records: string; fpi: string }>(
    "SELECT pg_current_wal_insert_lsn()::text AS lsn, wal_records::text AS records, wal_fpi::text AS fpi FROM pg_stat_wal",
  );
  return { lsn: rows[0]!.lsn, records: Number(rows[0]!.records), fpi: Number(rows[0]!.fpi) };
}

/** pg_walinspect, when the server has it and the owner may create it. */
async function walInspect(client: pg.Client): Promise<{ blocks: boolean } | undefined> {
  try {
    await client.query("CREATE EXTENSION IF NOT EXISTS pg_walinspect");
    const { rows } = await client.query<{ blocks: boolean }>("SELECT to_regproc('pg_get_wal_block_info') IS NOT NULL AS blocks");
    return { blocks: rows[0]!.blocks };
  } catch {
    return undefined;
  }
}

/** The backends of pgbench's clients have ended, so that their statistics are flushed. */
async function pgbenchGone(client: pg.Client): Promise<void> {
  for (let waited = 0; waited < 5000; waited += 50) {
    const { rows } = await client.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'pgbench'");
    if (rows[0]!.n === 0) return;
    await sleep(50);
  }
}

/** Until the WAL up to `lsn` is flushed (synchronous_commit=off leaves it to the WAL writer): pg_walinspect reads flushed WAL only. */
async function flushedTo(client: pg.Client, lsn: string): Promise<void> {
  // Under synchronous_commit=off the WAL writer flushes later: a durable commit of a transaction of our own flushes every record before it now.
  await client.query("BEGIN");
  await client.query("SET LOCAL synchronous_commit = on");
  await client.query("SELECT pg_current_xact_id()");
  await client.query("COMMIT");
  for (let waited = 0; waited < 5000; waited += 50) {
    const { rows } = await client.query<{ done: boolean }>("SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn AS done", [lsn]);
    if (rows[0]!.done) return;
    await sleep(50);
  }
}

/**
 * `operations` runs of a script, one at a time on one connection, after a
 * CHECKPOINT: the WAL (in all, and by record type and relation with
 * pg_walinspect) and the heap tuples they wrote, per operation.
 */
async function sequentialCosts(
  run: WritePathRun,
  scriptFile: string,
  variables: Record<string, string>,
): Promise<{ wal: WalPerOperation; tuples: TuplesPerOperation; failed?: string }> {
  const n = run.sequential;
  return withClient(run.ownerUrl, async (client) => {
    const inspect = await walInspect(client);
    await client.query("CHECKPOINT");
    const tuplesBefore = await tableCounts(client);
    const before = await walCounters(client);
    const done = await runPgbenchTransactions(run.target, scriptFile, variables, n, run.onChild);
    await pgbenchGone(client);
    const after = await walCounters(client);
    const tuplesAfter = await tableCounts(client);
    const bytes = Number((await client.query<{ b: string }>("SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::text AS b", [after.lsn, before.lsn])).rows[0]!.b);
    const wal: WalPerOperation = { operations: n, bytes: bytes / n, records: (after.records - before.records) / n, fpi: (after.fpi - before.fpi) / n };
    if (inspect) {
      await flushedTo(client, after.lsn);
      const { rows } = await client.query<{ type: string; count: string; record_size: string; fpi_size: string }>(
        `SELECT "resource_manager/record_type" AS type, count::text, record_size::text, fpi_size::text FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true) WHERE count > 0`,
        [before.lsn, after.lsn],
      );
      const types = rows.map((r) => ({ type: r.type, count: Number(r.count) / n, bytes: Number(r.record_size) / n, fpiBytes: Number(r.fpi_size) / n }));
      wal.byType = types.sort((a, b) => b.bytes + b.fpiBytes - (a.bytes + a.fpiBytes));
      wal.fpiBytes = types.reduce((a, t) => a + t.fpiBytes, 0);
      wal.records = types.reduce((a, t) => a + t.count, 0);
      wal.indexEntries = types.filter((t) => /^Btree\/INSERT_(LEAF|POST)$/.test(t.type)).reduce((a, t) => a + t.count, 0);
      if (inspect.blocks) wal.byRelation = await walByRelation(client, before.lsn, after.lsn, n, wal);
    }
    const tuples: TuplesPerOperation = { inserted: 0, updated: 0, hotUpdated: 0, deleted: 0, byTable: {} };
    for (const [table, a] of tuplesAfter) {
      const b = tuplesBefore.get(table) ?? { ins: 0, upd: 0, hot: 0, del: 0 };
      const moved = a.moved !== undefined ? { newPageUpdated: (a.moved - (b.moved ?? 0)) / n } : {};
      const t = { inserted: (a.ins - b.ins) / n, updated: (a.upd - b.upd) / n, hotUpdated: (a.hot - b.hot) / n, ...moved, deleted: (a.del - b.del) / n };
      if (t.inserted + t.updated + t.deleted === 0) continue;
      tuples.byTable[table] = t;
      tuples.inserted += t.inserted;
      tuples.updated += t.updated;
      tuples.hotUpdated += t.hotUpdated;
      if (t.newPageUpdated !== undefined) tuples.newPageUpdated = (tuples.newPageUpdated ?? 0) + t.newPageUpdated;
      tuples.deleted += t.deleted;
    }
    return { wal, tuples, ...(done.ok ? {} : { failed: done.output.trim().split("\n").slice(-3).join(" | ") }) };
  });
}

/**
 * WAL by the relation of each record's first block (a record's bytes are
 * counted once; its images by the block they are of); what is left of the
 * total (commit records, which name no block) under "-".
 */
async function walByRelation(client: pg.Client, from: string, to: string, n: number, wal: WalPerOperation): Promise<WalPerOperation["byRelation"]> {
  const { rows } = await client.query<{ relation: string; count: string; bytes: string; fpi: string }>(
    `WITH blocks AS (
       SELECT start_lsn, block_id, record_length, block_fpi_length,
              COALESCE(pg_filenode_relation(CASE WHEN reltablespace = (SELECT dattablespace FROM pg_database WHERE datname = current_database())
                                                  THEN 0 ELSE reltablespace END, relfilenode)::regclass::text, 'relfilenode ' || relfilenode) AS relation,
              block_id = min(block_id) OVER (PARTITION BY start_lsn) AS first,
              sum(COALESCE(block_fpi_length, 0)) OVER (PARTITION BY start_lsn) AS record_images
         FROM pg_get_wal_block_info($1::pg_lsn, $2::pg_lsn)
     )
     SELECT relation, count(*) FILTER (WHERE first)::text AS count,
            COALESCE(sum(record_length - record_images) FILTER (WHERE first), 0)::text AS bytes,
            sum(COALESCE(block_fpi_length, 0))::text AS fpi
       FROM blocks GROUP BY relation`,
    [from, to],
  );
  const relations = rows.map((r) => ({ relation: r.relation, count: Number(r.count) / n, bytes: Number(r.bytes) / n, fpiBytes: Number(r.fpi) / n }));
  const counted = relations.reduce((a, r) => ({ count: a.count + r.count, bytes: a.bytes + r.bytes }), { count: 0, bytes: 0 });
  const withoutImages = wal.bytes - (wal.fpiBytes ?? 0);
  // Records naming no block (commits), and the padding of records to 8 bytes, are what the blocks leave.
  relations.push({ relation: "-", count: Math.max(0, wal.records - counted.count), bytes: Math.max(0, withoutImages - counted.bytes), fpiBytes: 0 });
  return relations.sort((a, b) => b.bytes + b.fpiBytes - (a.bytes + a.fpiBytes));
}

/** pgbench at `clients` in flight for warm-up + measurement, with PostgreSQL's CPU over the phase. */
async function throughput(run: WritePathRun, scriptFile: string, variables: Record<string, string>, prefix: string): Promise<{ summary: Summary; postgresMsPerOp?: number }> {
  await settle(run.ownerUrl);
  run.checkpoint();
  const cpu = new CpuMeter(undefined, run.postmasterPid);
  const before = cpu.snapshot();
  const result = await runPgbench({
    ...run.target,
    scriptFile,
    variables,
    clients: run.clients,
    warmupMs: run.warmupMs,
    measureMs: run.measureMs,
    logDir: run.workDir,
    logPrefix: prefix,
    ...(run.onChild ? { onChild: run.onChild } : {}),
  });
  const use = CpuMeter.between(before, await cpu.settledSnapshot(performance.now()));
  run.checkpoint();
  const summary = summarize(result);
  if (use) summary.cpu = use;
  const postgresMsPerOp = use?.postgres !== undefined && summary.opsPerSec > 0 ? (use.postgres * 1000) / summary.opsPerSec : undefined;
  return { summary, ...(postgresMsPerOp !== undefined ? { postgresMsPerOp } : {}) };
}

let runs = 0;

/** The database level: Reserve + Complete's statements, the bare insert and the floor record, each measured one at a time, then as throughput. */
export async function measureWritePath(run: WritePathRun, tag = ""): Promise<WritePath> {
  const bareFile = join(run.workDir, "bare-insert.sql");
  await writeFile(bareFile, BARE_SCRIPT);
  const floorFile = join(run.workDir, "floor-record.sql");
  await writeFile(floorFile, FLOOR_SCRIPT);
  const sides = [
    { name: "Reserve+Complete", file: run.registryScript, variables: run.registryVariables },
    { name: "bare insert", file: bareFile, variables: BARE_VARIABLES },
    { name: "floor record", file: floorFile, variables: floorVariables(run.registryVariables) },
  ];
  const measured: WritePathSide[] = [];
  for (const side of sides) {
    // One at a time first: on a new registry it also gives the tables rows to plan by before the timed phase (bench/database.ts settle analyzes them).
    const costs = await sequentialCosts(run, side.file, side.variables);
    if (costs.failed) throw new Error(`the ${side.name} script failed run one at a time: ${costs.failed}`);
    run.checkpoint();
    run.progress(
      `${tag}database one at a time ×${run.sequential} ${side.name}: ${costs.wal.bytes.toFixed(0)} WAL bytes${
        costs.wal.fpiBytes !== undefined ? ` (${(costs.wal.bytes - costs.wal.fpiBytes).toFixed(0)} without full-page images)` : ""
      }, ${(costs.tuples.inserted + costs.tuples.updated + costs.tuples.deleted).toFixed(2)} heap tuples, ${costs.wal.indexEntries?.toFixed(2) ?? "-"} index entries per operation`,
    );
    const { summary, postgresMsPerOp } = await throughput(run, side.file, side.variables, `write${++runs}`);
    run.progress(
      `${tag}database c=${run.clients} ${side.name.padEnd(17)} ${summary.opsPerSec.toFixed(0).padStart(6)} ops/s; PostgreSQL ${postgresMsPerOp === undefined ? "-" : postgresMsPerOp.toFixed(3)} ms CPU per operation`,
    );
    measured.push({ throughput: summary, ...(postgresMsPerOp !== undefined ? { postgresMsPerOp } : {}), ...costs });
  }
  const [registry, bare, floor] = measured as [WritePathSide, WritePathSide, WritePathSide];
  const over = (a: number | undefined, b: number | undefined) => (a !== undefined && b !== undefined && b > 0 ? a / b : null);
  const withoutImages = (w: WalPerOperation) => (w.fpiBytes !== undefined ? w.bytes - w.fpiBytes : undefined);
  const walWithoutImages = registry.wal.fpiBytes !== undefined && bare.wal.fpiBytes !== undefined && floor.wal.fpiBytes !== undefined;
  const walOver = (side: WritePathSide) => (walWithoutImages ? over(withoutImages(side.wal), withoutImages(bare.wal)) : over(side.wal.bytes, bare.wal.bytes));
  return {
    clients: run.clients,
    method:
      `pgbench -M prepared as the coordinator's role, each side: ${run.sequential} operations one at a time on one connection after a CHECKPOINT ` +
      `(WAL: pg_current_wal_insert_lsn, pg_stat_wal${walWithoutImages ? ", pg_walinspect" : ""}; tuples: pg_stat_user_tables), ` +
      `then ${run.clients} clients for ${run.warmupMs / 1000} s + ${run.measureMs / 1000} s after VACUUM ANALYZE (CPU: PostgreSQL's cores busy over the phase ÷ ops/s)`,
    registry,
    bare,
    floor,
    ratios: {
      cpu: over(registry.postgresMsPerOp, bare.postgresMsPerOp),
      wal: walOver(registry),
      walWithImages: over(registry.wal.bytes, bare.wal.bytes),
      floorCpu: over(floor.postgresMsPerOp, bare.postgresMsPerOp),
      floorWal: walOver(floor),
    },
    walWithoutImages,
  };
}

/** WAL bytes per operation as the goal compares them: without full-page images when they could be told apart. */
export const comparedWal = (path: WritePath, side: WritePathSide) => (path.walWithoutImages ? side.wal.bytes - (side.wal.fpiBytes ?? 0) : side.wal.bytes);

const f = (v: number | undefined | null, digits = 2) => (v === undefined || v === null || !Number.isFinite(v) ? "-" : v.toFixed(digits));

/** The database level's table: one row per side, then each record's ratio to the bare insert. */
export function writePathTable(path: WritePath): { headers: string[]; rows: string[][] } {
  const headers = [
    "per operation",
    "ops/s (c=" + path.clients + ")",
    "PG CPU ms",
    path.walWithoutImages ? "WAL bytes (no FPI)" : "WAL bytes",
    "FPI bytes",
    "WAL records",
    "heap tuples",
    "of which HOT",
    "index entries",
  ];
  const sum = (s: WritePathSide) => s.tuples.inserted + s.tuples.updated + s.tuples.deleted;
  const row = (name: string, s: WritePathSide) => [
    name,
    f(s.throughput.opsPerSec, 0),
    f(s.postgresMsPerOp, 3),
    f(comparedWal(path, s), 0),
    f(s.wal.fpiBytes ?? undefined, 0),
    f(s.wal.records),
    f(sum(s)),
    f(s.tuples.hotUpdated),
    f(s.wal.indexEntries),
  ];
  const ratio = (a: number | undefined, b: number | undefined) => (a !== undefined && b !== undefined && b > 0 ? `${(a / b).toFixed(2)}×` : "-");
  const ratioRow = (name: string, s: WritePathSide) => [
    name,
    ratio(s.throughput.opsPerSec, path.bare.throughput.opsPerSec),
    ratio(s.postgresMsPerOp, path.bare.postgresMsPerOp),
    ratio(comparedWal(path, s), comparedWal(path, path.bare)),
    "",
    ratio(s.wal.records, path.bare.wal.records),
    ratio(sum(s), sum(path.bare)),
    "",
    ratio(s.wal.indexEntries, path.bare.wal.indexEntries),
  ];
  return {
    headers,
    rows: [
      row("Reserve+Complete", path.registry),
      row("bare insert", path.bare),
      ...(path.floor ? [row("floor record", path.floor)] : []),
      ratioRow(path.floor ? "Reserve+Complete ÷ bare" : "ratio", path.registry),
      ...(path.floor ? [ratioRow("floor record ÷ bare", path.floor)] : []),
    ],
  };
}

/** Where Reserve + Complete's WAL goes: by relation (or by record type), bytes without images per operation. */
export function writePathBreakdown(path: WritePath): string[] {
  const { wal, tuples } = path.registry;
  const lines: string[] = [];
  const tables = Object.entries(tuples.byTable)
    .map(
      ([t, c]) =>
        `${t} ${f(c.inserted)} inserted, ${f(c.updated)} updated (${f(c.hotUpdated)} HOT${c.newPageUpdated !== undefined ? `, ${f(c.newPageUpdated)} to another page` : ""})`,
    )
    .join("; ");
  if (tables) lines.push(`Reserve+Complete heap tuples: ${tables}`);
  if (wal.byRelation) {
    lines.push(
      `Reserve+Complete WAL by relation (bytes without images, records): ${wal.byRelation
        .filter((r) => r.bytes >= 0.5)
        .map((r) => `${r.relation === "-" ? "no relation (commits)" : r.relation} ${r.bytes.toFixed(0)} (${r.count.toFixed(2)})`)
        .join(", ")}`,
    );
  }
  if (wal.byType) {
    lines.push(
      `Reserve+Complete WAL by record type (bytes without images, records): ${wal.byType
        .filter((t) => t.bytes >= 0.5)
        .map((t) => `${t.type} ${t.bytes.toFixed(0)} (${t.count.toFixed(2)})`)
        .join(", ")}`,
    );
  }
  return lines;
}
