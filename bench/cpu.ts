/**
 * Where the machine's CPU goes during a phase (Linux /proc): the coordinator
 * process with its children (its workers, under IDEM_WORKERS), the service process (the service level), PostgreSQL (the postmaster, its live backends, and the backends
 * that ended, through the postmaster's children times), and the benchmark's
 * own process with its ended children (the load generator, or pgbench).
 * Reported as cores busy on average over the phase: on a 2-core machine,
 * a sum near 2 means the phase was CPU-bound.
 */
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { statFields } from "../harness/lib/machine.js";

let ticksPerSecond: number | undefined;
function clockTicks(): number {
  if (ticksPerSecond === undefined) {
    try {
      ticksPerSecond = Number(execFileSync("getconf", ["CLK_TCK"]).toString().trim()) || 100;
    } catch {
      ticksPerSecond = 100;
    }
  }
  return ticksPerSecond;
}

interface Stat {
  state: string;
  ppid: number;
  /** Own user + system time, ms. */
  own: number;
  /** Ended and reaped children's user + system time, ms. */
  children: number;
}

function stat(pid: number | "self"): Stat | undefined {
  try {
    const fields = statFields(readFileSync(`/proc/${pid}/stat`, "utf8"));
    const ms = (i: number) => (Number(fields[i]) * 1000) / clockTicks();
    // After the name: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14).
    return { state: fields[0]!, ppid: Number(fields[1]), own: ms(11) + ms(12), children: ms(13) + ms(14) };
  } catch {
    return undefined;
  }
}

function childrenOf(parent: number): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    if (stat(Number(entry))?.ppid === parent) pids.push(Number(entry));
  }
  return pids;
}

/** A process's time with its children's, live and ended (the coordinator's workers under IDEM_WORKERS). */
function processTreeTime(pid: number): number | undefined {
  const root = stat(pid);
  if (!root) return undefined;
  let total = root.own + root.children;
  for (const child of childrenOf(pid)) total += stat(child)?.own ?? 0;
  return total;
}

export interface CpuSnapshot {
  at: number;
  coordinator?: number;
  service?: number;
  postgres?: number;
  /** Ended backends the postmaster has not reaped yet (their time is not counted yet). */
  postgresZombies?: number;
  client: number;
}

export interface CpuUse {
  /** Average cores busy over the phase; undefined when not measurable (in-process coordinator, external database). */
  coordinator?: number;
  /** The Express service's process, at the service level. */
  service?: number;
  postgres?: number;
  /** The benchmark's process and its ended children: the load generator, or pgbench. */
  client: number;
}

export class CpuMeter {
  readonly available = process.platform === "linux" && stat("self") !== undefined;

  constructor(
    /** The coordinator's process, when it runs in one of its own. */
    private readonly coordinatorPid: number | undefined,
    /** The postmaster of the embedded PostgreSQL. */
    private readonly postmasterPid: number | undefined,
    /** The service's process, at the service level. */
    private readonly servicePid?: number,
  ) {}

  snapshot(): CpuSnapshot | undefined {
    if (!this.available) return undefined;
    const self = stat("self")!;
    const coordinator = this.coordinatorPid !== undefined ? processTreeTime(this.coordinatorPid) : undefined;
    const service = this.servicePid !== undefined ? stat(this.servicePid)?.own : undefined;
    let postgres: number | undefined;
    let postgresZombies: number | undefined;
    // Read again when the postmaster reaped a backend while its children were being read.
    for (let attempt = 0; this.postmasterPid !== undefined && attempt < 5; attempt++) {
      const postmaster = stat(this.postmasterPid);
      if (!postmaster) break;
      postgres = postmaster.own + postmaster.children;
      postgresZombies = 0;
      for (const pid of childrenOf(this.postmasterPid)) {
        const child = stat(pid);
        if (!child) continue;
        postgres += child.own;
        // An ended backend not yet reaped shows no times: they reach the postmaster's account when it reaps it.
        if (child.state === "Z") postgresZombies++;
      }
      if (stat(this.postmasterPid)?.children === postmaster.children) break;
    }
    return {
      at: performance.now(),
      client: self.own + self.children,
      ...(coordinator !== undefined ? { coordinator } : {}),
      ...(service !== undefined ? { service } : {}),
      ...(postgres !== undefined ? { postgres, postgresZombies } : {}),
    };
  }

  /**
   * The snapshot at the end of a phase that ended at `endedAt`: once the
   * backends of clients that disconnected (pgbench) have ended and been
   * reaped, so that their time is in the postmaster's account (at most 1 s).
   */
  async settledSnapshot(endedAt: number): Promise<CpuSnapshot | undefined> {
    for (let waited = 0; ; waited += 25) {
      const now = this.snapshot();
      if (!now || !now.postgresZombies || waited >= 1000) return now ? { ...now, at: endedAt } : undefined;
      await sleep(25);
    }
  }

  static between(before: CpuSnapshot | undefined, after: CpuSnapshot | undefined): CpuUse | undefined {
    if (!before || !after || after.at <= before.at) return undefined;
    const wall = after.at - before.at;
    const cores = (a: number | undefined, b: number | undefined) => (a !== undefined && b !== undefined ? (b - a) / wall : undefined);
    const coordinator = cores(before.coordinator, after.coordinator);
    const postgres = cores(before.postgres, after.postgres);
    const service = cores(before.service, after.service);
    return {
      client: cores(before.client, after.client)!,
      ...(coordinator !== undefined ? { coordinator } : {}),
      ...(service !== undefined ? { service } : {}),
      ...(postgres !== undefined ? { postgres } : {}),
    };
  }
}
