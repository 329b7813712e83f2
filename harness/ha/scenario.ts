/**
 * The failover scenario (`npm run ha`, docs/scaling.md): a registry on a
 * two-node Patroni cluster (a primary and a synchronous standby, etcd,
 * HAProxy in front), three coordinator replicas, and the launch gate's load
 * through the payments example, while the registry's primary is taken away
 * again and again:
 *
 *   switchover          a planned `patronictl switchover`
 *   primary kill        SIGKILL of the primary's postmaster; Patroni promotes the standby
 *   commit in flight    the standby paused so that commits wait for its
 *                       acknowledgement, then the primary killed and the
 *                       standby resumed and promoted: the coordinators' re-runs
 *                       must recognise the records their lost COMMITs left
 *
 * Each fault waits until the old primary is back as the synchronous standby.
 * The gate's table gets the lines of this scenario: acknowledged writes of
 * a probe lost, and the write pause of each kind of fault (the longest time
 * without an acknowledged write, P50 and P99 over the rounds). The gate's
 * latency line is reported, not judged: under failovers it measures them.
 * Exit code 0 when every line passes, 1 when one fails, 2 on bad usage.
 */
import { runGate, type GateInput } from "../gate/gate.js";
import type { RegistryFault } from "../gate/chaos.js";
import type { Criterion } from "../lib/criterion.js";
import { formatDuration } from "../lib/format.js";
import { percentile } from "../lib/histogram.js";
import type { CommonOptions, RegistryRun } from "./on-registry.js";
import type { LocalHaRegistry } from "./engines.js";
import { runHaFault, type HaFault } from "./faults.js";
import { WriteProbe } from "./probe.js";

const FAULTS = ["switchover", "primary kill", "commit in flight"] as const satisfies readonly HaFault[];
export type FaultKind = (typeof FAULTS)[number];

/** The title of this scenario's table and reports (report.json, report.html), which are not the launch gate's. */
export const FAILOVER_TITLE = "Failover scenario on Patroni";

/** A write pause longer than Patroni's ttl (deploy/ha/patroni.yml) means a failover took longer than the configuration promises. */
const PAUSE_LIMIT_MS = 15_000;

export interface HaOptions extends CommonOptions {
  rounds: number;
  requests: number | undefined;
}

/** The faults of every round, spread over 15 %–80 % of the load, each kind once per round. */
function planFaults(ha: LocalHaRegistry, rounds: number, windows: Map<RegistryFault, { kind: FaultKind; from: number; to: number }>, log: (line: string) => void): RegistryFault[] {
  const total = rounds * FAULTS.length;
  const faults: RegistryFault[] = [];
  for (let i = 0; i < total; i++) {
    const kind = FAULTS[i % FAULTS.length]!;
    const fault: RegistryFault = {
      name: `${kind} ${Math.floor(i / FAULTS.length) + 1}`,
      at: Number((0.15 + (0.65 * i) / Math.max(1, total - 1)).toFixed(3)),
      run: async () => {
        // The pause is looked for from the fault until the cluster is whole again.
        windows.set(fault, { kind, ...(await runHaFault(ha, kind, log)) });
      },
    };
    faults.push(fault);
  }
  return faults;
}

/** What the scenario asks of the gate's machinery: its load, faults and lines, under its own title. */
export function failoverGateInput(
  options: HaOptions,
  run: { databaseUrl: string; faults: RegistryFault[]; moreCriteria: () => Promise<Criterion[]>; signal: AbortSignal },
): GateInput {
  return {
    title: FAILOVER_TITLE,
    quick: options.quick,
    databaseUrl: run.databaseUrl,
    replicas: options.replicas,
    registryFaults: run.faults,
    judgeReserveLatency: false,
    moreCriteria: run.moreCriteria,
    // The load must outlast every fault: each one waits for the old primary to rejoin.
    requests: options.requests ?? (options.quick ? 3_000 : 4_000) * options.rounds,
    outDir: options.outDir,
    verbose: options.verbose,
    signal: run.signal,
  };
}

/** The scenario on a started registry: resolves with whether every line passed. */
export async function runFailoverScenario(options: HaOptions, { ha, log, signal }: RegistryRun): Promise<boolean> {
  const probe = new WriteProbe(ha.url);
  try {
    await probe.start();
    const windows = new Map<RegistryFault, { kind: FaultKind; from: number; to: number }>();
    const faults = planFaults(ha, options.rounds, windows, log);
    const moreCriteria = async (): Promise<Criterion[]> => {
      await probe.stop();
      const lost = await probe.lost();
      return [
        judgeProbeWrites({ lost, acknowledged: probe.acknowledged.length, failedWrites: probe.failures }),
        ...FAULTS.map((kind) =>
          judgeWritePause(
            kind,
            [...windows.values()].filter((w) => w.kind === kind).map((w) => probe.pauseMs(w.from, w.to)),
            options.rounds,
          ),
        ),
      ];
    };
    const result = await runGate(failoverGateInput(options, { databaseUrl: ha.url, faults, moreCriteria, signal }));
    process.stdout.write(`\n${result.table}`);
    process.stderr.write(`report: ${result.files.json}\n        ${result.files.html}\n`);
    return result.passed;
  } finally {
    await probe.stop().catch(() => undefined);
  }
}

/** Every write the probe was told was committed is still there after the failovers. */
export function judgeProbeWrites(probe: { lost: readonly number[]; acknowledged: number; failedWrites: number }): Criterion {
  return {
    id: "probe-writes-lost",
    name: "acknowledged probe writes lost",
    value: probe.lost.length,
    measured: `${probe.lost.length} of ${probe.acknowledged}`,
    threshold: "= 0",
    pass: probe.lost.length === 0 && probe.acknowledged > 0,
    source: "supplementary",
    detail: { lost: probe.lost.slice(0, 20), acknowledged: probe.acknowledged, failedWrites: probe.failedWrites },
  };
}

/** The longest time without an acknowledged write around each fault of one kind, every round's within Patroni's ttl. */
export function judgeWritePause(kind: FaultKind, pausesMs: readonly number[], rounds: number): Criterion {
  const pauses = [...pausesMs].sort((a, b) => a - b);
  const worst = pauses.at(-1) ?? Number.NaN;
  return {
    id: `pause-${kind.replaceAll(" ", "-")}`,
    name: `write pause, ${kind} (${pauses.length} of ${rounds} run)`,
    value: worst,
    measured: pauses.length ? `P50 ${formatDuration(percentile(pauses, 0.5))}, P99 ${formatDuration(percentile(pauses, 0.99))}` : "n/a (did not run)",
    threshold: `<= ${formatDuration(PAUSE_LIMIT_MS)}`,
    pass: pauses.length === rounds && worst <= PAUSE_LIMIT_MS,
    source: "supplementary",
    detail: { pausesMs: pauses },
  };
}
