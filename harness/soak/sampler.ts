import { readdir, readFile, readlink } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { cpus } from "node:os";
import { monitorEventLoopDelay } from "node:perf_hooks";
import type pg from "pg";
import type { Cluster, Member } from "../lib/cluster.js";
import { promGauge, promTotalsBy, type PromTotals } from "../lib/prometheus.js";
import { cpuUsage, sampleCpu, statFields, type CpuSample } from "../lib/machine.js";

import type { Life, Point } from "./judge.js";

/**
 * What the soak samples every few seconds: each process of the cluster (its
 * RSS, CPU time and descriptors from /proc; a coordinator's heap, event-loop
 * delay, handles and registry pool from its /metrics), the machine's CPU, and
 * the registry (table and index sizes, dead tuples, the event log, the
 * UNKNOWN queue, tombstones and records the retention sweep is late with,
 * backends by client, time per statement). It also samples its own process,
 * which sends the load and times the answers: a clock that slows down would
 * look like a service that does.
 */

/** One registry sample. */
export interface RegistrySample {
  t: number;
  /** Table + index + TOAST bytes, by table. */
  bytes: Record<string, number>;
  deadTuples: Record<string, number>;
  events: number;
  unknown: number;
  tombstones: number;
  /** Finished records past their retention by more than the grace, not tombstoned yet. */
  overdue: number;
  /** Client backends of the registry's database. */
  backends: number;
}

export interface ProcessSample {
  t: number;
  /** CPU time (user and system) the process has used since it started, in seconds: which process a slow minute was busy in. */
  cpuSeconds: number;
  /** The coordinator's event-loop delay P99, in ms. */
  eventLoopP99Ms?: number;
  /** A coordinator's RPCs since it started, by method: how many, and the seconds they took (its histogram's _count and _sum). */
  rpcs?: PromTotals;
  /** A coordinator's registry transactions since it started, by transaction. */
  transactions?: PromTotals;
  poolTotal?: number;
  poolIdle?: number;
  poolWaiting?: number;
  sockets: number;
}

/**
 * The machine over one sampling interval: cores busy, and how many of them
 * the soak's own process tree used (the coordinators, the service, the
 * provider, Patroni, etcd and HAProxy; the registry's PostgreSQL servers
 * detach from it when they start, and count with the rest of the machine).
 */
export interface MachineSample {
  t: number;
  busyCores: number;
  soakCores: number;
  /** Of busyCores, what the hypervisor gave to other machines (steal): a slower machine, not more work. */
  stolenCores: number;
}

/** The soak's own process: the load generator, whose clock times the answers. */
export interface GeneratorSample {
  t: number;
  cpuSeconds: number;
  rssBytes: number;
  heapUsedBytes: number;
  /** Its event-loop delay since the sample before: an answer waits this long to be timed. */
  eventLoopP99Ms: number;
  eventLoopMeanMs: number;
}

/** pg_stat_statements on the registry's primary, by query id: running totals since the server started. */
export interface StatementsSample {
  t: number;
  byQuery: Record<string, { query: string; calls: number; ms: number; rows: number }>;
}

/** A life with the series the judge does not read (sockets, event-loop delay, pool) kept beside it. */
export interface SampledLife extends Life {
  samples: ProcessSample[];
}

const CORES = cpus().length;
/**
 * How often the samples that read a growing table whole (the event log, the
 * tombstones) or every statement's totals are taken: in a 30-minute run the
 * counts came to take 48 ms a call, every 5 s, so the soak's own sampling
 * was a growing share of the registry's work. In between, the last count is
 * carried over.
 */
const SLOW_SAMPLE_INTERVAL_MS = 30_000;
const TABLES = ["idem_record", "idem_event", "idem_effect_attempt", "payments", "payment_outbox"] as const;

export class Sampler {
  readonly lives: SampledLife[] = [];
  readonly registry: RegistrySample[] = [];
  readonly machine: MachineSample[] = [];
  readonly generator: GeneratorSample[] = [];
  readonly statements: StatementsSample[] = [];
  readonly errors: string[] = [];
  private readonly loopDelay = monitorEventLoopDelay({ resolution: 10 });
  /** Whether the registry has pg_stat_statements (undefined: not asked yet). */
  private statementStats: boolean | undefined;
  /** When the slow samples were last taken, and the counts carried over until the next. */
  private lastSlowSample = -Infinity;
  private counted = { events: 0, tombstones: 0 };
  private lastCpu: CpuSample | undefined;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> = Promise.resolve();

  constructor(
    private readonly cluster: Cluster,
    private readonly pool: pg.Pool,
    private readonly options: { intervalMs: number; overdueGraceMs: number },
  ) {}

  start(): void {
    this.loopDelay.enable();
    const tick = () => {
      this.running = this.sample().finally(() => {
        if (this.timer) this.timer = setTimeout(tick, this.options.intervalMs);
      });
    };
    this.timer = setTimeout(tick, 0);
  }

  async stop(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.running;
    this.loopDelay.disable();
  }

  /**
   * Samples `times` times, `gapMs` apart, once the load is over and the
   * records settled, and keeps for each live coordinator the fewest
   * connections it held: a background job may hold one for a moment, a leak
   * holds it in every sample.
   */
  async atRest(times = 5, gapMs = 500): Promise<void> {
    const from = Date.now();
    const fewest = new Map<SampledLife, NonNullable<Life["poolAtRest"]>>();
    for (let i = 0; i < times; i++) {
      if (i > 0) await sleep(gapMs);
      // The first one counts the tombstones and events anew: the end's figures.
      await this.sample(i === 0);
      for (const life of this.lives) {
        const last = life.samples.at(-1);
        if (!last || last.t < from || last.poolTotal === undefined) continue;
        const now = { inUse: last.poolTotal - last.poolIdle!, waiting: last.poolWaiting!, t: last.t };
        const before = fewest.get(life);
        if (!before || now.inUse + now.waiting < before.inUse + before.waiting) fewest.set(life, now);
      }
    }
    for (const [life, pool] of fewest) life.poolAtRest = pool;
  }

  /** One sample of every process and of the registry (`whole`: with the slow samples, whenever they were last taken). */
  async sample(whole = false): Promise<void> {
    const members: Array<[string, Member]> = [
      ...this.cluster.coordinators.map((member, i) => [`coordinator ${i}`, member] as [string, Member]),
      ["service", this.cluster.service],
      ["provider", this.cluster.provider],
    ];
    const slow = whole || Date.now() - this.lastSlowSample >= SLOW_SAMPLE_INTERVAL_MS;
    if (slow) this.lastSlowSample = Date.now();
    await Promise.all([...members.map(([name, member]) => this.sampleProcess(name, member)), this.sampleRegistry(slow), ...(slow ? [this.sampleStatements()] : [])]);
    await this.sampleMachine();
    this.sampleGenerator();
  }

  private sampleGenerator(): void {
    const cpu = process.cpuUsage();
    const memory = process.memoryUsage();
    this.generator.push({
      t: Date.now(),
      cpuSeconds: (cpu.user + cpu.system) / 1e6,
      rssBytes: memory.rss,
      heapUsedBytes: memory.heapUsed,
      eventLoopP99Ms: this.loopDelay.percentile(99) / 1e6,
      eventLoopMeanMs: this.loopDelay.mean / 1e6,
    });
    this.loopDelay.reset();
  }

  /**
   * The registry's time per statement, from pg_stat_statements when the
   * server preloads it (deploy/ha/patroni.yml does): which statements take
   * longer, or run more often, late in the run than early.
   */
  private async sampleStatements(): Promise<void> {
    if (this.statementStats === false) return;
    const t = Date.now();
    try {
      if (this.statementStats === undefined) {
        await this.pool.query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public");
        this.statementStats = true;
      }
      const { rows } = await this.pool.query<{ id: string; query: string; calls: string; ms: number; rows: string }>(
        `SELECT queryid::text AS id, left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query, calls::text, total_exec_time AS ms, rows::text
           FROM public.pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND queryid IS NOT NULL`,
      );
      this.statements.push({ t, byQuery: Object.fromEntries(rows.map((r) => [r.id, { query: r.query, calls: Number(r.calls), ms: r.ms, rows: Number(r.rows) }])) });
    } catch (error) {
      const message = (error as Error).message;
      if (this.statementStats === undefined || /pg_stat_statements must be loaded/.test(message)) {
        // Not preloaded on this server: the rest of the samples go on without it.
        this.statementStats = false;
        this.errors.push(`pg_stat_statements: ${message}`);
      } else this.errors.push(`registry statements: ${message}`);
    }
  }

  /** Whether a minute that slowed down was busier, and whether with the soak's work or something else's. */
  private async sampleMachine(): Promise<void> {
    const now = await sampleCpu();
    const usage = cpuUsage(this.lastCpu, now, CORES);
    this.lastCpu = now;
    if (usage) this.machine.push({ t: now!.at, busyCores: usage.hostBusyShare * CORES, soakCores: usage.gateShare * CORES, stolenCores: usage.stolenShare * CORES });
  }

  private lifeOf(process: string, pid: number, coordinator: boolean): SampledLife {
    let life = this.lives.find((l) => l.process === process && l.pid === pid);
    if (!life) {
      life = { process, pid, rss: [], fds: [], samples: [], ...(coordinator ? { heap: [], handles: [] } : {}) };
      this.lives.push(life);
    }
    return life;
  }

  private async sampleProcess(name: string, member: Member): Promise<void> {
    const pid = member.pid();
    if (pid === undefined) return;
    const t = Date.now();
    try {
      const [status, stat, fds, metrics] = await Promise.all([
        readFile(`/proc/${pid}/status`, "utf8"),
        readFile(`/proc/${pid}/stat`, "utf8"),
        descriptors(pid),
        member.adminUrl ? fetch(`${member.adminUrl}/metrics`, { signal: AbortSignal.timeout(3000) }).then((res) => res.text()) : Promise.resolve(undefined),
      ]);
      const rssKiB = Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? Number.NaN);
      const life = this.lifeOf(name, pid, metrics !== undefined);
      // A value a scrape missed (NaN) is left out: one would spoil a fitted slope.
      const push = (series: Point[], v: number) => void (Number.isFinite(v) && series.push({ t, v }));
      push(life.rss, rssKiB * 1024);
      push(life.fds, fds.total);
      const sample: ProcessSample = { t, cpuSeconds: cpuSecondsOf(stat), sockets: fds.sockets };
      if (metrics !== undefined) {
        push(life.heap!, promGauge(metrics, "idem_nodejs_heap_size_used_bytes"));
        push(life.handles!, promGauge(metrics, "idem_nodejs_active_handles_total"));
        sample.eventLoopP99Ms = promGauge(metrics, "idem_nodejs_eventloop_lag_p99_seconds") * 1000;
        sample.poolTotal = promGauge(metrics, "idem_db_pool_connections", { state: "total" });
        sample.poolIdle = promGauge(metrics, "idem_db_pool_connections", { state: "idle" });
        sample.poolWaiting = promGauge(metrics, "idem_db_pool_connections", { state: "waiting" });
        sample.rpcs = promTotalsBy(metrics, "idem_rpc_duration_seconds", "method");
        sample.transactions = promTotalsBy(metrics, "idem_registry_transaction_seconds", "transaction");
      }
      life.samples.push(sample);
    } catch (error) {
      // A process killed between pid() and the reads: its life ended.
      if (member.pid() === pid) this.errors.push(`${name} (${pid}): ${(error as Error).message}`);
    }
  }

  private async sampleRegistry(slow: boolean): Promise<void> {
    const t = Date.now();
    try {
      const [sizes, counts, whole] = await Promise.all([
        this.pool.query<{ name: string; bytes: string; dead: string }>(
          `SELECT c.relname AS name, pg_total_relation_size(c.oid)::text AS bytes, coalesce(s.n_dead_tup, 0)::text AS dead
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
            WHERE n.nspname = current_schema() AND c.relname = ANY($1)`,
          [TABLES],
        ),
        // Through partial indexes: these cost the same at the end of a run as at its start.
        this.pool.query<{ unknown: string; overdue: string; backends: string }>(
          `SELECT (SELECT count(*) FROM idem_record WHERE state = 'UNKNOWN')::text AS unknown,
                  (SELECT count(*) FROM idem_record
                    WHERE tombstoned_at IS NULL AND state IN ('SUCCEEDED', 'FAILED_FINAL', 'REJECTED')
                      AND retain_until < now() - make_interval(secs => $1::float8 / 1000))::text AS overdue,
                  (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend')::text AS backends`,
          [this.options.overdueGraceMs],
        ),
        slow
          ? this.pool.query<{ events: string; tombstones: string }>(
              `SELECT (SELECT count(*) FROM idem_event)::text AS events,
                      (SELECT count(*) FROM idem_record WHERE tombstoned_at IS NOT NULL)::text AS tombstones`,
            )
          : undefined,
      ]);
      if (whole) this.counted = { events: Number(whole.rows[0]!.events), tombstones: Number(whole.rows[0]!.tombstones) };
      const row = counts.rows[0]!;
      this.registry.push({
        t,
        bytes: Object.fromEntries(sizes.rows.map((r) => [r.name, Number(r.bytes)])),
        deadTuples: Object.fromEntries(sizes.rows.map((r) => [r.name, Number(r.dead)])),
        events: this.counted.events,
        unknown: Number(row.unknown),
        tombstones: this.counted.tombstones,
        overdue: Number(row.overdue),
        backends: Number(row.backends),
      });
    } catch (error) {
      // A failover or a terminated backend: the next sample reads again.
      this.errors.push(`registry: ${(error as Error).message}`);
    }
  }
}

/** Clock ticks per second of /proc's CPU times (USER_HZ: 100 on Linux, whatever the kernel's own rate). */
const USER_HZ = 100;

/** utime + stime from a /proc/<pid>/stat line, in seconds. */
export function cpuSecondsOf(stat: string): number {
  const fields = statFields(stat);
  return (Number(fields[11]) + Number(fields[12])) / USER_HZ;
}

/** A process's open descriptors, and how many are sockets. */
async function descriptors(pid: number): Promise<{ total: number; sockets: number }> {
  const entries = await readdir(`/proc/${pid}/fd`);
  const targets = await Promise.all(entries.map((fd) => readlink(`/proc/${pid}/fd/${fd}`).catch(() => "")));
  return { total: entries.length, sockets: targets.filter((target) => target.startsWith("socket:")).length };
}
