import type { ReserveResult, StoredRecord } from "../registry/types.js";

/**
 * Reserve's wait for an owner in flight (`wait_for_owner`): a duplicate of a
 * request still running waits for the record to change and is decided again,
 * so that it is answered with the first request's REPLAY instead of
 * IN_PROGRESS and a retry later. A storm of concurrent duplicates becomes one
 * answer each.
 *
 * Two wake-ups, because the owner may finish on any coordinator: the
 * coordinator that commits a record's change wakes its own waiters at once
 * (RecordWatch.changed), and every waiter also rechecks on a timer that
 * backs off from 25 ms to 500 ms, which is how a change committed by another
 * replica (or a lease that just ran out) is seen. A recheck reads the record
 * without its lock and decides again only when it has moved on, so that
 * waiters on other replicas never make the owner's writes wait for their
 * locks. Waking is only a hint: each wake-up that finds a change is followed
 * by a full decision, exactly as a client's retry, so a wake-up that comes
 * early, late or never changes no answer, only its time.
 */

/** The longest wait a Reserve may ask for. */
export const MAX_WAIT_FOR_OWNER_MS = 30_000;

const FIRST_RECHECK_MS = 25;
const LAST_RECHECK_MS = 500;

/** Waiters of this coordinator, by the record they wait on. */
export class RecordWatch {
  private readonly waiters = new Map<string, Set<(changed?: boolean) => void>>();

  /** A record's change has just committed here: every Reserve waiting on it decides again now. */
  changed(tenant: string, operationId: string): void {
    const waiting = this.waiters.get(watchKey(tenant, operationId));
    if (!waiting) return;
    for (const wake of [...waiting]) wake(true);
  }

  /**
   * Resolves when the record is said to have changed (true), after `ms` or
   * when `signal` aborts (false), whichever comes first.
   */
  next(tenant: string, operationId: string, ms: number, signal: AbortSignal): Promise<boolean> {
    const key = watchKey(tenant, operationId);
    return new Promise((resolve) => {
      const wake = (changed = false) => {
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        const waiting = this.waiters.get(key);
        waiting?.delete(wake);
        if (waiting?.size === 0) this.waiters.delete(key);
        resolve(changed);
      };
      const onAbort = () => wake(false);
      const timer = setTimeout(onAbort, ms);
      signal.addEventListener("abort", onAbort, { once: true });
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
 * each wake-up, and after each recheck that finds the record moved on
 * (`moved`), `decide` runs the whole Reserve again. Returns the last decision
 * (IN_PROGRESS when the owner is still at it).
 */
export async function waitForOwner(
  first: ReserveResult,
  options: {
    tenant: string;
    budgetMs: number;
    watch: RecordWatch;
    signal: AbortSignal;
    decide: () => Promise<ReserveResult>;
    moved: (record: StoredRecord) => Promise<boolean>;
  },
): Promise<ReserveResult> {
  const { tenant, watch, signal, decide, moved } = options;
  const end = performance.now() + options.budgetMs;
  let result = first;
  let recheckMs = FIRST_RECHECK_MS;
  while (result.decision === "IN_PROGRESS" && result.record && !signal.aborted) {
    const left = end - performance.now();
    if (left <= 0) break;
    const woken = await watch.next(tenant, result.record.operationId, Math.min(recheckMs, left), signal);
    if (signal.aborted) break;
    recheckMs = Math.min(recheckMs * 2, LAST_RECHECK_MS);
    if (woken || (await moved(result.record))) result = await decide();
  }
  return result;
}
