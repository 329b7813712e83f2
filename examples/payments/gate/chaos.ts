import type { Cluster, Member } from "../cluster.js";
import { sleep } from "./util.js";

/**
 * The faults of a run: SIGKILLs of the payments service and of the
 * coordinator at planned points of the load (each followed by a restart on
 * the same port after a short downtime), and card-provider misbehaviour
 * paced on the logical requests started.
 */

export type Target = "service" | "coordinator";

export interface ChaosEvent {
  target: Target;
  /** Share of the planned requests sent when the kill happens. */
  at: number;
  /** Filled in when it ran. */
  requestsSent?: number;
  killedAt?: string;
  /** From the kill until the restarted process was ready again. */
  downMs?: number;
  /** From the restart until it was ready. */
  restartMs?: number;
  error?: string;
}

/** Kills spread evenly over 10 %–85 % of the run, coordinator kills spread among the service kills. */
export function planChaos(serviceKills: number, coordinatorKills: number): ChaosEvent[] {
  const total = serviceKills + coordinatorKills;
  // With at least one service kill the step total/(coordinatorKills+1) is >= 1: the slots are distinct.
  const coordinatorSlots = new Set<number>(
    serviceKills === 0 ? Array.from({ length: total }, (_, i) => i) : Array.from({ length: coordinatorKills }, (_, k) => Math.floor(((k + 1) * total) / (coordinatorKills + 1))),
  );
  return Array.from({ length: total }, (_, i) => ({
    target: coordinatorSlots.has(i) ? "coordinator" : "service",
    at: Number((0.1 + (0.75 * (i + 1)) / (total + 1)).toFixed(3)),
  }));
}

export interface ChaosMonkey {
  events: ChaosEvent[];
  /** Processes that died without being killed by the gate (restarted). */
  unexpectedExits: Array<{ target: Target | "provider"; at: string }>;
  killsDone(target: Target): number;
  /** Runs the plan against the load's progress until `stop` is called or the plan is done. */
  run(): Promise<void>;
  stop(): void;
}

export function chaosMonkey(options: {
  cluster: Cluster;
  plan: ChaosEvent[];
  downtimeMs: number;
  /** Requests sent so far and planned in all. */
  progress: () => { sent: number; planned: number };
  /** Called right before the coordinator is killed (its metrics die with it). */
  beforeCoordinatorKill: () => Promise<void>;
  log: (line: string) => void;
  signal?: AbortSignal;
}): ChaosMonkey {
  const { cluster, plan } = options;
  const unexpectedExits: ChaosMonkey["unexpectedExits"] = [];
  let stopped = false;
  let busy = false;
  const done: Record<Target, number> = { service: 0, coordinator: 0 };

  const memberOf = (target: Target): Member => (target === "service" ? cluster.service : cluster.coordinator);

  const execute = async (event: ChaosEvent) => {
    const member = memberOf(event.target);
    event.requestsSent = options.progress().sent;
    if (event.target === "coordinator") await options.beforeCoordinatorKill();
    const killed = Date.now();
    event.killedAt = new Date(killed).toISOString();
    await member.kill("SIGKILL");
    done[event.target]++;
    options.log(`chaos: SIGKILL ${event.target} at ${event.requestsSent.toLocaleString("en-US")} requests; restarting in ${options.downtimeMs} ms`);
    await sleep(options.downtimeMs);
    const restarting = Date.now();
    try {
      await member.restart();
    } catch (error) {
      event.error = (error as Error).message.slice(0, 500);
      options.log(`chaos: ${event.target} did not restart: ${event.error}`);
      throw error;
    }
    event.restartMs = Date.now() - restarting;
    event.downMs = Date.now() - killed;
    options.log(`chaos: ${event.target} is back after ${(event.downMs / 1000).toFixed(1)} s (restart took ${(event.restartMs / 1000).toFixed(1)} s)`);
  };

  /** A process that died on its own is restarted (and reported): the run goes on. */
  const watch = async () => {
    for (const [target, member] of [
      ["service", cluster.service],
      ["coordinator", cluster.coordinator],
      ["provider", cluster.provider],
    ] as const) {
      if (!busy && !member.alive()) {
        unexpectedExits.push({ target, at: new Date().toISOString() });
        options.log(`chaos: ${target} exited on its own; restarting it. Its last output:\n${member.output().slice(-1500)}`);
        await member.restart();
      }
    }
  };

  return {
    events: plan,
    unexpectedExits,
    killsDone: (target) => done[target],
    stop: () => {
      stopped = true;
    },
    async run() {
      let next = 0;
      while (!stopped && !options.signal?.aborted) {
        const event = plan[next];
        const { sent, planned } = options.progress();
        if (event && sent >= event.at * planned) {
          busy = true;
          try {
            await execute(event);
          } finally {
            busy = false;
          }
          next++;
          continue;
        }
        await watch();
        await sleep(100, options.signal);
      }
    },
  };
}

/**
 * Card-provider faults paced on the logical requests started: every `every`
 * keys, the next charges are declined, or charged and never answered (the
 * service times out: UNKNOWN), or cut off without a charge (UNKNOWN, then
 * recovered by charging with the original key).
 */
export function providerFaults(options: { cluster: Cluster; declineShare: number; ambiguousShare: number; every?: number; log: (line: string) => void }) {
  const every = options.every ?? 50;
  let declineDebt = 0;
  let ambiguousDebt = 0;
  let lastAt = 0;
  let flip = false;
  const injected = { decline: 0, timeoutAfterCharge: 0, failAmbiguously: 0 };
  let pending: Promise<void> = Promise.resolve();
  return {
    injected,
    onKeyStarted(keys: number) {
      if (keys - lastAt < every) return;
      declineDebt += (keys - lastAt) * options.declineShare;
      ambiguousDebt += (keys - lastAt) * options.ambiguousShare;
      lastAt = keys;
      const decline = Math.floor(declineDebt);
      const ambiguous = Math.floor(ambiguousDebt);
      declineDebt -= decline;
      ambiguousDebt -= ambiguous;
      if (decline === 0 && ambiguous === 0) return;
      flip = !flip;
      const timeoutAfterCharge = flip ? Math.ceil(ambiguous / 2) : Math.floor(ambiguous / 2);
      const failAmbiguously = ambiguous - timeoutAfterCharge;
      injected.decline += decline;
      injected.timeoutAfterCharge += timeoutAfterCharge;
      injected.failAmbiguously += failAmbiguously;
      pending = pending
        .then(() => options.cluster.setProviderFaults({ decline, timeoutAfterCharge, failAmbiguously, ambiguousCharges: false }))
        .catch((error: unknown) => options.log(`provider faults not set: ${(error as Error).message}`));
    },
    settled: () => pending,
  };
}
