import { refuse } from "../contract/errors.js";
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
 *
 * Waiting costs the registry: every waiter rechecks, and every wake-up is a
 * decision. So a caller has at most a bounded number of Reserves waiting
 * here at once (one more is refused), waiters on one record share each
 * recheck, and a wait ends within what it asked for even when the registry
 * is slow to answer a recheck.
 */

/** The longest wait a Reserve may ask for. */
export const MAX_WAIT_FOR_OWNER_MS = 30_000;

const FIRST_RECHECK_MS = 25;
const LAST_RECHECK_MS = 500;

/** Waiters of this coordinator, by the record they wait on. */
export class RecordWatch {
  private readonly waiters = new Map<string, Set<(changed?: boolean) => void>>();
  /** Reserves waiting now, by caller. */
  private readonly waitingBy = new Map<string, number>();
  /** Rechecks in flight, by the record as its waiters read it: one query for all of them. */
  private readonly rechecks = new Map<string, Promise<boolean>>();

  /** Reserves admitted to wait and not done yet, of every caller. */
  private waiting = 0;

  /**
   * `waitersPerCaller`: most Reserves of one caller waiting at once
   * (IDEM_WAITERS_PER_CALLER); `counted` hears how many wait in all after
   * each change (the idem_reserves_waiting gauge).
   */
  constructor(
    private readonly waitersPerCaller = Number.POSITIVE_INFINITY,
    private readonly counted: (waiting: number) => void = () => undefined,
  ) {}

  /**
   * Lets one more Reserve of `caller` wait, or refuses it (TOO_MANY_WAITERS)
   * when the caller already has its bound waiting. Returns what ends its wait.
   */
  admit(caller: string): () => void {
    const waiting = this.waitingBy.get(caller) ?? 0;
    if (waiting >= this.waitersPerCaller) {
      refuse(
        "TOO_MANY_WAITERS",
        `this caller already has ${waiting} Reserves waiting for an owner on this coordinator (IDEM_WAITERS_PER_CALLER): ` +
          "retry after the owner's Retry-After, or without wait_for_owner",
        { limit: String(this.waitersPerCaller) },
      );
    }
    this.waitingBy.set(caller, waiting + 1);
    this.counted(++this.waiting);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const left = (this.waitingBy.get(caller) ?? 1) - 1;
      if (left === 0) this.waitingBy.delete(caller);
      else this.waitingBy.set(caller, left);
      this.counted(--this.waiting);
    };
  }

  /**
   * Whether the record has moved on from what a waiter read (`moved`), asked
   * once for every waiter that read it the same way at the same time.
   */
  recheck(record: StoredRecord, moved: (record: StoredRecord) => Promise<boolean>): Promise<boolean> {
    const key = `${watchKey(record.tenant, record.operationId)}\u0000${record.state}\u0000${record.generation}`;
    let pending = this.rechecks.get(key);
    if (!pending) {
      pending = moved(record).finally(() => this.rechecks.delete(key));
      this.rechecks.set(key, pending);
    }
    return pending;
  }

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

  /** Reserves of `caller` admitted to wait and not done yet. */
  waitingOf(caller: string): number {
    return this.waitingBy.get(caller) ?? 0;
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
 * (`moved`, shared by the record's waiters), `decide` runs the whole Reserve
 * again. Returns the last decision (IN_PROGRESS when the owner is still at
 * it) by the end of the budget: a recheck still unanswered then is not waited
 * for (it only reads), and no decision starts after it. `caller` counts
 * against its bound of waiters (RecordWatch.admit) for the whole wait.
 */
export async function waitForOwner(
  first: ReserveResult,
  options: {
    tenant: string;
    caller: string;
    budgetMs: number;
    watch: RecordWatch;
    signal: AbortSignal;
    decide: () => Promise<ReserveResult>;
    moved: (record: StoredRecord) => Promise<boolean>;
  },
): Promise<ReserveResult> {
  const { tenant, watch, signal, decide, moved } = options;
  if (first.decision !== "IN_PROGRESS" || !first.record || options.budgetMs <= 0) return first;
  const end = performance.now() + options.budgetMs;
  const release = watch.admit(options.caller);
  try {
    let result = first;
    let recheckMs = FIRST_RECHECK_MS;
    while (result.decision === "IN_PROGRESS" && result.record && !signal.aborted) {
      const left = end - performance.now();
      if (left <= 0) break;
      const woken = await watch.next(tenant, result.record.operationId, Math.min(recheckMs, left), signal);
      if (signal.aborted) break;
      recheckMs = Math.min(recheckMs * 2, LAST_RECHECK_MS);
      const changed = woken || (await beforeEnd(watch.recheck(result.record, moved), end));
      if (changed && performance.now() < end) result = await decide();
    }
    return result;
  } finally {
    release();
  }
}

/** What `work` answers, or false when `end` (performance.now() time) comes first. */
async function beforeEnd(work: Promise<boolean>, end: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), Math.max(0, end - performance.now()))));
  try {
    return await Promise.race([work, late]);
  } finally {
    clearTimeout(timer);
  }
}
