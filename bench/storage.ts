/**
 * `npx tsx bench/storage.ts`: what the registry stores and writes to the WAL
 * per record, for the capacity model of docs/scaling.md. Records are made
 * through the registry itself (src/registry/registry.ts), as a gateway makes
 * them: Reserve with one declared effect (by default), then Complete with
 * that effect's resolution and a sealed snapshot. It reports each table's
 * size per record, as written and compacted, then again once every record is
 * a tombstone (the retention sweep, as the job runs it), the WAL each phase
 * wrote per record, and PostgreSQL's CPU per record when the server is the
 * run's own. `--help` lists the options.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import type pg from "pg";
import pino from "pino";
import type { Snapshot } from "../src/contract/snapshot.js";
import { parsePolicyDocument } from "../src/policy/document.js";
import { StaticPolicies, toOperationPolicy } from "../src/policy/operations.js";
import { openPool, poolDb, runTransaction, type Db, type PoolSettings } from "../src/registry/db.js";
import { migrate } from "../src/registry/migrate.js";
import { planEpochs } from "../src/registry/plan-epochs.js";
import { Registry } from "../src/registry/registry.js";
import type { Actor } from "../src/registry/types.js";
import { CpuMeter } from "./cpu.js";
import { databaseFacts, startDatabase, withClient } from "./database.js";

const HELP = `npx tsx bench/storage.ts [options]

Makes records in a fresh schema through the registry's own code (Reserve with
declared effects, then Complete with their resolutions and a sealed snapshot
of a typical size), then reports, per table: its size as written, its size
compacted (VACUUM FULL), and the same once the retention sweep has made every
record a tombstone; each per record and per million records, with the WAL
each phase wrote per record. The schema is dropped at the end.

  --records N          records to make (default 100000)
  --concurrency N      requests in flight (default 16)
  --tenants N          tenants the records are spread over (default 10)
  --effects N          effects each record declares and resolves (default 1;
                       0: Reserve with claim, then Complete, as npm run bench
                       sends them)
  --body-bytes N       the stored response body, before sealing (default 200:
                       a payment resource as JSON)
  --database-url URL   use this PostgreSQL (a scratch database: a schema is
                       made and dropped) instead of a dedicated embedded one;
                       WAL is the server's, so other sessions' writes count
  -h, --help           this text
`;

interface Options {
  records: number;
  concurrency: number;
  tenants: number;
  effects: number;
  bodyBytes: number;
  databaseUrl?: string;
}

class UsageError extends Error {}
class Interrupted extends Error {}

function parseStorageArgs(argv: string[]): Options | "help" {
  let values: ReturnType<typeof parseArgs<{ options: typeof CLI_OPTIONS; strict: true; allowPositionals: false }>>["values"];
  try {
    ({ values } = parseArgs({ args: argv, options: CLI_OPTIONS, strict: true, allowPositionals: false }));
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  if (values.help) return "help";
  const whole = (flag: string, raw: string | undefined, min: number, max: number, otherwise: number) => {
    if (raw === undefined) return otherwise;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min || n > max) throw new UsageError(`${flag} needs a whole number from ${min} to ${max}, got '${raw}'`);
    return n;
  };
  const url = values["database-url"];
  if (url !== undefined && !/^postgres(ql)?:\/\//.test(url)) throw new UsageError("--database-url must be a postgres:// connection string");
  return {
    records: whole("--records", values.records, 1, 100_000_000, 100_000),
    concurrency: whole("--concurrency", values.concurrency, 1, 256, 16),
    tenants: whole("--tenants", values.tenants, 1, 1_000_000, 10),
    effects: whole("--effects", values.effects, 0, 16, 1),
    bodyBytes: whole("--body-bytes", values["body-bytes"], 2, 1_000_000, 200),
    ...(url !== undefined ? { databaseUrl: url } : {}),
  };
}

const CLI_OPTIONS = {
  records: { type: "string" },
  concurrency: { type: "string" },
  tenants: { type: "string" },
  effects: { type: "string" },
  "body-bytes": { type: "string" },
  "database-url": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

/** The registry's tables with rows per record (tenant tables) and their size, each with indexes and TOAST. */
interface Sizes {
  label: string;
  tables: Array<{ table: string; rows: number; bytes: number }>;
}

async function measureSizes(pool: pg.Pool, label: string): Promise<Sizes> {
  const { rows } = await pool.query<{ table: string; bytes: string }>(
    `SELECT c.relname AS table, pg_total_relation_size(c.oid)::text AS bytes
       FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' ORDER BY c.relname`,
  );
  const tables: Sizes["tables"] = [];
  for (const r of rows) {
    // The owner, bound to every tenant for this one count (row-level security binds the owner too).
    const counted = await inAllTenants(pool, (client) => client.query<{ n: string }>(`SELECT count(*)::text AS n FROM ${r.table}`));
    tables.push({ table: r.table, rows: Number(counted.rows[0]!.n), bytes: Number(r.bytes) });
  }
  return { label, tables };
}

/** Runs `work` on the owner's connection in a transaction bound to every tenant (migrations/000010: the owner's policy). */
function inAllTenants<T>(pool: pg.Pool, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  return runTransaction(pool, async (client) => {
    await client.query("SELECT set_config('idem.all_tenants', 'on', true)");
    return work(client);
  });
}

async function walLsn(pool: pg.Pool): Promise<string> {
  return (await pool.query<{ lsn: string }>("SELECT pg_current_wal_lsn()::text AS lsn")).rows[0]!.lsn;
}

async function walBytesSince(pool: pg.Pool, from: string): Promise<number> {
  return Number((await pool.query<{ bytes: string }>("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::text AS bytes", [from])).rows[0]!.bytes);
}

/**
 * A checkpoint before a measured phase, so that each starts as a phase
 * would after any checkpoint in production: the first change of each page
 * afterwards writes the whole page to the WAL, and that is counted. Best
 * effort: a server may not grant it.
 */
async function checkpoint(pool: pg.Pool): Promise<boolean> {
  return pool.query("CHECKPOINT").then(
    () => true,
    () => false,
  );
}

/** A typical stored response: a payment resource as JSON, padded to `bytes`. */
function paymentSnapshot(bytes: number): Snapshot {
  const id = `pay_${randomBytes(12).toString("hex")}`;
  const resource = {
    id,
    object: "payment",
    amount: 1000,
    currency: "EUR",
    status: "succeeded",
    card: { brand: "visa", last4: "4242" },
    charge: `ch_${randomBytes(12).toString("hex")}`,
    created: new Date().toISOString(),
    description: "",
  };
  const base = Buffer.byteLength(JSON.stringify(resource));
  resource.description = "x".repeat(Math.max(0, bytes - base));
  const body = Buffer.from(JSON.stringify(resource)).subarray(0, Math.max(bytes, 2));
  return { statusCode: 201, mediaType: "application/json", location: `/v1/payments/${id}`, businessVersion: "", headers: [], body };
}

const OPERATION = "payments.create";

async function makeRecords(registry: Registry, db: Db, options: Options, onProgress: (done: number) => void): Promise<void> {
  const actor: Actor = { caller: "storage-gateway", isOperator: false, mayUseTenant: () => true, mayOperate: () => true };
  const request = {
    method: "POST",
    path: "/v1/payments",
    query: "",
    mediaType: "application/json",
    headers: [],
    body: Buffer.from('{"amount":1000,"currency":"EUR","card":"tok_4242"}'),
  };
  let next = 0;
  let done = 0;
  const worker = async (w: number) => {
    for (let i = next++; i < options.records; i = next++) {
      const tenant = `tenant-${i % options.tenants}`;
      const reserved = await registry.reserve(
        db,
        {
          // One principal per worker: its quota of unfinished records holds one at a time.
          subject: { tenant, principal: `user-${w}` },
          operation: OPERATION,
          apiRevision: 1,
          idempotencyKey: randomUUID(),
          request: { kind: "parts", parts: request },
          claim: true,
          writerEpoch: 0,
          effects: Array.from({ length: options.effects }, (_, e) => ({ effect: `effect.${e}`, provider: "provider" })),
        },
        actor,
      );
      const attempts = reserved.attempts ?? [];
      if (reserved.decision !== "ACCEPTED" || !reserved.record || attempts.length !== options.effects) {
        throw new Error(`Reserve answered ${reserved.decision}, not ACCEPTED with ${options.effects} attempts`);
      }
      await registry.complete(
        db,
        {
          ref: { tenant, operationId: reserved.record.operationId },
          generation: reserved.record.generation,
          outcome: "SUCCEEDED",
          snapshot: paymentSnapshot(options.bodyBytes),
          resolutions: attempts.map((a) => ({ attemptNumber: a.attemptNumber, status: "CONFIRMED" as const, providerHandle: `ch_${randomBytes(12).toString("hex")}` })),
        },
        actor,
      );
      onProgress(++done);
    }
  };
  await Promise.all(Array.from({ length: options.concurrency }, (_, w) => worker(w)));
}

function formatBytes(bytes: number): string {
  if (Math.abs(bytes) >= 1024 ** 3) return `${(bytes / 1024 ** 3).toFixed(2)} GiB`;
  if (Math.abs(bytes) >= 1024 ** 2) return `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
  if (Math.abs(bytes) >= 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${bytes} B`;
}

/** One table of sizes: bytes above the empty schema's, per record and per million records. */
function renderSizes(sizes: Sizes, empty: Sizes, records: number): string {
  const lines = [`${sizes.label}`, `  ${"table".padEnd(24)} ${"rows".padStart(10)} ${"size".padStart(11)} ${"bytes/record".padStart(13)} ${"per 1M records".padStart(15)}`];
  let total = 0;
  for (const { table, rows, bytes } of sizes.tables) {
    const grown = bytes - (empty.tables.find((e) => e.table === table)?.bytes ?? 0);
    total += grown;
    const perRecord = grown / records;
    lines.push(
      `  ${table.padEnd(24)} ${String(rows).padStart(10)} ${formatBytes(bytes).padStart(11)} ${perRecord.toFixed(0).padStart(13)} ${formatBytes(perRecord * 1e6).padStart(15)}`,
    );
  }
  lines.push(
    `  ${"all tables".padEnd(24)} ${"".padStart(10)} ${"".padStart(11)} ${(total / records).toFixed(0).padStart(13)} ${formatBytes((total / records) * 1e6).padStart(15)}`,
  );
  return lines.join("\n");
}

async function run(options: Options): Promise<void> {
  const logger = pino({ level: "warn" });
  const database = await startDatabase({ ...(options.databaseUrl ? { databaseUrl: options.databaseUrl } : {}), logger });
  const schema = `storage_${randomBytes(5).toString("hex")}`;
  const pools: pg.Pool[] = [];
  let aborted = false;
  const onSignal = () => {
    aborted = true;
    console.log("interrupted: dropping the schema");
  };
  process.once("SIGINT", onSignal);
  try {
    await withClient(database.url, (client) => client.query(`CREATE SCHEMA ${schema}`));
    const settings: PoolSettings = {
      connectionString: database.url,
      max: options.concurrency + 4,
      connectionTimeoutMs: 30_000,
      statementTimeoutMs: 600_000,
      lockTimeoutMs: 10_000,
      idleInTransactionTimeoutMs: 60_000,
      options: `-c search_path=${schema}`,
      applicationName: "idem-storage",
    };
    const open = (overrides: Partial<PoolSettings> = {}) => {
      const pool = openPool({ ...settings, ...overrides }, logger);
      pools.push(pool);
      return pool;
    };
    const owner = open({ max: 4 });
    await migrate(owner, logger);
    // The registry as the coordinator runs it (src/server/app.ts, with its defaults): requests as
    // idem_server, with prepared statements planned anew while the table grows (plan epochs) and
    // concurrent requests of one tenant and caller coalesced; the sweep as idem_cross_tenant.
    const serving = open({ role: "idem_server" });
    const db = poolDb(serving, logger, { planned: planEpochs(serving, logger), crossTenantPool: open({ role: "idem_cross_tenant", max: 4 }) });
    const policy = toOperationPolicy(parsePolicyDocument({ operation: OPERATION, apiRevision: 1 }));
    const registry = new Registry({
      policies: new StaticPolicies([policy]),
      keyring: { activeKeyId: "k1", keys: new Map([["k1", randomBytes(32)]]) },
      coalesce: { maxBatch: 64, maxInFlight: 4 },
    });

    const facts = await databaseFacts(database.url);
    console.log(`database: ${database.embedded ? "embedded, dedicated to this run" : "--database-url"}; ${facts.version.split(",")[0]}`);
    console.log(
      `settings: ${Object.entries(facts.settings)
        .map(([k, v]) => `${k}=${v}`)
        .join(" ")}`,
    );
    console.log(
      `policy: ${OPERATION}@1 with every default (retention ${policy.retention.keepMs / 3_600_000} h); ${options.effects} declared effect(s) per record; snapshot body ${options.bodyBytes} bytes, sealed`,
    );
    console.log(`making ${options.records} records over ${options.tenants} tenants, ${options.concurrency} in flight, in schema ${schema}`);

    const empty = await measureSizes(owner, "empty");
    const checkpointed = await checkpoint(owner);
    if (!checkpointed) console.log("(CHECKPOINT not permitted: the WAL below starts wherever the server's last checkpoint left it)");
    let lsn = await walLsn(owner);
    // PostgreSQL's CPU (the postmaster and its processes), when the server is the run's own.
    const cpu = new CpuMeter(undefined, database.postmasterPid);
    const cpuBefore = cpu.snapshot();
    const started = performance.now();
    let reported = 0;
    await makeRecords(registry, db, options, (done) => {
      if (aborted) throw new Interrupted("interrupted");
      if (done === options.records || done - reported >= Math.max(1, Math.floor(options.records / 10))) {
        reported = done;
        const seconds = (performance.now() - started) / 1000;
        console.log(`  ${done} records, ${seconds.toFixed(0)} s, ${(done / seconds).toFixed(0)} records/s`);
      }
    });
    const loadSeconds = (performance.now() - started) / 1000;
    const loadCpu = CpuMeter.between(cpuBefore, await cpu.settledSnapshot(performance.now()));
    const loadWal = await walBytesSince(owner, lsn);
    const written = await measureSizes(owner, "after the records were made, as written (with the row versions their updates left)");
    await owner.query("VACUUM (FULL, ANALYZE)");
    const compacted = await measureSizes(owner, "the same, compacted (VACUUM FULL): the live rows");

    // Retention ended for every record (as if 72 h had passed), then the sweep as the job runs it.
    await inAllTenants(owner, (client) => client.query("UPDATE idem_record SET retain_until = now() - interval '1 second' WHERE completed_at IS NOT NULL"));
    await checkpoint(owner);
    lsn = await walLsn(owner);
    const sweepStarted = performance.now();
    let sweptReported = 0;
    const swept = await registry.sweepRetention(db, {
      batchSize: 1000,
      caller: "storage-sweep",
      onBatch: (_n, total) => {
        if (aborted) throw new Interrupted("interrupted");
        if (total > sweptReported && (total - sweptReported >= options.records / 10 || total === options.records)) {
          sweptReported = total;
          console.log(`  ${total} tombstones`);
        }
      },
    });
    const sweepWal = await walBytesSince(owner, lsn);
    const sweepSeconds = (performance.now() - sweepStarted) / 1000;
    const tombstones = await measureSizes(owner, "after the retention sweep, as written");
    await owner.query("VACUUM (FULL, ANALYZE)");
    const tombstonesCompacted = await measureSizes(owner, "tombstones, compacted (VACUUM FULL): what stays for good");

    console.log("");
    for (const sizes of [written, compacted, tombstones, tombstonesCompacted]) console.log(`${renderSizes(sizes, empty, options.records)}\n`);
    console.log(
      `WAL while making the records: ${formatBytes(loadWal)}, ${(loadWal / options.records).toFixed(0)} bytes per record (${loadSeconds.toFixed(0)} s, ${(options.records / loadSeconds).toFixed(0)} records/s)`,
    );
    if (loadCpu?.postgres !== undefined) {
      const msPerRecord = (loadCpu.postgres * loadSeconds * 1000) / options.records;
      console.log(
        `PostgreSQL while making the records: ${loadCpu.postgres.toFixed(2)} cores busy, ${msPerRecord.toFixed(2)} ms of CPU per record (${(1000 / msPerRecord).toFixed(0)} records/s per core); this process ${loadCpu.client.toFixed(2)} cores`,
      );
    }
    console.log(
      `WAL of the retention sweep:   ${formatBytes(sweepWal)}, ${(sweepWal / swept.tombstoned).toFixed(0)} bytes per tombstone (${swept.tombstoned} in ${swept.batches} batches, ${sweepSeconds.toFixed(0)} s)`,
    );
    if (!database.embedded) console.log("(WAL is the whole server's: other sessions' writes during the run are counted too)");
  } finally {
    process.removeListener("SIGINT", onSignal);
    await Promise.all(pools.map((p) => p.end().catch(() => undefined)));
    await withClient(database.url, (client) => client.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`)).catch((error: unknown) =>
      console.error(`could not drop schema ${schema}: ${(error as Error).message}`),
    );
    await database.stop();
  }
}

const argv = process.argv.slice(2);
try {
  const parsed = parseStorageArgs(argv);
  if (parsed === "help") {
    process.stdout.write(HELP);
  } else {
    await run(parsed);
  }
} catch (error) {
  if (error instanceof Interrupted) {
    process.exitCode = 130;
  } else if (error instanceof UsageError) {
    console.error(`${error.message}\n\n${HELP}`);
    process.exitCode = 2;
  } else {
    console.error(error);
    process.exitCode = 1;
  }
}
