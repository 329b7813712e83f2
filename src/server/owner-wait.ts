import type { ReserveResult } from "../registry/types.js";

/**
 * Reserve's wait for an owner in flight (`wait_for_owner`): a duplicate of a
 * request still running waits for the record to change and is decided again,
 * so that it is answered with the first request's REPLAY instead of
 * IN_PROGRESS and a retry later. A storm of concurrent duplicates becomes one
 * answer each.
 *
 * Two wake-ups, because the owner may finish on any coordinator: the
 * coordinator that commits a record's change wakes its own waiters at once
 * (RecordWatch.changed), and every waiter also decides again on a timer that
 * backs off from 25 ms to 500 ms, which is how a change committed by another
 * replica (or a lease that just ran out) is seen. Waking is only a hint: each
 * wake-up is followed by a full decision, exactly as a client's retry, so a
 * wake-up that comes early, late or never changes no answer, only its time.
 */

/** The longest wait a Reserve may ask for. */
export const MAX_WAIT_FOR_OWNER_MS = 30_000;

const FIRST_RECHECK_MS = 25;
const LAST_RECHECK_MS = 500;

/** Waiters of this coordinator, by the record they wait on. */
export class RecordWatch {
  private readonly waiters = new Map<string, Set<() => void>>();

  /** A record's change has just committed here: every Reserve waiting on it decides again now. */
  changed(tenant: string, operationId: string): void {
    const waiting = this.waiters.get(watchKey(tenant, operationId));
    if (!waiting) return;
    for (const wake of [...waiting]) wake();
  }

  /** Resolves when the record is said to have changed, after `ms`, or when `signal` aborts, whichever comes first. */
  next(tenant: string, operationId: string, ms: number, signal: AbortSignal): Promise<void> {
    const key = watchKey(tenant, operationId);
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", wake);
        const waiting = this.waiters.get(key);
        waiting?.delete(wake);
        if (waiting?.size === 0) this.waiters.delete(key);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      signal.addEventListener("abort", wake, { once: true });
      let waiting = this.waiters.get(key);
      if (!waiting) this.waiters.set(key, (waiting = new Set()));
      waiting.add(wake);
    });
  }

  /** Reserves waiting now (tests: nothing is left behind). */
  get size(): number {
    let count = 0;
    for (const waiting of this.waiters.values()) count += waiting.size;
    return count;
  }
}

function watchKey(tenant: string, operationId: string): string {
  return `${tenant}\u0000${operationId}`;
}

/**
 * How long a Reserve waits: what it asked for, at most MAX_WAIT_FOR_OWNER_MS,
 * and short enough to answer before its deadline (a fifth of the time left,
 * at most a second, is kept for the last decision and the reply).
 */
export function waitBudgetMs(requestedMs: number | undefined, deadlineInMs: number | undefined): number {
  if (!requestedMs) return 0;
  let budget = Math.min(requestedMs, MAX_WAIT_FOR_OWNER_MS);
  if (deadlineInMs !== undefined) budget = Math.min(budget, deadlineInMs - Math.min(1000, deadlineInMs / 5));
  return Math.max(0, budget);
}

/**
 * Decides again while the answer is IN_PROGRESS and the budget lasts: after
 * each wake-up or recheck, `decide` runs the whole Reserve again. Returns the
 * last decision (IN_PROGRESS when the owner is still at it).
 */
export async function waitForOwner(
  first: ReserveResult,
  options: { tenant: string; budgetMs: number; watch: RecordWatch; signal: AbortSignal; decide: () => Promise<ReserveResult> },
): Promise<ReserveResult> {
  const { tenant, watch, signal, decide } = options;
  const end = performance.now() + options.budgetMs;
  let result = first;
  let recheckMs = FIRST_RECHECK_MS;
  while (result.decision === "IN_PROGRESS" && result.record && !signal.aborted) {
    const left = end - performance.now();
    if (left <= 0) break;
    await watch.next(tenant, result.record.operationId, Math.min(recheckMs, left), signal);
    if (signal.aborted) break;
    recheckMs = Math.min(recheckMs * 2, LAST_RECHECK_MS);
    result = await decide();
  }
  return result;
}
