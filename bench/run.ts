/**
 * `npm run bench`: the coordinator's Reserve + Complete measured side by side
 * with the same SQL driven by pgbench and with a no-op RPC on the same
 * server, on one machine and one database in one run. docs/benchmark.md
 * explains what is measured and how to read it; `--help` lists the options.
 */
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import { join, relative } from "node:path";
import { performance } from "node:perf_hooks";
import pg from "pg";
import pino from "pino";
import { parsePolicyDocument } from "../src/policy/document.js";
import { toOperationPolicy } from "../src/policy/operations.js";
import { migrate } from "../src/registry/migrate.js";
import { openClients, type BenchClients, type Reserved } from "./client.js";
import type { Child } from "../harness/lib/process.js";
import { CpuMeter } from "./cpu.js";
import { Aborted, RunLifetime } from "./lifetime.js";
import { databaseFacts, enableStatements, readStatements, resetStatements, settle, startDatabase, synchronousCommit, type BenchDatabase, type StatementCount } from "./database.js";
import { closedLoop, openLoop, summarize, type Operation, type Phase, type Sample, type Summary } from "./load.js";
import { HELP, parseBenchArgs, UsageError, type Options } from "./options.js";
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
import { startRelay } from "./relay.js";
import { pgbenchScript, type OperationValues } from "./sql.js";
import { measureWritePath, prepareBaselineTables, type WritePath } from "./write-path.js";
import { loadConfig } from "../src/config.js";

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
  life: RunLifetime;
  database: BenchDatabase;
  statements: { available: true } | { available: false; reason: string };
  values: OperationValues;
  token: string;
  pgbench: Pgbench | undefined;
  scriptFile: string;
  /** The script's two round trips, statement by statement, for the relay (bench/relay.ts). */
  pipelines: string[][];
  variables: Record<string, string>;
  /** The role the coordinator's registry connections act as: pgbench acts as it too. */
  role?: string;
  /** The coordinator's key ring, which the service's co-located route seals with too. */
  snapshotKeys: string;
  /** The role of the service's co-located connections (prepareServiceTable). */
  serviceRole: string | undefined;
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
    snapshotKeys: ctx.snapshotKeys,
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
  const release = ctx.life.holdClients(clients);
  const stop = async () => {
    clients.close();
    release();
    await server.stop();
  };
  ctx.life.onExit(label, stop);
  return { server, clients, stop };
}

/**
 * Round trips and statements per Reserve and per Complete, and per pgbench
 * transaction: K sequential calls each, through a coordinator of their own
 * whose database connections go through a counting proxy and whose
 * background jobs are parked, so that everything counted is the RPCs'.
 */
async function countRoundTrips(ctx: Context, usePgbench: boolean): Promise<RoundTrips> {
  const { checkpoint } = ctx.life;
  const k = ctx.options.roundTripOps;
  const target = new URL(ctx.database.url);
  const proxy = await CountingProxy.start({ host: target.hostname, port: Number(target.port || 5432) });
  ctx.life.onExit("the counting proxy", () => proxy.close());
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
        ctx.life.trackChild(),
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
  const { progress, checkpoint } = ctx.life;
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

const phaseOf = ({ options, life }: Context): Phase => ({ warmupMs: options.warmupSec * 1000, measureMs: options.measureSec * 1000, signal: life.signal });

/** The coordinator level under one commit setting: closed loop at each concurrency, then the open model, each beside pgbench and the no-op. */
async function coordinatorLevel(ctx: Context, main: Awaited<ReturnType<typeof coordinator>>, pgb: PgbenchState, tag: string): Promise<Row[]> {
  const { progress, checkpoint } = ctx.life;
  const { options } = ctx;
  const { server, clients } = main;
  // Every path warmed up once (JIT, connection pools, caches) before anything is measured.
  const warmSec = options.quick ? 1 : 2;
  progress(`${tag}warming up: ${warmSec} s of coordinator and no-op calls${pgb.use ? ", 100 pgbench transactions" : ""} (not measured)`);
  const warm: Phase = { warmupMs: warmSec * 1000, measureMs: 0, signal: ctx.life.signal };
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

  // The floor of the pair's latency at 1 in flight: a relay that does nothing but pass each call to PostgreSQL.
  const relay = options.concurrency.includes(1)
    ? await startRelay({ databaseUrl: ctx.database.url, ...(ctx.role ? { role: ctx.role } : {}), pipelines: ctx.pipelines, variables: ctx.variables })
    : undefined;
  if (relay) {
    ctx.life.onExit("the relay", () => relay.stop());
    progress(
      `${tag}relay on ${relay.baseUrl} (separate process, pid ${relay.pid}): pgbench's round trips through node-postgres, nothing else; the floor of the pair at 1 in flight (its CPU in the coordinator's column)`,
    );
    await closedLoop(1, warm, relay.operation);
  }
  const relayTimed = relay ? timer(ctx, new CpuMeter(relay.pid, ctx.database.postmasterPid)) : undefined;

  const rows: Row[] = [];
  for (const concurrency of options.concurrency) {
    const coord = (await timed(`${tag}closed c=${concurrency} coordinator`, () => closedLoop(concurrency, phaseOf(ctx), clients.operation)))!;
    const pgbench = await timed(`${tag}closed c=${concurrency} pgbench`, () => pgbenchPhase(concurrency));
    const noop = (await timed(`${tag}closed c=${concurrency} no-op`, () => closedLoop(concurrency, phaseOf(ctx), clients.noop)))!;
    const relayed = concurrency === 1 && relay ? await relayTimed!(`${tag}closed c=1 relay`, () => closedLoop(1, phaseOf(ctx), relay.operation)) : undefined;
    rows.push({ mode: "closed", concurrency, coordinator: coord, pgbench, noop, ...(relayed ? { relay: relayed } : {}), ratios: ratios(coord, pgbench, noop) });
  }
  await relay?.stop();
  const best = Math.max(...rows.map((r) => r.coordinator.opsPerSec));
  const callers = Math.max(...options.concurrency);
  for (const fraction of options.open) {
    const rate = Math.max(1, fraction * best);
    const label = `${tag}open ${Math.round(fraction * 100)}% (${rate.toFixed(0)}/s, ≤${callers})`;
    const coord = (await timed(`${label} coordinator`, () => openLoop(callers, rate, phaseOf(ctx), clients.operation)))!;
    const pgbench = await timed(`${label} pgbench`, () => pgbenchPhase(callers, rate));
    const noop = (await timed(`${label} no-op`, () => openLoop(callers, rate, phaseOf(ctx), clients.noop)))!;
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
  const { progress, checkpoint } = ctx.life;
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
    snapshotKeys: ctx.snapshotKeys,
    colocatedRole: ctx.serviceRole,
    ...(options.cpuProfileDir ? { cpuProfileDir: options.cpuProfileDir } : {}),
  });
  ctx.life.onExit("the Express service", () => service.stop());
  progress(`${tag}Express service on ${service.baseUrl} (separate process, pid ${service.pid}, ${workers} database connections), ${workers} HTTP clients, one user each`);
  const clients = openServiceClients(service.baseUrl, workers);
  try {
    // What the coordinator level left behind (dead index entries of every finished record) vacuumed first, quick run or not.
    await settle(ctx.database.url);
    const warmSec = options.quick ? 1 : 2;
    progress(`${tag}warming up the service: ${warmSec} s of each workload (not measured)`);
    const warm: Phase = { warmupMs: warmSec * 1000, measureMs: 0, signal: ctx.life.signal };
    for (const op of [clients.plain, clients.newKey, clients.replay, clients.replayCached, clients.colocatedNewKey, clients.colocatedReplay]) await closedLoop(workers, warm, op);
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
          return closedLoop(workers, phaseOf(ctx), op);
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
    // Each key's first replay through the cache is the coordinator's, as in (c): made before (c'), which measures exact repeats.
    progress(`${tag}answer cache primed: ${await clients.primeAnswerCache()} completed keys replayed once through it (not measured)`);
    const replaysCached = await side("(c') SDK, replays, answer cache on", clients.replayCached);
    const colocatedNewKeys = await side("(d) co-located, new keys", clients.colocatedNewKey);
    const colocatedReplays = await side("(d) co-located, replays", clients.colocatedReplay);
    const calls = (p: ServicePhase) =>
      p.callsPerRequest
        ? Object.entries(p.callsPerRequest)
            .map(([method, n]) => `${method} ${n.toFixed(2)}`)
            .join(", ") || "none"
        : "unknown";
    progress(
      `${tag}coordinator calls per request: (a) ${calls(plain)}; (b) ${calls(newKeys)}; (c) ${calls(replays)}; (c') ${calls(replaysCached)}; (d) ${calls(colocatedNewKeys)}, ${calls(colocatedReplays)}`,
    );
    const over = (a: number, b: number) => (b > 0 && Number.isFinite(a) ? a / b : null);
    return {
      clients: workers,
      description:
        `Express 5 service in its own process, one row per POST (INSERT, its own transaction, synchronous_commit=on), ` +
        `${workers} HTTP/1.1 keep-alive clients in the benchmark's process, one user each; (b), (c) and (c') through the gateway SDK's Express middleware ((c): its answer cache off); ` +
        `(d) through it in co-located mode (no RPC: the lifecycle on a pool of its own in the registry's database${ctx.serviceRole ? `, as role ${ctx.serviceRole}` : ""})`,
      environment: service.environment,
      plain,
      newKeys,
      replays,
      replaysCached,
      colocatedNewKeys,
      colocatedReplays,
      ratios: {
        newVsPlain: over(newKeys.opsPerSec, plain.opsPerSec),
        replaysVsPlain: over(replays.opsPerSec, plain.opsPerSec),
        replaysCachedVsPlain: over(replaysCached.opsPerSec, plain.opsPerSec),
        p99NewVsPlain: over(newKeys.p99Ms, plain.p99Ms),
        colocatedNewVsPlain: over(colocatedNewKeys.opsPerSec, plain.opsPerSec),
        colocatedReplaysVsPlain: over(colocatedReplays.opsPerSec, plain.opsPerSec),
        p99ColocatedNewVsPlain: over(colocatedNewKeys.p99Ms, plain.p99Ms),
      },
    };
  } finally {
    clients.close();
    await service.stop();
  }
}

/**
 * The database level under one commit setting, with nothing else running:
 * the registry's statements (the pgbench script of the coordinator level)
 * beside a bare one-row insert (bench/write-path.ts).
 */
async function databaseLevel(ctx: Context, pgb: PgbenchState, tag: string): Promise<WritePath> {
  const { options, life } = ctx;
  await prepareBaselineTables(ctx.database.url, ctx.role);
  life.progress(`${tag}database level: the registry's statements and a bare one-row insert, by pgbench at 16 in flight, then ${options.writeOps} of each one at a time`);
  return measureWritePath(
    {
      ownerUrl: ctx.database.url,
      target: pgb.target!,
      registryScript: ctx.scriptFile,
      registryVariables: ctx.variables,
      workDir: pgb.workDir,
      clients: 16,
      warmupMs: options.warmupSec * 1000,
      measureMs: options.measureSec * 1000,
      sequential: options.writeOps,
      postmasterPid: ctx.database.postmasterPid,
      progress: life.progress,
      checkpoint: life.checkpoint,
      onChild: pgb.onChild,
    },
    tag,
  );
}

async function run(options: Options, argv: string[], life: RunLifetime): Promise<BenchResult> {
  const { progress, checkpoint } = life;
  const startedAt = new Date();
  const loadBefore = os.loadavg();
  const runCoordinatorLevel = options.level === "coordinator" || options.level === "all";
  const runServiceLevel = options.level === "service" || options.level === "all";
  const runDatabaseLevel = options.level === "database" || options.level === "all";
  const phaseSec = options.warmupSec + options.measureSec + 1;
  const perCommit =
    (runCoordinatorLevel ? (options.concurrency.length + options.open.length) * 3 * phaseSec + 8 : 0) + (runServiceLevel ? 6 * (phaseSec + options.warmupSec) + 6 : 0) + 3;
  const databaseSec = runDatabaseLevel ? 2 * phaseSec + 10 + options.writeOps * 0.02 : 0;
  const estimate = 10 + options.commit.length * (perCommit + databaseSec) + (runCoordinatorLevel ? 12 + options.roundTripOps * 0.06 : 0);
  const levels = options.level === "all" ? "coordinator, service and database levels" : `${options.level} level`;
  progress(
    `idempotency coordinator benchmark${options.quick ? " (quick)" : ""}: ${levels}, synchronous_commit ${options.commit.join(" then ")}; ` +
      `phases of ${options.warmupSec} s warm-up + ${options.measureSec} s measured, about ${Math.round(estimate / 5) * 5} s`,
  );
  const logger = pino({ level: "warn" }, pino.destination(2));

  const pgbench = runCoordinatorLevel || runDatabaseLevel ? await findPgbench() : undefined;
  const pgb: PgbenchState = {
    use: false,
    checked: false,
    onChild: life.trackChild(),
    logRun: 0,
    workDir: await mkdtemp(join(os.tmpdir(), "idem-bench-pgbench-")),
    ...((runCoordinatorLevel || runDatabaseLevel) && !pgbench
      ? { skipped: "pgbench not found ($PGBENCH, PATH, /usr/lib/postgresql/*/bin): install the PostgreSQL client (e.g. apt-get install postgresql-client)" }
      : {}),
  };
  life.onExit("pgbench's files", () => rm(pgb.workDir, { recursive: true, force: true }));
  if (runCoordinatorLevel || runDatabaseLevel) progress(pgbench ? `pgbench: ${pgbench.path} (${pgbench.version})` : `${pgb.skipped}; the pgbench baseline is skipped`);

  progress(options.databaseUrl ? "database: --database-url" : "starting a dedicated embedded PostgreSQL (fsync=on, pg_stat_statements)");
  const database = await startDatabase({ ...(options.databaseUrl ? { databaseUrl: options.databaseUrl } : {}), logger });
  life.onExit("the database", () => database.stop());
  if (!database.embedded) {
    // Someone else's server: the database gets its own default back.
    life.onExit("the database's synchronous_commit", () => synchronousCommit(database.url, undefined).then(() => undefined));
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
  const serviceRole = runServiceLevel ? await prepareServiceTable(database.url) : undefined;
  const statements = await enableStatements(database.url);
  if (runCoordinatorLevel && !statements.available) progress(`statements per RPC will be reported as unavailable: ${statements.reason}`);
  const facts = await databaseFacts(database.url);
  progress(`${facts.version.split(" on ")[0]}: fsync=${facts.settings.fsync}`);
  checkpoint();

  const values = operationValues();
  const { script, pipelines, variables } = pgbenchScript(values);
  const scriptFile = join(pgb.workDir, "reserve-complete.sql");
  await writeFile(scriptFile, script);
  const snapshotKeys = JSON.stringify({ active: values.keyId, keys: { [values.keyId]: randomBytes(32).toString("base64") } });
  const token = `bench_${randomBytes(24).toString("hex")}`;
  const ctx: Context = { options, life, database, statements, values, token, pgbench, scriptFile, pipelines, variables, snapshotKeys, serviceRole };

  const commits: CommitRun[] = [];
  let serverInfo: BenchResult["server"] | undefined;
  for (const setting of options.commit) {
    const seen = await synchronousCommit(database.url, setting);
    const tag = options.commit.length > 1 ? `[commit ${setting}] ` : "";
    progress(`${tag}synchronous_commit=${seen} for every new connection to the database (the coordinator, pgbench and the service connect afresh)`);
    checkpoint();
    // The database level alone needs no coordinator: pgbench acts as the role the coordinator's configuration names.
    const main = runCoordinatorLevel || runServiceLevel ? await coordinator(ctx, `the coordinator (synchronous_commit=${setting})`, database.url) : undefined;
    if (main) {
      const { server, clients } = main;
      serverInfo ??= { mode: server.mode, environment: server.environment };
      if (server.databaseRole) ctx.role = server.databaseRole;
      progress(
        `${tag}coordinator serving on ${server.baseUrl} (${server.mode === "process" ? `separate process, pid ${server.pid}` : "in this process"}, registry pool ${options.poolMax})`,
      );
      await clients.operation(0);
      await clients.noop(0);
    } else {
      ctx.role ??= loadConfig({ DATABASE_URL: database.url, IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: "true" }).db.role;
    }
    checkpoint();

    if ((runCoordinatorLevel || runDatabaseLevel) && pgbench && !pgb.checked) {
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

    const rows = runCoordinatorLevel && main ? await coordinatorLevel(ctx, main, pgb, tag) : [];
    const service = runServiceLevel && main ? await serviceLevel(ctx, main, tag) : null;
    await main?.stop();
    const writePath = runDatabaseLevel && pgb.use ? await databaseLevel(ctx, pgb, tag) : undefined;
    const part: CommitRun = { synchronousCommit: seen, rows, service, ...(writePath ? { writePath } : {}) };
    for (const goal of goalLines(part)) progress(`${tag}${goal}`);
    commits.push(part);
  }

  let roundTrips: RoundTrips = { available: false, reason: `not measured: the coordinator level did not run (--level ${options.level})` };
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
    server: serverInfo ?? { mode: "none", environment: {} },
    loadGenerator: {
      description:
        options.client === "sdk"
          ? `the gateway SDK's CoordinatorClient (concurrent calls in Batch RPCs) over ${options.connections} HTTP/2 connection(s), in the benchmark's process`
          : `${options.protocol === "grpc" ? "the gateway SDK's gRPC transport" : "@connectrpc/connect-node's Connect (binary) transport"}, one unary RPC per call, over ${options.connections} HTTP/2 connection(s), in the benchmark's process`,
      protocol: options.protocol === "grpc" ? "gRPC (binary protobuf) over HTTP/2 cleartext, as the gateway SDK" : "Connect protocol (binary protobuf) over HTTP/2 cleartext",
      connections: options.connections,
      noop: `two grpc.health.v1.Health/Check RPCs per operation (Reserve + Complete are two RPCs), through ${options.protocol === "grpc" ? "the gateway SDK's gRPC transport" : "the Connect transport"}`,
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
        : { skipped: pgb.skipped ?? (runCoordinatorLevel || runDatabaseLevel ? "unknown" : "the coordinator level did not run") },
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
  let parsed: ReturnType<typeof parseBenchArgs>;
  try {
    parsed = parseBenchArgs(argv);
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
  const life = new RunLifetime();
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(signal, life.onSignal);
  // Nothing may leave a coordinator or the database running: an unexpected error still cleans up.
  process.on("uncaughtException", (error) => {
    process.stderr.write(`benchmark failed: ${error.stack ?? error.message}\n`);
    life.stop();
    void life.cleanup().finally(() => process.exit(1));
  });
  let exitCode = 0;
  try {
    const result = await run(options, argv, life);
    await mkdir(join(options.out, ".."), { recursive: true });
    await writeFile(options.out, `${JSON.stringify(result, null, 2)}\n`);
    const shown = relative(process.cwd(), options.out);
    process.stdout.write(`\n${renderText(result)}\n\nJSON: ${shown.startsWith("..") ? options.out : shown}\n`);
  } catch (error) {
    if (error instanceof Aborted || life.signal.aborted) {
      exitCode = 130;
    } else {
      process.stderr.write(`benchmark failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
      exitCode = 1;
    }
  } finally {
    life.progress(`cleaning up: ${options.databaseUrl ? "" : "the embedded PostgreSQL, "}temporary files`);
    await life.cleanup();
  }
  process.exit(exitCode);
}

await main();
