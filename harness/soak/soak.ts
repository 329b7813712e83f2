/**
 * The soak (`npm run soak`, docs/soak.md): the launch gate's load through the
 * payments example and three coordinator replicas on the Patroni registry,
 * paced at half of its peak on this machine (the lower of `npm run bench`'s
 * and a calibration run's), for a long time (30 minutes; `--quick` 4), while
 * something keeps dying:
 *
 *   every 5 s        a registry backend terminated (pg_terminate_backend)
 *   every minute     a coordinator replica killed and restarted (replica 0 is
 *                    spared: one process lives through the whole run)
 *   now and then     the payments service killed and restarted
 *   once each        a Patroni switchover, a pause of the synchronous
 *                    standby, a kill of the primary (in the middle of the run)
 *
 * It samples every process and the registry every few seconds and judges, at
 * the end, the gate's lines (no duplicate effect, no acknowledged decision
 * lost, no false conflict, UNKNOWN settled within the SLO) and its own
 * (soak/judge.ts): the P99 of the last five minutes against the first five
 * (leaving out the answers sent while a killed process recovered),
 * memory and handles flat after warm-up, no connection held at rest, the
 * retention sweep keeping up. Prints the table, writes soak.html (the time
 * series as charts) and soak.json; exit code 0 when every line passes, 1
 * when one fails, 2 on bad usage.
 */
import { join } from "node:path";
import pg from "pg";
import { runGate } from "../gate/gate.js";
import type { ChaosEvent, RegistryFault } from "../gate/chaos.js";
import { Samples } from "../lib/histogram.js";
import type { LoadStats } from "../gate/load.js";
import type { Criterion } from "../lib/criterion.js";
import { parseDuration, type RunObserver, type RunView } from "../gate/options.js";
import { formatDuration } from "../lib/format.js";
import type { CommonOptions, RegistryRun } from "../ha/on-registry.js";
import { runHaFault, type HaFault } from "../ha/faults.js";
import { paymentsPolicy } from "../../examples/payments/policy.js";
import { compareWindows } from "./compare.js";
import { judgeConnectionsAtRest, judgeFlat, judgeP99Drift, judgeRetention, latencyBetween, type Outage, type Spans } from "./judge.js";
import { writeSoakReport, type SoakReport } from "./report.js";
import { Sampler } from "./sampler.js";

/** Short enough that the sweep turns records into tombstones during the run; every window retention must cover fits in it. */
const RETENTION = { keep: "2m", clientRetryWindow: "1m", queueBacklogWindow: "30s", reconciliationWindow: "2m", backupRestoreWindow: "0s" };
const SWEEP_INTERVAL_MS = 15_000;
const SAMPLE_INTERVAL_MS = 5_000;
const BACKEND_KILL_INTERVAL_MS = 5_000;
/**
 * How long after a killed replica or service is ready again its recovery
 * lasts for the P99 line (soak/judge.ts, latencyBetween): calls retried
 * elsewhere, duplicates waiting on their owners, the new process's first
 * connections. The answers sent from the kill until then are left out of it.
 */
const KILL_SETTLE_MS = 2_000;
/**
 * The load's first seconds, left out of the P99 line's first window: a cold
 * stack's first answers (pools opening their connections, code compiled on
 * first use) take up to a second, and in the quick run's one-minute window
 * they alone were its slowest 1 %, which made the line lenient toward the end.
 */
const LOAD_WARMUP_MS = 10_000;
/**
 * The registry faults, once each, between the first and the last windows the
 * P99 line compares: at these shares of the span between them, so that each
 * one and its recovery (10 to 15 s) end well before the last window.
 */
const REGISTRY_FAULTS: Array<{ kind: HaFault; at: number }> = [
  { kind: "switchover", at: 0.1 },
  { kind: "standby pause", at: 0.4 },
  { kind: "primary kill", at: 0.65 },
];

export interface SoakOptions extends CommonOptions {
  durationMs: number;
  rate: number | undefined;
  /** The rate to run at: --rate, or half of the benchmark's peak (lowered by the calibration run when that is lower). */
  target: { rate: number; source: string };
}

/**
 * The peak of this stack (the payments example through the replicas on the
 * Patroni registry, the gate's mix of requests) on this machine: a short
 * closed-loop run without faults; the soak runs at half of it when that is
 * below half of the benchmark's.
 */
async function calibrate(url: string, options: SoakOptions, signal: AbortSignal, log: (line: string) => void): Promise<{ rate: number; source: string }> {
  log("calibrating: the stack's peak, closed loop at 16 in flight, no faults…");
  const run = await runGate({
    quick: true,
    databaseUrl: url,
    replicas: options.replicas,
    concurrency: 16,
    requests: options.quick ? 2_000 : 5_000,
    serviceKills: 0,
    coordinatorKills: 0,
    judgeReserveLatency: false,
    outDir: join(options.outDir, "calibration"),
    progress: false,
    verbose: options.verbose,
    signal,
  });
  const peak = run.report.load.requestsPerSecond;
  return {
    rate: Math.max(1, Math.round(peak / 2)),
    source: `half of ${peak.toFixed(0)} requests/s, this stack's peak in a calibration run of ${run.report.load.httpRequests} requests`,
  };
}

/** Terminates one client backend of the registry (not the soak's or the gate's own, not Patroni's) every `intervalMs`. */
function backendKiller(url: string, intervalMs: number, signal: AbortSignal): { stop(): Promise<number> } {
  const pool = new pg.Pool({ connectionString: url, max: 1, application_name: "idem-soak" });
  pool.on("error", () => undefined);
  let terminated = 0;
  const timer = setInterval(() => {
    if (signal.aborted) return;
    pool
      .query<{ done: boolean }>(
        `SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity
          WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
            AND application_name NOT IN ('idem-soak', 'idem-gate') AND application_name NOT LIKE 'Patroni%'
          ORDER BY random() LIMIT 1`,
      )
      .then(({ rows }) => {
        if (rows[0]?.done) terminated++;
      })
      // During a failover there is nothing to terminate: the next tick tries again.
      .catch(() => undefined);
  }, intervalMs);
  return {
    async stop() {
      clearInterval(timer);
      await pool.end().catch(() => undefined);
      return terminated;
    },
  };
}

/**
 * The client latency, kept per second by the load, in windows of `windowMs`
 * for the charts, and the first and last `count` complete windows for the
 * P99 line: judged with the load's warm-up and the answers sent while a
 * killed process recovered left out, and reported with every answer.
 */
function latencyWindows(stats: LoadStats, windowMs: number, count: number, outages: readonly Outage[]) {
  const complete = Math.floor((stats.finishedAt - stats.startedAt) / windowMs);
  const seconds = windowMs / 1000;
  const between = (fromMs: number, toMs: number, leftOut: readonly Outage[]) =>
    latencyBetween(stats.windows, stats.startedAt, stats.startedAt + fromMs, stats.startedAt + toMs, leftOut);
  const lastFrom = Math.max(count, complete - count) * windowMs;
  const lastTo = complete * windowMs;
  return {
    all: Array.from({ length: complete }, (_, i) => {
      const { p50Ms, p99Ms, count: answers } = Samples.merge(stats.windows.slice(i * seconds, (i + 1) * seconds)).summary();
      return { fromMs: i * windowMs, p50Ms, p99Ms, steadyP99Ms: between(i * windowMs, (i + 1) * windowMs, outages).p99Ms, count: answers };
    }),
    first: between(LOAD_WARMUP_MS, count * windowMs, outages),
    last: between(lastFrom, lastTo, outages),
    firstSpan: { from: stats.startedAt + LOAD_WARMUP_MS, to: stats.startedAt + count * windowMs },
    lastSpan: { from: stats.startedAt + lastFrom, to: stats.startedAt + lastTo },
    firstAll: between(0, count * windowMs, []),
    lastAll: between(lastFrom, lastTo, []),
  };
}

/** From each kill of a replica or the service until KILL_SETTLE_MS after it was ready again (until the load's end if it never was). */
function outagesOf(events: readonly ChaosEvent[], loadFinishedAt: number): Outage[] {
  return events
    .filter((e) => e.target !== "registry" && e.killedAt)
    .map((e) => {
      const from = Date.parse(e.killedAt!);
      return { from, to: e.downMs === undefined ? loadFinishedAt : from + e.downMs + KILL_SETTLE_MS };
    });
}

/** The soak on a started registry: resolves with whether every line passed. */
export async function soak(options: SoakOptions, { ha, log, signal }: RegistryRun): Promise<boolean> {
  const minutes = options.durationMs / 60_000;
  // The P99 line compares five minutes (a quarter of a shorter run) at each end, kept in windows of
  // a minute (of 30 s in a short run); lives are judged after their own warm-up.
  const windowMs = minutes >= 20 ? 60_000 : 30_000;
  const comparedWindows = Math.max(1, Math.floor(Math.min(5 * 60_000, options.durationMs / 4) / windowMs));
  const compared = (comparedWindows * windowMs) / options.durationMs;
  // A run shorter than a quarter of an hour cannot tell a process growing to its working size from a leak (Spans.short).
  const short = options.durationMs < 15 * 60_000;
  const spans: Spans = {
    warmupMs: short ? 0.4 * options.durationMs : 5 * 60_000,
    minSpanMs: Math.min(8 * 60_000, 0.4 * options.durationMs),
    bucketMs: Math.min(60_000, Math.max(10_000, options.durationMs / 40)),
    short,
  };

  let target = options.target;
  let view: RunView | undefined;
  let sampler: Sampler | undefined;
  let killer: ReturnType<typeof backendKiller> | undefined;
  let terminatedBackends = 0;
  /** The load's latency windows, once the load is over (moreCriteria): the P99 line and the report read the same. */
  let latency: ReturnType<typeof latencyWindows> | undefined;
  try {
    if (options.rate === undefined) {
      const peak = await calibrate(ha.url, options, signal, log);
      if (peak.rate < target.rate) target = peak;
    }
    log(`soak: ${formatDuration(options.durationMs)} at ${target.rate} requests/s (${target.source}), ${options.replicas} replicas on Patroni`);
    const registryFaults: RegistryFault[] = REGISTRY_FAULTS.map(({ kind, at }) => ({
      name: kind,
      at: Number((compared + at * (1 - 2 * compared)).toFixed(3)),
      run: async () => void (await runHaFault(ha, kind, log)),
    }));
    const observe = (run: RunView): RunObserver => {
      view = run;
      sampler = new Sampler(run.cluster, run.pool, { intervalMs: SAMPLE_INTERVAL_MS, overdueGraceMs: 2 * SWEEP_INTERVAL_MS });
      sampler.start();
      killer = backendKiller(run.database.url, BACKEND_KILL_INTERVAL_MS, run.signal);
      return {
        async stop() {
          terminatedBackends = await killer!.stop();
          await sampler!.stop();
        },
      };
    };
    const moreCriteria = async (): Promise<Criterion[]> => {
      await sampler!.atRest();
      latency = latencyWindows(view!.stats, windowMs, comparedWindows, outagesOf(view!.chaos, view!.stats.finishedAt));
      return [
        judgeP99Drift(latency.first, latency.last, comparedWindows * windowMs),
        judgeFlat("memory", sampler!.lives, spans),
        judgeFlat("handles", sampler!.lives, spans),
        judgeConnectionsAtRest(sampler!.lives),
        judgeRetention(
          sampler!.registry.map((s) => ({ t: s.t, v: s.overdue })),
          sampler!.registry.at(-1)?.tombstones ?? 0,
          view!.stats.startedAt + parseDuration(RETENTION.keep, "keep"),
        ),
      ];
    };
    const result = await runGate({
      quick: options.quick,
      databaseUrl: ha.url,
      replicas: options.replicas,
      rate: target.rate,
      requests: Math.round((target.rate * options.durationMs) / 1000),
      concurrency: 16,
      // Per second: the P99 line leaves out the seconds of the kills' recoveries.
      latencyWindowMs: 1000,
      spareFirstReplica: true,
      killSpan: [0.02, 0.98],
      coordinatorKills: Math.max(1, Math.floor(minutes)),
      // One near each end: the windows the P99 line compares see the same faults.
      serviceKills: 2,
      registryFaults,
      judgeReserveLatency: false,
      coordinatorEnv: {
        IDEM_OPERATIONS: JSON.stringify([paymentsPolicy({ retention: RETENTION })]),
        IDEM_SWEEP_INTERVAL_MS: String(SWEEP_INTERVAL_MS),
      },
      observe,
      moreCriteria,
      outDir: join(options.outDir, "gate"),
      verbose: options.verbose,
      signal,
    });
    const stats = view!.stats;
    const windows = latency!;
    const first = sampler!.registry[0];
    const last = sampler!.registry.at(-1);
    const growth = (of: (s: NonNullable<typeof last>) => number) => (first && last ? of(last) - of(first) : 0);
    const perRequest = (bytes: number) => `${(bytes / Math.max(1, stats.sent)).toFixed(0)} bytes per HTTP request`;
    const eventLoopP99 = Math.max(0, ...sampler!.lives.flatMap((l) => l.samples.map((s) => s.eventLoopP99Ms ?? 0)).filter(Number.isFinite));
    const report: SoakReport = {
      passed: result.passed,
      startedAt: result.report.startedAt,
      durationSeconds: result.report.durationSeconds,
      options: {
        durationMs: options.durationMs,
        rate: target.rate,
        rateSource: target.source,
        replicas: options.replicas,
        retention: RETENTION,
        sweepIntervalMs: SWEEP_INTERVAL_MS,
        spans,
      },
      criteria: result.report.criteria,
      facts: [
        ...result.report.facts,
        { name: "registry backends terminated", value: `${terminatedBackends} (one every ${formatDuration(BACKEND_KILL_INTERVAL_MS)})` },
        {
          name: "registry growth",
          value:
            first && last
              ? `records ${perRequest(growth((s) => s.bytes.idem_record ?? 0))}, events ${perRequest(growth((s) => s.bytes.idem_event ?? 0))}, effect attempts ${perRequest(growth((s) => s.bytes.idem_effect_attempt ?? 0))}; ${last.tombstones} tombstones, ${last.events} events`
              : "not sampled",
        },
        { name: "event-loop delay, coordinators", value: `P99 at most ${eventLoopP99.toFixed(1)} ms in any sample` },
        {
          name: "P99 of every answer, kills' recoveries included (not judged)",
          value: `last ${formatDuration(comparedWindows * windowMs)} ${windows.lastAll.p99Ms.toFixed(1)} ms, first ${windows.firstAll.p99Ms.toFixed(1)} ms (${((windows.lastAll.p99Ms / windows.firstAll.p99Ms) * 100).toFixed(0)} %)`,
        },
        ...(sampler!.errors.length > 0 ? [{ name: "samples that failed (faults)", value: `${sampler!.errors.length}, e.g. ${sampler!.errors[0]}` }] : []),
      ],
      windows: windows.all,
      timeline: stats.timeline,
      lives: sampler!.lives,
      machine: sampler!.machine,
      generator: sampler!.generator,
      registry: sampler!.registry,
      comparison: compareWindows(
        { answers: stats.windows, origin: stats.startedAt, lives: sampler!.lives, machine: sampler!.machine, generator: sampler!.generator, statements: sampler!.statements },
        windows.firstSpan,
        windows.lastSpan,
      ),
      faults: result.report.chaos.events
        .filter((e) => e.killedAt)
        .map((e) => ({
          atMs: Date.parse(e.killedAt!) - stats.startedAt,
          what: e.target === "registry" ? `registry ${e.fault}` : e.replica === undefined ? `${e.target} killed` : `coordinator ${e.replica} killed`,
        })),
      loadStartedAt: stats.startedAt,
    };
    const files = await writeSoakReport(report, options.outDir);
    process.stdout.write(`\n${result.table.replace(/^Launch gate/, "Soak on Patroni: launch gate")}`);
    process.stderr.write(`report: ${files.html}\n        ${files.json}\n        ${result.files.html}\n`);
    return result.passed;
  } finally {
    await killer?.stop().catch(() => 0);
    await sampler?.stop();
  }
}
