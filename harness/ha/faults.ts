import { setTimeout as sleep } from "node:timers/promises";
import { formatDuration } from "../lib/format.js";
import type { LocalHaRegistry } from "./engines.js";

/**
 * Faults of the registry's Patroni cluster (deploy/ha/):
 *
 *   switchover          a planned `patronictl switchover`
 *   primary kill        SIGKILL of the primary's postmaster; Patroni promotes the standby
 *   commit in flight    the standby paused so that commits wait for its
 *                       acknowledgement, then the primary killed and the
 *                       standby resumed and promoted: the coordinators' re-runs
 *                       must recognise the records their lost COMMITs left
 *   standby pause       the synchronous standby hangs for a few seconds
 *                       (SIGSTOP): commits wait for it, nothing fails over
 */
export const HA_FAULTS = ["switchover", "primary kill", "commit in flight", "standby pause"] as const;
export type HaFault = (typeof HA_FAULTS)[number];

/** How long "standby pause" holds the standby. */
const STANDBY_PAUSE_MS = 3_000;

/** Runs one fault and waits until the cluster is whole again (a primary and its synchronous standby); resolves with when it started and ended. */
export async function runHaFault(ha: LocalHaRegistry, kind: HaFault, log: (line: string) => void): Promise<{ from: number; to: number }> {
  const from = Date.now();
  const primary = await ha.primary();
  const standby = ha.nodes.find((node) => node !== primary)!;
  if (kind === "standby pause") {
    await standby.pause();
    await sleep(STANDBY_PAUSE_MS);
    await standby.resume();
    log(`ha: ${kind}: ${standby.name} held for ${formatDuration(STANDBY_PAUSE_MS)}; waiting for it to be the synchronous standby again`);
    await ha.healthy();
    return { from, to: Date.now() };
  }
  if (kind === "switchover") {
    await ha.switchover();
  } else if (kind === "primary kill") {
    await primary.killPostgres();
  } else {
    await standby.pause();
    // Commits reach the primary's WAL and wait for the paused standby's acknowledgement.
    await sleep(500);
    await primary.killPostgres();
    await standby.resume();
  }
  const promoted = await ha.primary({ other: primary });
  log(`ha: ${kind}: ${primary.name} → ${promoted.name} after ${formatDuration(Date.now() - from)}; waiting for ${primary.name} to follow as the synchronous standby`);
  await ha.healthy();
  return { from, to: Date.now() };
}
