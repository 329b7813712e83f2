/**
 * The launch gate (`npm run gate`, docs/contract.md "Launch gate"): drives HTTP
 * requests through the payments example and the coordinator, with many
 * concurrent and late replays per key and a share of conflicting payloads,
 * kills (SIGKILL) and restarts the service and the coordinator during the
 * run, then reads the database, the card provider and the coordinator's
 * metrics and prints the gate's table:
 *
 *   duplicate logical effects                        = 0
 *   false payload-conflict hits                      = 0
 *   replay snapshot digest agreement                 = 100 %
 *   UNKNOWN records older than the recovery SLO      < 0.01 %
 *   P99 of the reservation transaction               <= 5 % of the API latency budget
 *
 * plus two supplementary lines (true conflicts are refused; registry,
 * payments, outbox and provider agree). Writes gate-report/report.json and
 * report.html (latency histograms as inline SVG). Exit code 0 when every line
 * passes, 1 when one fails, 2 on bad usage. `--help` lists the options;
 * docs/launch-gate.md explains each line and how it is measured.
 *
 * `runGate(options)` is the programmatic entry; cli.ts wraps it.
 */
import { execFileSync } from "node:child_process";
import { setMaxListeners } from "node:events";
import { readFileSync, rmSync } from "node:fs";
import { cpus, freemem, loadavg, release, totalmem } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { startCluster, type Cluster } from "../lib/cluster.js";
import { chaosMonkey, planChaos, providerFaults, type ChaosMonkey } from "./chaos.js";
import { openGateDatabase, type GateDatabase } from "./database.js";
import { CLIENT_BOUNDS_MS } from "../lib/histogram.js";
import { LoadGenerator, OUTCOME_CLASSES } from "./load.js";
import { cpuUsage, sampleCpu, type CpuUsage } from "../lib/machine.js";
import { unsettledCounts } from "./facts.js";
import { measure, type Measurement } from "./measure.js";
import { resolveOptions, type GateInput, type GateOptions } from "./options.js";
import { Progress } from "./progress.js";
import { renderTable, writeReports, type GateReport } from "./report.js";
import { MetricsScraper, ReserveTracker } from "./reserve.js";
import { formatDuration } from "../lib/format.js";
import { pause } from "../lib/timers.js";

export type { GateInput, GateOptions } from "./options.js";
export type { GateReport } from "./report.js";

export interface GateResult {
  passed: boolean;
  report: GateReport;
  /** The table as printed on stdout by the CLI. */
  table: string;
  files: { json: string; html: string };
}

/** The run was stopped (Ctrl-C, or `signal` aborted); processes and database were cleaned up. */
export class GateAborted extends Error {
  override readonly name = "GateAborted";
}

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

/** Synchronous last-resort cleanups of the runs in progress (a second Ctrl-C, an exit with work pending). */
const emergencyStops = new Set<() => void>();

/** Kills the processes of every run in progress and removes their embedded databases, at once and synchronously. */
export function stopRunsNow(): void {
  for (const stop of emergencyStops) stop();
}

/** What a run has started so far, for its cleanup (and a second Ctrl-C's). */
interface Started {
  db?: GateDatabase;
  cluster?: Cluster;
}

/**
 * Runs the gate: starts PostgreSQL (or a schema in `databaseUrl`) and the
 * cluster, sends the load with chaos, waits for UNKNOWN records to settle,
 * measures, stops everything and writes the reports. Resolves with the
 * verdict (a failing line is not an error); rejects when the run could not be
 * completed, or with GateAborted.
 */
export async function runGate(input: GateInput = {}): Promise<GateResult> {
  const options = resolveOptions(input);
  const log = options.log;
  const startedAt = Date.now();
  const internal = new AbortController();
  const signal = internal.signal;
  // Every sleeping client listens to it.
  setMaxListeners(0, signal);
  const onAbort = () => internal.abort();
  options.signal?.addEventListener("abort", onAbort, { once: true });
  if (options.signal?.aborted) internal.abort();
  const checkpoint = () => {
    if (signal.aborted) throw new GateAborted("aborted");
  };

  const environment = machineEnvironment();
  log(
    `launch gate: ${options.requests.toLocaleString("en-US")} requests, ${options.concurrency} in flight, ` +
      `${options.replicas} coordinator replica(s), ${options.serviceKills} service and ${options.coordinatorKills} coordinator kill(s), seed ${options.seed}; ` +
      `database: ${options.databaseUrl ? "DATABASE_URL (a fresh schema)" : `embedded PostgreSQL${options.durable ? " (durable)" : " (fsync off)"}`}`,
  );

  const started: Started = {};
  const emergency = () => emergencyStop(started, options.keep);
  emergencyStops.add(emergency);
  const phases = { startupSeconds: 0, loadSeconds: 0, settleSeconds: 0, measureSeconds: 0 };
  let aborted = false;
  try {
    const { db, cluster } = await start(options, started, checkpoint);
    environment.database = {
      kind: db.kind,
      version: db.version,
      settings: db.kind === "embedded" ? db.settings : "the server's own",
      schema: db.schema ?? "public (a fresh database)",
    };
    phases.startupSeconds = (Date.now() - startedAt) / 1000;
    checkpoint();

    const load = await runLoad(options, db, cluster, signal);
    phases.loadSeconds = load.seconds;
    environment.cpuDuringLoad = load.cpu ? { ...load.cpu, generatorShare: Number(load.generatorShare.toFixed(3)) } : "unknown (no /proc)";
    checkpoint();
    if (load.chaosFailure) throw new Error(`a killed process could not be restarted: ${load.chaosFailure.message}`);
    await load.faults.settled();

    const settlement = await settle(db, options, signal);
    checkpoint();
    phases.settleSeconds = settlement.seconds;

    const measureStarted = Date.now();
    await load.scraper.endAllLives();
    const measurement = await measure({
      pool: db.pool,
      keys: load.generator.keys,
      stats: load.generator.stats,
      provider: await cluster.providerState(),
      reserve: load.trackers.reserve.total(),
      reserveRpc: load.trackers.reserveRpc.total(),
      options,
    });
    if (options.moreCriteria) measurement.criteria.push(...(await options.moreCriteria()));
    phases.measureSeconds = (Date.now() - measureStarted) / 1000;

    environment.loadAverageAtEnd = loadavg().map((n) => Number(n.toFixed(2)));
    const report = gateReport({ options, startedAt, finishedAt: Date.now(), phases, environment, db, load, settlement, measurement });
    const files = await writeReports(report, options.outDir);
    return { passed: report.passed, report, table: renderTable(report), files };
  } catch (error) {
    if (error instanceof GateAborted || signal.aborted) {
      aborted = true;
      throw error instanceof GateAborted ? error : new GateAborted("aborted", { cause: error });
    }
    throw error;
  } finally {
    options.signal?.removeEventListener("abort", onAbort);
    if (started.cluster) await stopCluster(started.cluster, aborted);
    const db = started.db;
    if (db) {
      await db.close(options.keep).catch((error: unknown) => log(`database cleanup failed: ${(error as Error).message}`));
      if (options.keep) log(db.kind === "embedded" ? `kept the embedded cluster's files in ${db.dataDir}` : `kept schema ${db.schema ?? "public"}`);
    }
    emergencyStops.delete(emergency);
  }
}

/** The machine the run starts on, for the report. */
function machineEnvironment(): Record<string, unknown> {
  return {
    node: process.version,
    platform: `${process.platform} ${release()} ${process.arch}`,
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model ?? "unknown",
    memoryGiB: Number((totalmem() / 2 ** 30).toFixed(1)),
    freeMemoryGiBAtStart: Number((freemem() / 2 ** 30).toFixed(1)),
    loadAverageAtStart: loadavg().map((n) => Number(n.toFixed(2))),
    code: codeVersion(),
  };
}

/** Kills a run's processes and its embedded PostgreSQL at once, synchronously, and removes the PostgreSQL's files unless `keep`. */
function emergencyStop(started: Started, keep: boolean): void {
  const { cluster, db } = started;
  for (const member of cluster ? [cluster.service, cluster.provider, ...cluster.coordinators] : []) void member.kill("SIGKILL");
  if (db?.kind === "embedded" && db.dataDir) {
    try {
      const pid = Number(readFileSync(join(db.dataDir, "postmaster.pid"), "utf8").split("\n")[0]);
      if (pid > 0) process.kill(pid, "SIGQUIT");
      if (!keep) rmSync(resolve(db.dataDir, ".."), { recursive: true, force: true });
    } catch {
      // best effort
    }
  }
}

/** The run's PostgreSQL, then the coordinator replicas, the card provider and the payments service on it. */
async function start(options: GateOptions, started: Started, checkpoint: () => void): Promise<{ db: GateDatabase; cluster: Cluster }> {
  const db = await openGateDatabase({ databaseUrl: options.databaseUrl, durable: options.durable, keep: options.keep });
  started.db = db;
  checkpoint();
  options.log(`starting ${options.replicas} coordinator replica(s), the card provider and the payments service (${db.schema ? `schema ${db.schema}` : "a fresh database"})…`);
  const cluster = await startCluster({
    databaseUrl: db.url,
    ...(db.schema ? { schema: db.schema } : {}),
    verbose: options.verbose,
    replicas: options.replicas,
    // Reserve over RPC: the gate judges the coordinator's reservation transaction.
    colocated: "completion",
    coordinatorEnv: {
      IDEM_UNKNOWN_SLO_SECONDS: String(Math.max(1, Math.ceil(options.recoverySloMs / 1000))),
      IDEM_RECOVERER_INTERVAL_MS: "1000",
      ...options.coordinatorEnv,
    },
  });
  started.cluster = cluster;
  return { db, cluster };
}

/** The coordinators' histograms followed through the run. */
interface Trackers {
  /** The reservation transaction's, which the line judges. */
  reserve: ReserveTracker;
  /** The whole Reserve RPC's (pool wait and queueing included), reported beside it. */
  reserveRpc: ReserveTracker;
  /** Registry work run again after a transient failure: lost connections (kills, failovers), COMMITs whose answer was lost among them. */
  reruns: ReserveTracker;
}

interface LoadOutcome {
  generator: LoadGenerator;
  faults: ReturnType<typeof providerFaults>;
  chaos: ChaosMonkey;
  scraper: MetricsScraper;
  trackers: Trackers;
  seconds: number;
  /** The machine while the load ran (undefined without /proc), and the load generator's own share of it. */
  cpu: CpuUsage | undefined;
  generatorShare: number;
  /** Why the chaos stopped the load: a killed process that could not be restarted. */
  chaosFailure: Error | undefined;
}

/** The load with its chaos and provider faults, the coordinators' metrics scraped every 5 s and before each kill, progress on stderr. */
async function runLoad(options: GateOptions, db: GateDatabase, cluster: Cluster, signal: AbortSignal): Promise<LoadOutcome> {
  const log = options.log;
  const faults = providerFaults({ cluster, declineShare: options.declineShare, ambiguousShare: options.ambiguousShare, log });
  const generator = new LoadGenerator(options, cluster.service.url, { onKeyStarted: (n) => faults.onKeyStarted(n), signal });
  const loadStarted = Date.now();
  const trackers: Trackers = {
    reserve: new ReserveTracker(() => loadStarted, { name: "idem_registry_transaction_seconds", labels: { transaction: "reserve" } }),
    reserveRpc: new ReserveTracker(() => loadStarted, { name: "idem_rpc_duration_seconds", labels: { method: "Reserve" } }),
    reruns: new ReserveTracker(() => loadStarted, { name: "idem_db_retries_total", labels: {} }),
  };
  const scrapes = cluster.coordinators.map((replica) => async () => {
    const res = await fetch(`${replica.adminUrl}/metrics`, { signal: AbortSignal.timeout(5000) });
    if (!res.ok) throw new Error(`GET /metrics: ${res.status}`);
    return res.text();
  });
  const scraper = new MetricsScraper(scrapes, [trackers.reserve, trackers.reserveRpc, trackers.reruns]);
  const cpuAtStart = await sampleCpu();
  const generatorCpuAtStart = process.cpuUsage();
  let chaos: ChaosMonkey | undefined;
  const progress = new Progress(
    () => ({
      sent: generator.stats.sent,
      planned: options.requests,
      inFlight: generator.inFlight,
      activeKeys: generator.activeKeys,
      keys: generator.keys.length,
      kills: {
        service: chaos?.killsDone("service") ?? 0,
        serviceTotal: options.serviceKills,
        coordinator: chaos?.killsDone("coordinator") ?? 0,
        coordinatorTotal: options.coordinatorKills,
      },
      errors: generator.stats.byClass["connection-error"] + generator.stats.byClass.unavailable + generator.stats.byClass["server-error"],
    }),
    options.progress,
    log,
  );
  const note = (line: string) => progress.note(line);
  chaos = chaosMonkey({
    cluster,
    plan: planChaos(options.serviceKills, options.coordinatorKills, options.registryFaults, options.killSpan),
    downtimeMs: options.downtimeMs,
    progress: () => ({ sent: generator.stats.sent, planned: options.requests }),
    beforeCoordinatorKill: (replica) => scraper.endLife(replica),
    registryFaults: options.registryFaults,
    spareFirstReplica: options.spareFirstReplica,
    log: note,
    signal,
  });
  const observer = options.observe?.({ cluster, pool: db.pool, database: { url: db.url, schema: db.schema }, stats: generator.stats, chaos: chaos.events, note, signal });
  let chaosFailure: Error | undefined;
  const chaosRun = chaos.run().catch((error: unknown) => {
    chaosFailure = error as Error;
    generator.stop();
  });
  progress.start();
  const sampler = setInterval(() => void scraper.sample(), 5000);
  try {
    await generator.run();
  } finally {
    clearInterval(sampler);
    chaos.stop();
    await chaosRun;
    await observer?.stop();
    progress.stop();
  }
  const seconds = (Date.now() - loadStarted) / 1000;
  const cpu = cpuUsage(cpuAtStart, await sampleCpu(), cpus().length);
  const generatorCpu = process.cpuUsage(generatorCpuAtStart);
  // The load generator's own process (this one): its share of the machine while it ran.
  const generatorShare = (generatorCpu.user + generatorCpu.system) / 1e6 / Math.max(0.001, seconds) / cpus().length;
  return { generator, faults, chaos, scraper, trackers, seconds, cpu, generatorShare, chaosFailure };
}

interface Settlement {
  seconds: number;
  settled: boolean;
  remaining: { unknown: number; leased: number; recovering: number };
}

/** Waits, up to the settle timeout, until no record is UNKNOWN or leased: recovery has done its work. */
async function settle(db: GateDatabase, options: GateOptions, signal: AbortSignal): Promise<Settlement> {
  const settleStarted = Date.now();
  let remaining = await unsettledCounts(db.pool);
  let lastNote = 0;
  while (remaining.unknown + remaining.leased > 0 && Date.now() - settleStarted < options.settleTimeoutMs && !signal.aborted) {
    if (Date.now() - lastNote >= 5000) {
      lastNote = Date.now();
      options.log(
        `settling: ${remaining.unknown} UNKNOWN, ${remaining.leased} leased (${remaining.recovering} recovering); waited ${formatDuration(Date.now() - settleStarted)} of at most ${formatDuration(options.settleTimeoutMs)}`,
      );
    }
    await pause(1000, signal);
    remaining = await unsettledCounts(db.pool);
  }
  const settled = remaining.unknown + remaining.leased === 0;
  if (!signal.aborted) {
    options.log(
      settled
        ? `settled after ${formatDuration(Date.now() - settleStarted)}`
        : `not settled within ${formatDuration(options.settleTimeoutMs)}: ${remaining.unknown} UNKNOWN, ${remaining.leased} leased`,
    );
  }
  return { seconds: (Date.now() - settleStarted) / 1000, settled, remaining };
}

/** report.json: the verdict, the lines, the facts under them, and everything the page draws. */
function gateReport(run: {
  options: GateOptions;
  startedAt: number;
  finishedAt: number;
  phases: GateReport["phases"];
  environment: Record<string, unknown>;
  db: GateDatabase;
  load: LoadOutcome;
  settlement: Settlement;
  measurement: Measurement;
}): GateReport {
  const { options, load, measurement, settlement } = run;
  const { stats, keys } = load.generator;
  const { cpu, generatorShare, chaos } = load;
  const loadSeconds = Math.max(0.001, (stats.finishedAt - stats.startedAt) / 1000);
  const reserve = load.trackers.reserve.total();
  return {
    gate: "payments launch gate",
    title: options.title,
    contract: "http.idempotency.v1, section 9",
    passed: measurement.criteria.every((c) => c.pass),
    startedAt: new Date(run.startedAt).toISOString(),
    finishedAt: new Date(run.finishedAt).toISOString(),
    durationSeconds: (run.finishedAt - run.startedAt) / 1000,
    phases: run.phases,
    options: publicOptions(options),
    environment: run.environment,
    criteria: measurement.criteria,
    facts: [
      ...measurement.facts,
      { name: "throughput", value: `${(stats.sent / loadSeconds).toFixed(0)} requests/s over ${formatDuration(loadSeconds * 1000)} of load` },
      {
        name: "registry work re-run after a transient failure",
        value: `${load.trackers.reruns.total().count.toLocaleString("en-US")} (lost connections, COMMITs whose answer was lost, deadlocks: idem_db_retries_total of every replica)`,
      },
      ...(cpu
        ? [
            {
              name: "machine during the load",
              value: `${cpu.cores} cores ${Math.round(cpu.hostBusyShare * 100)} % busy: the gate's processes ${Math.round(cpu.gateShare * 100)} % (the load generator ${Math.round(generatorShare * 100)} %), other processes ${Math.round(cpu.otherShare * 100)} %${run.db.kind === "external" ? " (a PostgreSQL server on this machine counts there)" : ""}, taken by the hypervisor ${Math.round(cpu.stolenShare * 100)} %`,
            },
          ]
        : []),
      ...(chaos.unexpectedExits.length ? [{ name: "unexpected process exits", value: chaos.unexpectedExits.map((e) => `${e.target} at ${e.at}`).join(", ") }] : []),
      ...(settlement.settled
        ? []
        : [
            {
              name: "not settled",
              value: `${settlement.remaining.unknown} UNKNOWN and ${settlement.remaining.leased} leased records after ${formatDuration(options.settleTimeoutMs)}`,
            },
          ]),
    ],
    load: {
      httpRequests: stats.sent,
      logicalRequests: keys.length,
      requestsPerSecond: stats.sent / loadSeconds,
      byStatus: stats.byStatus,
      byOutcome: stats.byClass,
      byVariant: stats.byVariant,
      byKind: stats.byKind,
      replayedAnswers: stats.replayedAnswers,
      refusedConnections: stats.refused,
      connectionErrors: stats.connectionErrors,
      providerFaultsRequested: load.faults.injected,
      timeline: stats.timeline,
    },
    chaos: { events: chaos.events, unexpectedExits: chaos.unexpectedExits, scrapeErrors: load.scraper.errors },
    settle: { waitedSeconds: settlement.seconds, settled: settlement.settled, remaining: settlement.remaining },
    registry: { ...measurement.registry, business: measurement.business, provider: measurement.provider },
    latency: {
      clientBoundsMs: CLIENT_BOUNDS_MS,
      client: Object.fromEntries(OUTCOME_CLASSES.map((c) => [c, stats.latency[c].summary()])),
      reserve: {
        histogram: reserve.buckets.map((b) => ({ le: Number.isFinite(b.le) ? b.le : ("+Inf" as const), count: b.count })),
        count: measurement.reserve.count,
        sumSeconds: reserve.sumSeconds,
        scrapes: load.trackers.reserve.livesSeen,
        series: load.trackers.reserve.series,
        p50Ms: measurement.reserve.p50Ms,
        p90Ms: measurement.reserve.p90Ms,
        p99Ms: measurement.reserve.p99Ms,
        p999Ms: measurement.reserve.p999Ms,
        limitMs: options.latencyBudgetMs * options.reserveBudgetShare,
      },
      reserveRpc: measurement.reserveRpc,
    },
    samples: measurement.samples,
  };
}

/** Stops the cluster: SIGTERM (graceful), SIGKILL after 15 s or at once when aborting. */
async function stopCluster(cluster: Cluster, fast: boolean): Promise<void> {
  const killAll = () => Promise.all([cluster.service, cluster.provider, ...cluster.coordinators].map((member) => member.kill("SIGKILL")));
  if (fast) {
    await killAll();
    return;
  }
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    cluster.stop(),
    new Promise<void>((resolve) => {
      timer = setTimeout(() => void killAll().then(() => resolve()), 15_000);
    }),
  ]);
  clearTimeout(timer);
  await killAll();
}

/** Which code ran: the commit and whether the working tree differed from it (read only). */
function codeVersion(): Record<string, unknown> {
  try {
    const git = (...args: string[]) => execFileSync("git", args, { cwd: ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
    const changed = git("status", "--porcelain", "--untracked-files=no").split("\n").filter(Boolean);
    return { commit: git("rev-parse", "HEAD").trim(), modifiedFiles: changed.map((line) => line.slice(3)) };
  } catch {
    return { commit: "unknown" };
  }
}

function publicOptions(options: GateOptions): Record<string, unknown> {
  const { signal: _signal, log: _log, title: _title, databaseUrl, registryFaults, moreCriteria: _moreCriteria, observe: _observe, coordinatorEnv, ...rest } = options;
  return {
    ...rest,
    coordinatorEnv: Object.keys(coordinatorEnv),
    databaseUrl: databaseUrl ? redact(databaseUrl) : undefined,
    registryFaults: registryFaults.map((fault) => ({ name: fault.name, at: fault.at })),
  };
}

function redact(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    return u.toString();
  } catch {
    return "(set)";
  }
}
