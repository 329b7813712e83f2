import { readdir, readFile } from "node:fs/promises";

/**
 * How busy the machine was while the gate ran, and how much of that was the
 * gate itself (its process, the coordinator, the provider, the service and
 * the embedded PostgreSQL, including the processes it killed) versus other
 * work: latency measured on a shared machine means little without it.
 * Linux only (/proc); elsewhere every figure is undefined.
 */
export interface CpuSample {
  at: number;
  /** Busy and total jiffies of the whole host since boot. */
  hostBusy: number;
  hostTotal: number;
  /** Of hostBusy, the jiffies the hypervisor gave to other machines while this one had work (steal). */
  hostStolen: number;
  /** CPU jiffies used by this process and its descendants (dead ones included once reaped). */
  tree: number;
}

export interface CpuUsage {
  seconds: number;
  cores: number;
  /** Share of the host's CPU capacity in use, 0..1. */
  hostBusyShare: number;
  /** Share of the host's CPU capacity used by the gate's process tree. */
  gateShare: number;
  /** Share used by everything else on the machine. */
  otherShare: number;
  /** Share of the capacity the hypervisor took away (counted in hostBusyShare, used by nothing here). */
  stolenShare: number;
}

/**
 * Reads /proc without blocking: the soak samples every few seconds from the
 * process whose clock times the load's answers, and a walk over every
 * process's stat file takes milliseconds.
 */
export async function sampleCpu(): Promise<CpuSample | undefined> {
  try {
    const [host, tree] = await Promise.all([readFile("/proc/stat", "utf8"), treeJiffies(process.pid)]);
    const cpu = host.split("\n")[0]!.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal
    const idle = (cpu[3] ?? 0) + (cpu[4] ?? 0);
    const total = cpu.slice(0, 8).reduce((a, b) => a + b, 0);
    return { at: Date.now(), hostBusy: total - idle, hostTotal: total, hostStolen: cpu[7] ?? 0, tree };
  } catch {
    return undefined;
  }
}

export function cpuUsage(from: CpuSample | undefined, to: CpuSample | undefined, cores: number): CpuUsage | undefined {
  if (!from || !to || to.hostTotal <= from.hostTotal) return undefined;
  const total = to.hostTotal - from.hostTotal;
  const busy = (to.hostBusy - from.hostBusy) / total;
  const gate = Math.min(busy, Math.max(0, (to.tree - from.tree) / total));
  const round = (n: number) => Number(n.toFixed(3));
  const stolen = Math.max(0, (to.hostStolen - from.hostStolen) / total);
  return {
    seconds: (to.at - from.at) / 1000,
    cores,
    hostBusyShare: round(busy),
    gateShare: round(gate),
    otherShare: round(Math.max(0, busy - gate - stolen)),
    stolenShare: round(stolen),
  };
}

/** utime + stime (+ reaped children's) of `root` and every live descendant, in jiffies. */
async function treeJiffies(root: number): Promise<number> {
  const stats = new Map<number, { ppid: number; jiffies: number }>();
  const pids = (await readdir("/proc")).filter((entry) => /^\d+$/.test(entry));
  await Promise.all(
    pids.map(async (entry) => {
      try {
        const fields = statFields(await readFile(`/proc/${entry}/stat`, "utf8"));
        const ppid = Number(fields[1]);
        const jiffies = Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14]);
        stats.set(Number(entry), { ppid, jiffies });
      } catch {
        // gone meanwhile
      }
    }),
  );
  const children = new Map<number, number[]>();
  for (const [pid, s] of stats) {
    const list = children.get(s.ppid);
    if (list) list.push(pid);
    else children.set(s.ppid, [pid]);
  }
  let sum = 0;
  const stack = [root];
  while (stack.length > 0) {
    const pid = stack.pop()!;
    sum += stats.get(pid)?.jiffies ?? 0;
    stack.push(...(children.get(pid) ?? []));
  }
  return sum;
}

/**
 * The fields of a /proc/<pid>/stat line from the third on (state, ppid, …:
 * utime and stime are [11] and [12]). The second, the command in
 * parentheses, may itself hold spaces and parentheses, so they start after
 * the last ')'.
 */
export function statFields(stat: string): string[] {
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
}
