/**
 * `npm run bench`: the coordinator's Reserve + Complete measured side by side
 * with the same SQL driven by pgbench and with a no-op RPC on the same
 * server, on one machine and one database in one run. docs/benchmark.md
 * explains what is measured and how to read it; `--help` lists the options.
 */
import type { Child } from "../harness/lib/process.js";
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import { join, relative, resolve } from "node:path";
import { performance } from "node:perf_hooks";
import pg from "pg";
import pino from "pino";
import { parseDuration, parsePolicyDocument } from "../src/policy/document.js";
import { toOperationPolicy } from "../src/policy/operations.js";
import { migrate } from "../src/registry/migrate.js";
import { openClients, type BenchClients, type ClientKind, type Reserved } from "./client.js";
import { CpuMeter } from "./cpu.js";
import { databaseFacts, enableStatements, readStatements, resetStatements, settle, startDatabase, synchronousCommit, type BenchDatabase, type StatementCount } from "./database.js";
import { closedLoop, openLoop, summarize, type Operation, type Phase, type Sample, type Summary } from "./load.js";
import { findPgbench, runPgbench, runPgbenchTransactions, type Pgbench } from "./pgbench.js";
import {
  goalLines,
  renderMarkdown,
  renderText,
  statementRank,
  type BenchResult,
  type CommitRun,
  type RoundTrips,
  type Row,
  type RpcCost,
  type ServiceLevel,
  type ServicePhase,
  type StatementShare,
} from "./report.js";
import { CountingProxy } from "./roundtrips.js";
import { ROOT, startServer, type BenchServer } from "./server.js";
import { openServiceClients, prepareServiceTable, startService } from "./service-level.js";
import { callsPerRequest, coordinatorCalls, handlerMean, handlerTimes } from "./metrics.js";
import { pgbenchScript, type OperationValues } from "./sql.js";

const HELP = `npm run bench [-- options]

Two levels, each measured side by side with its baseline, under each
synchronous_commit setting asked for (durable "on", then "off"):

coordinator level: Reserve(claim) + Complete through the coordinator (gRPC
  over HTTP/2, the coordinator in its own process) beside the same SQL driven
  by pgbench -M prepared, and a no-op RPC (grpc.health.v1.Health/Check) on the
  same server: closed loop at several concurrencies, then open model (Poisson
  arrivals) at fractions of the best closed-loop throughput. Counts database
  round trips per RPC (on the wire, through a counting proxy) and statements
  (pg_stat_statements), once per run.
service level: a minimal Express service (its own process) writing one row
  per POST at synchronous_commit=on, driven by 16 HTTP clients: the handler
  alone, then behind the gateway SDK with new keys, then with replays.

Prints the tables with the goals as PASS/FAIL lines (the exit status does not
depend on them) and writes JSON.

  --quick                 under 2 minutes: commit on only, concurrency 16,64,
                          open at 50%; 1 s warm-up, 2 s measured per phase
  --level L               coordinator, service or all (default all)
  --commit LIST           synchronous_commit settings, each a part of the run
                          (default on,off; quick on)
  --durable               the same as --commit on
  --concurrency LIST      closed-loop concurrencies (default 1,16,64)
  --duration D            measured time per phase (default 4s; quick 2s); D is a duration
                          as everywhere in this project (4s, 2m), or whole seconds
  --warmup D              unmeasured time before each phase (default 2s; quick 1s)
  --open LIST|none        open-model rates as fractions of the best closed-loop
                          coordinator throughput (default 0.5,0.8; quick 0.5)
  --service-clients N     concurrent HTTP clients of the service level (default 16)
  --database-url URL      use this PostgreSQL instead of a dedicated embedded one
                          (a scratch database: records are written, and
                          synchronous_commit is set for that database during the
                          run, reset after it; statements per RPC need
                          pg_stat_statements preloaded there, round trips are
                          counted on the wire regardless)
  --pool-max N            the coordinator's registry pool (default 20, its default)
  --connections N         HTTP/2 connections of the load generator (default 2)
  --protocol grpc|connect gRPC, as the gateway SDK calls (default), or the Connect
                          protocol (binary) over the same HTTP/2 connections
  --client sdk|unary      coordinator level: Reserve and Complete through the
                          gateway SDK's CoordinatorClient, which carries concurrent
                          calls in Batch RPCs (default), or one unary RPC each, as a
                          client generated from the proto calls (gRPC only with sdk)
  --in-process            run the coordinator in the benchmark's process
  --setting NAME=VALUE    a setting of the coordinator under test (README,
                          "Configuration"), e.g. IDEM_BATCH_IN_FLIGHT=8; repeatable
  --cpu-prof DIR          the coordinator process (and the service level's Express
                          service) writes a V8 CPU profile of the whole run into
                          DIR (open it in Chrome DevTools)
  --round-trip-ops N      calls of each RPC counted for round trips (default 200; quick 50)
  --out FILE              JSON output (default bench/results/latest.json)
  --render FILE           print a saved JSON result again (add --markdown for Markdown)
  --pgbench-script        print the generated pgbench script and exit
  -h, --help              this text

The default run takes about 7 minutes, --quick about 1.5. pgbench is looked up
in $PGBENCH, PATH and /usr/lib/postgresql/*/bin; without it the pgbench
baseline is skipped.
`;

type Level = "coordinator" | "service" | "all";
type Commit = "on" | "off";

interface Options {
  quick: boolean;
  level: Level;
  commit: Commit[];
  concurrency: number[];
  warmupSec: number;
  measureSec: number;
  open: number[];
  serviceClients: number;
  databaseUrl?: string;
  poolMax: number;
  connections: number;
  protocol: "grpc" | "connect";
  client: ClientKind;
  inProcess: boolean;
  cpuProfileDir?: string;
  /** Settings of the coordinator under test, as its environment. */
  settings: Record<string, string>;
  roundTripOps: number;
  out: string;
}

class UsageError extends Error {}

function parseArgs(argv: string[]): Options | { render: string; markdown: boolean } | "help" | "script" {
  const quick = argv.includes("--quick");
  const options: Options = {
    quick,
    level: "all",
    commit: quick ? ["on"] : ["on", "off"],
    concurrency: quick ? [16, 64] : [1, 16, 64],
    warmupSec: quick ? 1 : 2,
    measureSec: quick ? 2 : 4,
    open: quick ? [0.5] : [0.5, 0.8],
    serviceClients: 16,
    poolMax: 20,
    connections: 2,
    protocol: "grpc",
    client: "sdk",
    settings: {},
    inProcess: false,
    roundTripOps: quick ? 50 : 200,
    out: join(ROOT, "bench", "results", "latest.json"),
  };
  let render: string | undefined;
  let markdown = false;
  // The project's durations (4s, 2m, as in policies, idemctl and the gate), or a whole number of seconds.
  const seconds = (flag: string, raw: string | undefined, min: number, max: number) => {
    const ms = parseDuration(raw ?? "") ?? (/^\d+$/.test(raw ?? "") ? Number(raw) * 1000 : undefined);
    if (ms === undefined || ms % 1000 !== 0 || ms / 1000 < min || ms / 1000 > max) {
      throw new UsageError(`${flag} needs a duration of whole seconds from ${min}s to ${max}s (e.g. 4s, 2m, or 4), got '${raw ?? ""}'`);
    }
    return ms / 1000;
  };
  const positive = (flag: string, raw: string | undefined, max: number) => {
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 1 || n > max) throw new UsageError(`${flag} needs a whole number from 1 to ${max}, got '${raw ?? ""}'`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const value = () => {
      const v = argv[++i];
      if (v === undefined || v.startsWith("--")) throw new UsageError(`${arg} needs a value`);
      return v;
    };
    switch (arg) {
      case "-h":
      case "--help":
        return "help";
      case "--pgbench-script":
        return "script";
      case "--quick":
        break;
      case "--concurrency":
        options.concurrency = value()
          .split(",")
          .map((c) => positive("--concurrency", c, 1000));
        break;
      case "--duration":
        options.measureSec = seconds("--duration", value(), 1, 3600);
        break;
      case "--warmup":
        options.warmupSec = seconds("--warmup", value(), 0, 600);
        break;
      case "--open": {
        const raw = value();
        options.open =
          raw === "none"
            ? []
            : raw.split(",").map((f) => {
                const n = Number(f);
                if (!(n > 0 && n <= 2)) throw new UsageError(`--open takes fractions above 0 (e.g. 0.5,0.8), got '${f}'`);
                return n;
              });
        break;
      }
      case "--durable":
        options.commit = ["on"];
        break;
      case "--commit": {
        const settings = value().split(",");
        for (const c of settings) if (c !== "on" && c !== "off") throw new UsageError(`--commit takes on and/or off (e.g. on,off), got '${c}'`);
        options.commit = [...new Set(settings as Commit[])];
        break;
      }
      case "--level": {
        const level = value();
        if (level !== "coordinator" && level !== "service" && level !== "all") throw new UsageError(`--level is coordinator, service or all, got '${level}'`);
        options.level = level;
        break;
      }
      case "--service-clients":
        options.serviceClients = positive("--service-clients", value(), 1000);
        break;
      case "--database-url": {
        const url = value();
        if (!/^postgres(ql)?:\/\//.test(url)) throw new UsageError("--database-url must be a postgres:// connection string");
        options.databaseUrl = url;
        break;
      }
      case "--pool-max":
        options.poolMax = positive("--pool-max", value(), 1000);
        break;
      case "--connections":
        options.connections = positive("--connections", value(), 64);
        break;
      case "--client": {
        const client = value();
        if (client !== "sdk" && client !== "unary") throw new UsageError(`--client is sdk or unary, got '${client}'`);
        options.client = client;
        break;
      }
      case "--protocol": {
        const protocol = value();
        if (protocol !== "grpc" && protocol !== "connect") throw new UsageError(`--protocol is grpc or connect, got '${protocol}'`);
        options.protocol = protocol;
        break;
      }
      case "--in-process":
        options.inProcess = true;
        break;
      case "--setting": {
        const setting = value();
        const match = /^(IDEM_[A-Z0-9_]+)=(.*)$/.exec(setting);
        if (!match) throw new UsageError(`--setting is NAME=VALUE with an IDEM_ name, got '${setting}'`);
        options.settings[match[1]!] = match[2]!;
        break;
      }
      case "--cpu-prof":
        options.cpuProfileDir = resolve(value());
        break;
      case "--round-trip-ops":
        options.roundTripOps = positive("--round-trip-ops", value(), 100_000);
        break;
      case "--out":
        options.out = value();
        break;
      case "--render":
        render = value();
        break;
      case "--markdown":
        markdown = true;
        break;
      default:
        throw new UsageError(`unknown option '${arg}' (see --help)`);
    }
  }
  if (render) return { render, markdown };
  if (options.client === "sdk" && options.protocol !== "grpc") throw new UsageError("--protocol connect needs --client unary: the gateway SDK calls over gRPC");
  return options;
}

// ---------------------------------------------------------------------------
// Process lifetime: every child and the database are stopped on any exit.

const started = performance.now();
const progress = (line: string) => process.stdout.write(`[${((performance.now() - started) / 1000).toFixed(0).padStart(4)}s] ${line}\n`);
/** Run last-in first-out on any exit. */
const cleanups: Array<{ name: string; run: () => Promise<void> }> = [];
/** The running pgbench, if any (the coordinators and the database are stopped by their cleanups). */
const children = new Set<Child>();
const abort = new AbortController();
let firstSignalAt: number | undefined;
/**
 * The load generator's HTTP/2 sessions, closed first on any stop: a session
 * still open when a coordinator says GOAWAY fails with an error nobody
 * listens for.
 */
const clientSets = new Set<BenchClients>();
const closeClients = () => clientSets.forEach((c) => c.close());

class Aborted extends Error {}
const checkpoint = () => {
  if (abort.signal.aborted) throw new Aborted("interrupted");
};

function onSignal(signal: NodeJS.Signals): void {
  if (firstSignalAt === undefined) {
    firstSignalAt = Date.now();
    progress(`${signal}: stopping the run; cleaning up (pgbench, coordinator, database)…`);
    abort.abort();
    closeClients();
    for (const child of children) child.process.kill("SIGINT");
  } else if (Date.now() - firstSignalAt > 1000) {
    progress("still cleaning up: the coordinator and the database are being stopped");
  }
}

async function cleanup(): Promise<void> {
  closeClients();
  while (cleanups.length > 0) {
    const { name, run } = cleanups.pop()!;
    await run().catch((error: unknown) => progress(`cleanup of ${name} failed: ${(error as Error).message}`));
  }
  // Whatever is left (a pgbench interrupted mid-run): gone for good.
  for (const child of children) child.process.kill("SIGKILL");
}

function trackChild(): (child: Child | undefined) => void {
  let current: Child | undefined;
  return (child) => {
    if (current) children.delete(current);
    if (child) children.add(child);
    current = child;
  };
}

// ---------------------------------------------------------------------------

const TENANT = "bench";
const OPERATION = "payments.create";

function operationValues(): OperationValues {
  // payments.create@1 with every default, as the coordinator publishes it (IDEM_OPERATIONS).
  const policy = toOperationPolicy(parsePolicyDocument({ operation: OPERATION, apiRevision: 1 }));
  return {
    tenant: TENANT,
    principal: "bench-user",
    operation: OPERATION,
    apiRevision: 1,
    schemaRevision: policy.fingerprint.schemaRevision,
    leaseMs: policy.lease.defaultMs,
    keepMs: policy.retention.keepMs,
    quota: policy.maxActivePerPrincipal,
    caller: "bench-gateway",
    keyId: "bench",
    snapshot: {
      statusCode: 201,
      mediaType: "application/json",
      body: new TextEncoder().encode(JSON.stringify({ id: "pay_000000000001", amount: 10, currency: "EUR", status: "succeeded" })),
    },
  };
}

/** pg_stat_statements rows as statements per call, in the order a transaction sends them. */
function shares(rows: StatementCount[], calls: number): StatementShare[] {
  const byName = new Map<string, { calls: number; totalMs: number }>();
  for (const r of rows) {
    const entry = byName.get(r.name) ?? { calls: 0, totalMs: 0 };
    entry.calls += r.calls;
    entry.totalMs += r.totalMs;
    byName.set(r.name, entry);
  }
  return [...byName]
    .map(([statement, e]) => ({ statement, perCall: e.calls / calls, meanMs: e.calls ? e.totalMs / e.calls : 0 }))
    .sort((a, b) => statementRank(a.statement) - statementRank(b.statement) || b.perCall - a.perCall);
}

function line(label: string, s: Summary | null): string {
  if (!s) return `${label}: skipped`;
  const errors = s.errors ? `, ${s.errors} failed (${s.firstError})` : "";
  const cores = s.cpu
    ? `; cores busy: ${[
        ["coordinator", s.cpu.coordinator],
        ["service", s.cpu.service],
        ["postgres", s.cpu.postgres],
        ["client", s.cpu.client],
      ]
        .filter(([, v]) => v !== undefined && (v as number) >= 0.005)
        .map(([name, v]) => `${name} ${(v as number).toFixed(2)}`)
        .join(", ")}`
    : "";
  return `${label.padEnd(34)} ${s.opsPerSec.toFixed(0).padStart(6)} ops/s  p50 ${s.p50Ms.toFixed(2).padStart(7)} ms  p99 ${s.p99Ms.toFixed(2).padStart(7)} ms  (${s.count} ops${errors}${cores})`;
}

interface Context {
  options: Options;
  database: BenchDatabase;
  statements: { available: true } | { available: false; reason: string };
  values: OperationValues;
  token: string;
  pgbench: Pgbench | undefined;
  scriptFile: string;
  variables: Record<string, string>;
  /** The role the coordinator's registry connections act as: pgbench acts as it too. */
  role?: string;
}

/** A coordinator with its clients, stopped on any exit. */
async function coordinator(
  ctx: Context,
  label: string,
  databaseUrl: string,
  extraEnvironment?: Record<string, string>,
): Promise<{ server: BenchServer; clients: BenchClients; stop(): Promise<void> }> {
  const server = await startServer({
    databaseUrl,
    token: ctx.token,
    callerName: ctx.values.caller,
    tenant: TENANT,
    operation: OPERATION,
    apiRevision: ctx.values.apiRevision,
    keyId: ctx.values.keyId,
    poolMax: ctx.options.poolMax,
    inProcess: ctx.options.inProcess,
    ...(ctx.options.cpuProfileDir ? { cpuProfileDir: ctx.options.cpuProfileDir } : {}),
    // The run's own settings (--setting), then the phase's (the round-trip count parks the jobs).
    extraEnvironment: { ...ctx.options.settings, ...extraEnvironment },
  });
  const clients = openClients({
    baseUrl: server.baseUrl,
    token: ctx.token,
    connections: ctx.options.connections,
    protocol: ctx.options.protocol,
    client: ctx.options.client,
    values: ctx.values,
  });
  clientSets.add(clients);
  const stop = async () => {
    clients.close();
    clientSets.delete(clients);
    await server.stop();
  };
  cleanups.push({ name: label, run: stop });
  return { server, clients, stop };
}

/**
 * Round trips and statements per Reserve and per Complete, and per pgbench
 * transaction: K sequential calls each, through a coordinator of their own
 * whose database connections go through a counting proxy and whose
 * background jobs are parked, so that everything counted is the RPCs'.
 */
async function countRoundTrips(ctx: Context, usePgbench: boolean): Promise<RoundTrips> {
  const k = ctx.options.roundTripOps;
  const target = new URL(ctx.database.url);
  const proxy = await CountingProxy.start({ host: target.hostname, port: Number(target.port || 5432) });
  cleanups.push({ name: "the counting proxy", run: () => proxy.close() });
  const counting = await coordinator(ctx, "the counting coordinator", proxy.url(ctx.database.url), {
    IDEM_RECOVERER_INTERVAL_MS: "3600000",
    IDEM_SWEEP_INTERVAL_MS: "86400000",
    IDEM_POLICY_REFRESH_MS: "600000",
    IDEM_MIGRATE_ON_BOOT: "false",
  });
  const { clients, server } = counting;
  for (let i = 0; i < 20; i++) await clients.operation(0); // opens the pool's connection, warms the paths
  checkpoint();

  const statementsOn = ctx.statements.available;
  const measure = async <T>(method: string, work: () => Promise<T>): Promise<{ result: T; cost: Omit<RpcCost, "clientMs"> }> => {
    const before = await handlerTimes(server.adminUrl);
    if (statementsOn) await resetStatements(ctx.database.url);
    proxy.reset();
    const result = await work();
    const wire = proxy.read();
    const rows = statementsOn ? await readStatements(ctx.database.url) : [];
    const after = await handlerTimes(server.adminUrl);
    checkpoint();
    const list = shares(rows, k);
    const handlerMs = handlerMean(before, after, method);
    return {
      result,
      cost: {
        calls: k,
        ...(wire.encrypted === 0 ? { roundTrips: wire.roundTrips / k } : {}),
        ...(statementsOn ? { statements: list.reduce((a, s) => a + s.perCall, 0), databaseMs: rows.reduce((a, r) => a + r.totalMs, 0) / k, statementList: list } : {}),
        ...(handlerMs !== undefined ? { handlerMs } : {}),
      },
    };
  };

  const reserved: Reserved[] = [];
  const reserve = await measure("Reserve", async () => {
    const t0 = performance.now();
    for (let i = 0; i < k; i++) {
      checkpoint();
      reserved.push(await clients.reserve(0));
    }
    return (performance.now() - t0) / k;
  });
  const complete = await measure("Complete", async () => {
    const t0 = performance.now();
    for (const r of reserved) {
      checkpoint();
      await clients.complete(0, r);
    }
    return (performance.now() - t0) / k;
  });
  await counting.stop();

  let pgbenchCost: RoundTrips["pgbench"] = null;
  if (usePgbench) {
    const pgb = await measure("-", async () =>
      runPgbenchTransactions(
        { bin: ctx.pgbench!.path, databaseUrl: proxy.url(ctx.database.url), ...(ctx.role ? { role: ctx.role } : {}) },
        ctx.scriptFile,
        ctx.variables,
        k,
        trackChild(),
      ),
    );
    if (pgb.result.ok) {
      const { calls: _calls, handlerMs: _handler, ...cost } = pgb.cost;
      const coordinatorStatements = new Map<string, number>();
      for (const s of [...(reserve.cost.statementList ?? []), ...(complete.cost.statementList ?? [])]) {
        coordinatorStatements.set(s.statement, (coordinatorStatements.get(s.statement) ?? 0) + s.perCall);
      }
      const pgbenchStatements = new Map((cost.statementList ?? []).map((s) => [s.statement, s.perCall]));
      const names = new Set([...coordinatorStatements.keys(), ...pgbenchStatements.keys()]);
      pgbenchCost = {
        ...cost,
        // BEGIN and COMMIT aside: pg_stat_statements counts pgbench's, sent as prepared statements, once per prepare, not per execution.
        ...(statementsOn
          ? {
              sameStatements: [...names]
                .filter((n) => n !== "begin" && n !== "commit")
                .every((n) => Math.abs((coordinatorStatements.get(n) ?? 0) - (pgbenchStatements.get(n) ?? 0)) < 0.02),
            }
          : {}),
      };
    }
  }
  const wireOk = proxy.read().encrypted === 0;
  await proxy.close();
  return {
    available: true,
    method:
      `${k} sequential calls of each RPC through a coordinator of their own (background jobs parked); round trips counted on the wire ` +
      `(a proxy counting the Query and Sync messages sent while none was waiting for its answer)${statementsOn ? ", statements and execution time by pg_stat_statements (top-level, BEGIN/COMMIT included)" : ""}`,
    ...(statementsOn ? {} : { reason: `statements unavailable: ${(ctx.statements as { reason: string }).reason}` }),
    ...(wireOk ? {} : { wireNote: "the database connection is encrypted: round trips could not be counted on the wire" }),
    reserve: { ...reserve.cost, clientMs: reserve.result },
    complete: { ...complete.cost, clientMs: complete.result },
    pgbench: pgbenchCost,
  };
}

/** What the first coordinator of the run tells about pgbench: whether its baseline runs, and as which role. */
interface PgbenchState {
  target?: { bin: string; databaseUrl: string; role?: string };
  use: boolean;
  skipped?: string;
  checked: boolean;
  command?: string;
  onChild: (child: Child | undefined) => void;
  logRun: number;
  workDir: string;
}

/** A phase timed with the CPU of every process it involves; its summary printed as a progress line. */
type Timed = <T extends Summary>(label: string, work: () => Promise<Sample | Summary | null>, extend?: (summary: Summary) => Promise<T> | T) => Promise<T | null>;

function timer(ctx: Context, cpu: CpuMeter): Timed {
  return async (label, work, extend) => {
    // A quick run's tables stay small: it skips the vacuum and checkpoint between phases.
    if (!ctx.options.quick) await settle(ctx.database.url);
    checkpoint();
    const before = cpu.snapshot();
    const outcome = await work();
    const use = CpuMeter.between(before, await cpu.settledSnapshot(performance.now()));
    checkpoint();
    const summary = outcome && "latencies" in outcome ? summarize(outcome) : outcome;
    if (summary && use) summary.cpu = use;
    const extended = summary && extend ? await extend(summary) : summary;
    progress(line(label, extended));
    return extended as Awaited<ReturnType<NonNullable<typeof extend>>> | null;
  };
}

const phaseOf = (options: Options): Phase => ({ warmupMs: options.warmupSec * 1000, measureMs: options.measureSec * 1000, signal: abort.signal });

/** The coordinator level under one commit setting: closed loop at each concurrency, then the open model, each beside pgbench and the no-op. */
async function coordinatorLevel(ctx: Context, main: Awaited<ReturnType<typeof coordinator>>, pgb: PgbenchState, tag: string): Promise<Row[]> {
  const { options } = ctx;
  const { server, clients } = main;
  // Every path warmed up once (JIT, connection pools, caches) before anything is measured.
  const warmSec = options.quick ? 1 : 2;
  progress(`${tag}warming up: ${warmSec} s of coordinator and no-op calls${pgb.use ? ", 100 pgbench transactions" : ""} (not measured)`);
  const warm: Phase = { warmupMs: warmSec * 1000, measureMs: 0, signal: abort.signal };
  await closedLoop(4, warm, clients.operation);
  await closedLoop(4, warm, clients.noop);
  if (pgb.use) await runPgbenchTransactions(pgb.target!, ctx.scriptFile, ctx.variables, 100, pgb.onChild);
  checkpoint();

  const pgbenchPhase = async (clientCount: number, rate?: number): Promise<Summary | null> => {
    if (!pgb.use) return null;
    const result = await runPgbench({
      ...pgb.target!,
      scriptFile: ctx.scriptFile,
      variables: ctx.variables,
      clients: clientCount,
      ...(rate !== undefined ? { rate } : {}),
      warmupMs: options.warmupSec * 1000,
      measureMs: options.measureSec * 1000,
      logDir: pgb.workDir,
      logPrefix: `run${++pgb.logRun}`,
      onChild: pgb.onChild,
    });
    pgb.command ??= result.command;
    checkpoint();
    return summarize(result);
  };
  const timed = timer(ctx, new CpuMeter(server.mode === "process" ? server.pid : undefined, ctx.database.postmasterPid));
  const ratios = (coordinatorSide: Summary, pgbench: Summary | null, noop: Summary): Row["ratios"] => ({
    throughputVsPgbench: pgbench && pgbench.opsPerSec > 0 ? coordinatorSide.opsPerSec / pgbench.opsPerSec : null,
    p99VsPgbench: pgbench && pgbench.count > 0 ? coordinatorSide.p99Ms / pgbench.p99Ms : null,
    throughputVsNoop: coordinatorSide.opsPerSec / noop.opsPerSec,
    p99VsNoop: coordinatorSide.p99Ms / noop.p99Ms,
  });

  const rows: Row[] = [];
  for (const concurrency of options.concurrency) {
    const coord = (await timed(`${tag}closed c=${concurrency} coordinator`, () => closedLoop(concurrency, phaseOf(options), clients.operation)))!;
    const pgbench = await timed(`${tag}closed c=${concurrency} pgbench`, () => pgbenchPhase(concurrency));
    const noop = (await timed(`${tag}closed c=${concurrency} no-op`, () => closedLoop(concurrency, phaseOf(options), clients.noop)))!;
    rows.push({ mode: "closed", concurrency, coordinator: coord, pgbench, noop, ratios: ratios(coord, pgbench, noop) });
  }
  const best = Math.max(...rows.map((r) => r.coordinator.opsPerSec));
  const callers = Math.max(...options.concurrency);
  for (const fraction of options.open) {
    const rate = Math.max(1, fraction * best);
    const label = `${tag}open ${Math.round(fraction * 100)}% (${rate.toFixed(0)}/s, ≤${callers})`;
    const coord = (await timed(`${label} coordinator`, () => openLoop(callers, rate, phaseOf(options), clients.operation)))!;
    const pgbench = await timed(`${label} pgbench`, () => pgbenchPhase(callers, rate));
    const noop = (await timed(`${label} no-op`, () => openLoop(callers, rate, phaseOf(options), clients.noop)))!;
    rows.push({ mode: "open", concurrency: callers, offeredPerSec: rate, fraction, coordinator: coord, pgbench, noop, ratios: ratios(coord, pgbench, noop) });
  }
  return rows;
}

/**
 * The service level under one commit setting: the Express service in a
 * process of its own, in front of `main`, driven by HTTP clients in this
 * process; the handler alone, then the SDK with new keys, then replays.
 */
async function serviceLevel(ctx: Context, main: Awaited<ReturnType<typeof coordinator>>, tag: string): Promise<ServiceLevel> {
  const { options } = ctx;
  const workers = options.serviceClients;
  const service = await startService({
    databaseUrl: ctx.database.url,
    coordinatorUrl: main.server.baseUrl,
    token: ctx.token,
    tenant: TENANT,
    operation: OPERATION,
    apiRevision: ctx.values.apiRevision,
    poolMax: workers,
    ...(options.cpuProfileDir ? { cpuProfileDir: options.cpuProfileDir } : {}),
  });
  cleanups.push({ name: "the Express service", run: () => service.stop() });
  progress(`${tag}Express service on ${service.baseUrl} (separate process, pid ${service.pid}, ${workers} database connections), ${workers} HTTP clients, one user each`);
  const clients = openServiceClients(service.baseUrl, workers);
  try {
    // What the coordinator level left behind (dead index entries of every finished record) vacuumed first, quick run or not.
    await settle(ctx.database.url);
    const warmSec = options.quick ? 1 : 2;
    progress(`${tag}warming up the service: ${warmSec} s of each workload (not measured)`);
    const warm: Phase = { warmupMs: warmSec * 1000, measureMs: 0, signal: abort.signal };
    for (const op of [clients.plain, clients.newKey, clients.replay]) await closedLoop(workers, warm, op);
    checkpoint();

    const timed = timer(ctx, new CpuMeter(main.server.mode === "process" ? main.server.pid : undefined, ctx.database.postmasterPid, service.pid));
    const side = async (label: string, op: Operation): Promise<ServicePhase> => {
      let callsBefore: Map<string, number> | undefined;
      let answeredBefore = 0;
      const phase = await timed(
        `${tag}service c=${workers} ${label}`,
        async () => {
          callsBefore = await coordinatorCalls(main.server.adminUrl);
          answeredBefore = clients.answered();
          return closedLoop(workers, phaseOf(options), op);
        },
        async (summary) => {
          const requests = clients.answered() - answeredBefore;
          const calls = callsPerRequest(callsBefore, await coordinatorCalls(main.server.adminUrl), requests);
          return { ...summary, requests, ...(calls ? { callsPerRequest: calls } : {}) };
        },
      );
      return phase!;
    };
    const plain = await side("(a) handler alone", clients.plain);
    const newKeys = await side("(b) SDK, new keys", clients.newKey);
    const replays = await side("(c) SDK, replays", clients.replay);
    const calls = (p: ServicePhase) =>
      p.callsPerRequest
        ? Object.entries(p.callsPerRequest)
            .map(([method, n]) => `${method} ${n.toFixed(2)}`)
            .join(", ") || "none"
        : "unknown";
    progress(`${tag}coordinator calls per request: (a) ${calls(plain)}; (b) ${calls(newKeys)}; (c) ${calls(replays)}`);
    const over = (a: number, b: number) => (b > 0 && Number.isFinite(a) ? a / b : null);
    return {
      clients: workers,
      description:
        `Express 5 service in its own process, one row per POST (INSERT, its own transaction, synchronous_commit=on), ` +
        `${workers} HTTP/1.1 keep-alive clients in the benchmark's process, one user each; (b) and (c) through the gateway SDK's Express middleware`,
      environment: service.environment,
      plain,
      newKeys,
      replays,
      ratios: {
        newVsPlain: over(newKeys.opsPerSec, plain.opsPerSec),
        replaysVsPlain: over(replays.opsPerSec, plain.opsPerSec),
        p99NewVsPlain: over(newKeys.p99Ms, plain.p99Ms),
      },
    };
  } finally {
    clients.close();
    await service.stop();
  }
}

async function run(options: Options, argv: string[]): Promise<BenchResult> {
  const startedAt = new Date();
  const loadBefore = os.loadavg();
  const runCoordinatorLevel = options.level !== "service";
  const runServiceLevel = options.level !== "coordinator";
  const phaseSec = options.warmupSec + options.measureSec + 1;
  const perCommit =
    (runCoordinatorLevel ? (options.concurrency.length + options.open.length) * 3 * phaseSec + 8 : 0) + (runServiceLevel ? 3 * (phaseSec + options.warmupSec) + 4 : 0) + 3;
  const estimate = 10 + options.commit.length * perCommit + (runCoordinatorLevel ? 12 + options.roundTripOps * 0.06 : 0);
  const levels = runCoordinatorLevel && runServiceLevel ? "coordinator and service levels" : runCoordinatorLevel ? "coordinator level" : "service level";
  progress(
    `idempotency coordinator benchmark${options.quick ? " (quick)" : ""}: ${levels}, synchronous_commit ${options.commit.join(" then ")}; ` +
      `phases of ${options.warmupSec} s warm-up + ${options.measureSec} s measured, about ${Math.round(estimate / 5) * 5} s`,
  );
  const logger = pino({ level: "warn" }, pino.destination(2));

  const pgbench = runCoordinatorLevel ? await findPgbench() : undefined;
  const pgb: PgbenchState = {
    use: false,
    checked: false,
    onChild: trackChild(),
    logRun: 0,
    workDir: await mkdtemp(join(os.tmpdir(), "idem-bench-pgbench-")),
    ...(runCoordinatorLevel && !pgbench
      ? { skipped: "pgbench not found ($PGBENCH, PATH, /usr/lib/postgresql/*/bin): install the PostgreSQL client (e.g. apt-get install postgresql-client)" }
      : {}),
  };
  cleanups.push({ name: "pgbench's files", run: () => rm(pgb.workDir, { recursive: true, force: true }) });
  if (runCoordinatorLevel) progress(pgbench ? `pgbench: ${pgbench.path} (${pgbench.version})` : `${pgb.skipped}; the pgbench baseline is skipped`);

  progress(options.databaseUrl ? "database: --database-url" : "starting a dedicated embedded PostgreSQL (fsync=on, pg_stat_statements)");
  const database = await startDatabase({ ...(options.databaseUrl ? { databaseUrl: options.databaseUrl } : {}), logger });
  cleanups.push({ name: "the database", run: () => database.stop() });
  if (!database.embedded) {
    // Someone else's server: the database gets its own default back.
    cleanups.push({ name: "the database's synchronous_commit", run: () => synchronousCommit(database.url, undefined).then(() => undefined) });
  }
  checkpoint();
  {
    const pool = new pg.Pool({ connectionString: database.url, max: 1 });
    pool.on("error", () => undefined);
    try {
      const applied = await migrate(pool, logger);
      progress(`registry schema migrated (${applied.length ? `applied ${applied.join(", ")}` : "already current"})`);
    } finally {
      await pool.end();
    }
  }
  if (runServiceLevel) await prepareServiceTable(database.url);
  const statements = await enableStatements(database.url);
  if (runCoordinatorLevel && !statements.available) progress(`statements per RPC will be reported as unavailable: ${statements.reason}`);
  const facts = await databaseFacts(database.url);
  progress(`${facts.version.split(" on ")[0]}: fsync=${facts.settings.fsync}`);
  checkpoint();

  const values = operationValues();
  const { script, variables } = pgbenchScript(values);
  const scriptFile = join(pgb.workDir, "reserve-complete.sql");
  await writeFile(scriptFile, script);
  const ctx: Context = { options, database, statements, values, token: `bench_${randomBytes(24).toString("hex")}`, pgbench, scriptFile, variables };

  const commits: CommitRun[] = [];
  let serverInfo: BenchResult["server"] | undefined;
  for (const setting of options.commit) {
    const seen = await synchronousCommit(database.url, setting);
    const tag = options.commit.length > 1 ? `[commit ${setting}] ` : "";
    progress(`${tag}synchronous_commit=${seen} for every new connection to the database (the coordinator, pgbench and the service connect afresh)`);
    checkpoint();
    const main = await coordinator(ctx, `the coordinator (synchronous_commit=${setting})`, database.url);
    const { server, clients } = main;
    serverInfo ??= { mode: server.mode, environment: server.environment };
    if (server.databaseRole) ctx.role = server.databaseRole;
    progress(
      `${tag}coordinator serving on ${server.baseUrl} (${server.mode === "process" ? `separate process, pid ${server.pid}` : "in this process"}, registry pool ${options.poolMax})`,
    );
    await clients.operation(0);
    await clients.noop(0);
    checkpoint();

    if (runCoordinatorLevel && pgbench && !pgb.checked) {
      // pgbench runs the same statements in one transaction script, checked once before it is timed.
      pgb.checked = true;
      pgb.target = { bin: pgbench.path, databaseUrl: database.url, ...(ctx.role ? { role: ctx.role } : {}) };
      const check = await runPgbenchTransactions(pgb.target, scriptFile, variables, 3, pgb.onChild);
      if (check.ok) {
        pgb.use = true;
        progress(
          "pgbench baseline: the registry's statements, prepared, each transaction bound to its tenant and pipelined as src/registry/db.ts sends it" +
            `${ctx.role ? `, acting as role ${ctx.role} like the coordinator` : ""}`,
        );
      } else {
        pgb.skipped = `the pgbench script failed: ${check.output.trim().split("\n").slice(-4).join(" | ")}`;
        progress(`${pgb.skipped}; the pgbench baseline is skipped`);
      }
      checkpoint();
    }

    const rows = runCoordinatorLevel ? await coordinatorLevel(ctx, main, pgb, tag) : [];
    const service = runServiceLevel ? await serviceLevel(ctx, main, tag) : null;
    await main.stop();
    const part: CommitRun = { synchronousCommit: seen, rows, service };
    for (const goal of goalLines(part)) progress(`${tag}${goal}`);
    commits.push(part);
  }

  let roundTrips: RoundTrips = { available: false, reason: "not measured: the coordinator level did not run (--level service)" };
  if (runCoordinatorLevel) {
    progress(`counting round trips: ${options.roundTripOps} Reserve and ${options.roundTripOps} Complete calls${pgb.use ? ", then the pgbench transaction" : ""}`);
    await settle(database.url);
    roundTrips = await countRoundTrips(ctx, pgb.use);
  }

  const cpus = os.cpus();
  const finishedAt = new Date();
  return {
    benchmark: "idempotency-coordinator",
    version: 2,
    level: options.level,
    startedAt: startedAt.toISOString(),
    finishedAt: finishedAt.toISOString(),
    durationSec: Math.round((finishedAt.getTime() - startedAt.getTime()) / 1000),
    command: `npm run bench${argv.length ? ` -- ${argv.map((a, i) => (argv[i - 1] === "--database-url" ? "<url>" : a)).join(" ")}` : ""}`,
    options: { ...options, databaseUrl: options.databaseUrl ? "<url>" : undefined, out: relative(ROOT, options.out).startsWith("..") ? options.out : relative(ROOT, options.out) },
    machine: {
      cpus: cpus.length,
      cpuModel: cpus[0]?.model.trim() ?? "unknown",
      memoryGb: Math.round(os.totalmem() / 2 ** 30),
      os: `${os.type()} ${os.release()} ${os.arch()}`,
      node: process.version,
      loadAverageBefore: loadBefore,
      loadAverageAfter: os.loadavg(),
    },
    database: { embedded: database.embedded, version: facts.version, settings: facts.settings, pgStatStatements: statements.available },
    server: serverInfo!,
    loadGenerator: {
      description:
        options.client === "sdk"
          ? `the gateway SDK's CoordinatorClient (concurrent calls in Batch RPCs) over ${options.connections} HTTP/2 connection(s), in the benchmark's process`
          : `@connectrpc/connect-node ${options.protocol === "grpc" ? "gRPC" : "Connect (binary)"} client, one unary RPC per call, over ${options.connections} HTTP/2 connection(s), in the benchmark's process`,
      protocol: options.protocol === "grpc" ? "gRPC (binary protobuf) over HTTP/2 cleartext, as the gateway SDK" : "Connect protocol (binary protobuf) over HTTP/2 cleartext",
      connections: options.connections,
      noop: "two grpc.health.v1.Health/Check RPCs per operation (Reserve + Complete are two RPCs)",
      openModel: "Poisson arrivals spread over the callers like pgbench --rate; latency from the scheduled time",
    },
    pgbench:
      pgbench && pgb.use
        ? {
            path: pgbench.path,
            version: pgbench.version,
            ...(pgb.command ? { command: pgb.command } : {}),
            tenantBinding: true,
            ...(ctx.role ? { role: ctx.role } : {}),
          }
        : { skipped: pgb.skipped ?? (runCoordinatorLevel ? "unknown" : "the coordinator level did not run") },
    commits,
    roundTrips,
    notes: [
      "All sides ran one after the other on the same machine and database in this run; compare the ratios, not absolute figures across machines or runs.",
      "The load generator, the coordinator, the service and PostgreSQL (and pgbench) share the machine's cores.",
      ...(runCoordinatorLevel
        ? [`pgbench opens one connection per client (up to ${Math.max(...options.concurrency)}); the coordinator uses at most ${options.poolMax} registry connections.`]
        : []),
      ...(runServiceLevel
        ? ["The service's own transactions run at synchronous_commit=on under every setting; the setting of each part applies to the coordinator (and pgbench)."]
        : []),
    ],
  };
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs(argv);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(`${error.message}\n\n${HELP}`);
    process.exit(2);
  }
  if (parsed === "help") {
    process.stdout.write(HELP);
    return;
  }
  if (parsed === "script") {
    process.stdout.write(pgbenchScript(operationValues()).script);
    return;
  }
  if ("render" in parsed) {
    const result = JSON.parse(await readFile(parsed.render, "utf8")) as BenchResult;
    process.stdout.write(`${parsed.markdown ? renderMarkdown(result) : renderText(result)}\n`);
    return;
  }
  const options = parsed;
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(signal, onSignal);
  // Nothing may leave a coordinator or the database running: an unexpected error still cleans up.
  process.on("uncaughtException", (error) => {
    process.stderr.write(`benchmark failed: ${error.stack ?? error.message}\n`);
    abort.abort();
    void cleanup().finally(() => process.exit(1));
  });
  let exitCode = 0;
  try {
    const result = await run(options, argv);
    await mkdir(join(options.out, ".."), { recursive: true });
    await writeFile(options.out, `${JSON.stringify(result, null, 2)}\n`);
    const shown = relative(process.cwd(), options.out);
    process.stdout.write(`\n${renderText(result)}\n\nJSON: ${shown.startsWith("..") ? options.out : shown}\n`);
  } catch (error) {
    if (error instanceof Aborted || abort.signal.aborted) {
      exitCode = 130;
    } else {
      process.stderr.write(`benchmark failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
      exitCode = 1;
    }
  } finally {
    progress(`cleaning up: ${options.databaseUrl ? "" : "the embedded PostgreSQL, "}temporary files`);
    await cleanup();
  }
  process.exit(exitCode);
}

await main();
