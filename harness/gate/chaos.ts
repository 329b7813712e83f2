import type { Cluster, Member } from "../lib/cluster.js";
import { setTimeout as sleep } from "node:timers/promises";
import { pause } from "../lib/timers.js";

/**
 * The faults of a run: SIGKILLs of the payments service and of coordinator
 * replicas (in turn) at planned points of the load (each followed by a
 * restart on the same port after a short downtime), faults of the registry's
 * database given by the caller (a failover, say), and card-provider
 * misbehaviour paced on the logical requests started.
 */

export type Target = "service" | "coordinator";

/** A fault of the registry's database, run at a share of the planned requests; resolves when the registry serves again. */
export interface RegistryFault {
  name: string;
  at: number;
  run: () => Promise<void>;
}

export interface ChaosEvent {
  target: Target | "registry";
  /** The registry fault's name. */
  fault?: string;
  /** Share of the planned requests sent when the kill happens. */
  at: number;
  /** Filled in when it ran. */
  requestsSent?: number;
  /** Which coordinator replica (index) was killed. */
  replica?: number;
  killedAt?: string;
  /** From the kill until the restarted process was ready again. */
  downMs?: number;
  /** From the restart until it was ready. */
  restartMs?: number;
  error?: string;
}

/** Kills spread evenly over `span` of the run (10 %–85 % by default), coordinator kills spread among the service kills; registry faults at their own points. */
export function planChaos(
  serviceKills: number,
  coordinatorKills: number,
  registryFaults: readonly RegistryFault[] = [],
  span: readonly [number, number] = [0.1, 0.85],
): ChaosEvent[] {
  const total = serviceKills + coordinatorKills;
  // With at least one service kill the step total/(coordinatorKills+1) is >= 1: the slots are distinct.
  const coordinatorSlots = new Set<number>(
    serviceKills === 0 ? Array.from({ length: total }, (_, i) => i) : Array.from({ length: coordinatorKills }, (_, k) => Math.floor(((k + 1) * total) / (coordinatorKills + 1))),
  );
  const kills: ChaosEvent[] = Array.from({ length: total }, (_, i) => ({
    target: coordinatorSlots.has(i) ? "coordinator" : "service",
    at: Number((span[0] + ((span[1] - span[0]) * (i + 1)) / (total + 1)).toFixed(3)),
  }));
  return [...kills, ...registryFaults.map((fault): ChaosEvent => ({ target: "registry", fault: fault.name, at: fault.at }))].sort((a, b) => a.at - b.at);
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
  /** Called right before a coordinator replica is killed (its metrics die with it). */
  beforeCoordinatorKill: (replica: number) => Promise<void>;
  registryFaults?: readonly RegistryFault[];
  /** Replica 0 is never killed. */
  spareFirstReplica?: boolean;
  log: (line: string) => void;
  signal?: AbortSignal;
}): ChaosMonkey {
  const { cluster, plan } = options;
  const unexpectedExits: ChaosMonkey["unexpectedExits"] = [];
  let stopped = false;
  let busy = false;
  const done: Record<Target, number> = { service: 0, coordinator: 0 };

  const execute = async (event: ChaosEvent) => {
    event.requestsSent = options.progress().sent;
    if (event.target === "registry") {
      const fault = options.registryFaults?.find((f) => f.name === event.fault);
      if (!fault) throw new Error(`no registry fault named ${event.fault}`);
      const started = Date.now();
      event.killedAt = new Date(started).toISOString();
      options.log(`chaos: registry ${fault.name} at ${event.requestsSent.toLocaleString("en-US")} requests`);
      await fault.run();
      event.downMs = Date.now() - started;
      options.log(`chaos: registry ${fault.name} done after ${(event.downMs / 1000).toFixed(1)} s`);
      return;
    }
    let member: Member = cluster.service;
    if (event.target === "coordinator") {
      // The replicas take the kills in turn (all but the first when it is spared).
      const first = options.spareFirstReplica ? 1 : 0;
      event.replica = first + (done.coordinator % (cluster.coordinators.length - first));
      member = cluster.coordinators[event.replica]!;
      await options.beforeCoordinatorKill(event.replica);
    }
    const killed = Date.now();
    event.killedAt = new Date(killed).toISOString();
    await member.kill("SIGKILL");
    done[event.target]++;
    const name = event.replica === undefined ? event.target : `coordinator replica ${event.replica}`;
    options.log(`chaos: SIGKILL ${name} at ${event.requestsSent.toLocaleString("en-US")} requests; restarting in ${options.downtimeMs} ms`);
    await sleep(options.downtimeMs);
    const restarting = Date.now();
    try {
      await member.restart();
    } catch (error) {
      event.error = (error as Error).message.slice(0, 500);
      options.log(`chaos: ${name} did not restart: ${event.error}`);
      throw error;
    }
    event.restartMs = Date.now() - restarting;
    event.downMs = Date.now() - killed;
    options.log(`chaos: ${name} is back after ${(event.downMs / 1000).toFixed(1)} s (restart took ${(event.restartMs / 1000).toFixed(1)} s)`);
  };

  /** A process that died on its own is restarted (and reported): the run goes on. */
  const watch = async () => {
    for (const [target, member] of [
      ["service", cluster.service],
      ...cluster.coordinators.map((replica) => ["coordinator", replica] as const),
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
        await pause(100, options.signal);
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
