/**
 * The time the coordinator's background work reads and waits on: the policy
 * cache's refreshes, the background jobs' ticks, the readiness probe and the
 * retention sweep's budget. The server runs on `systemClock`; tests give a
 * clock they move by hand (test/support/clock.ts), so that what happens "after
 * an interval" happens when they say so.
 *
 * The gateway SDK's lease keeper reads the same clock, so that one clock
 * drives both in a process that runs both.
 */
export interface Clock {
  /** Milliseconds since the epoch, like `Date.now()`. */
  now(): number;
  /** Calls `callback` once after `delayMs`; a pending call never keeps the process alive on its own. */
  setTimer(callback: () => void, delayMs: number): Timer;
}

/** A pending call of a Clock. */
export interface Timer {
  /** The call will not happen (nothing when it already did). */
  cancel(): void;
}

/** The real clock: `Date.now` and unref'd timers (background work never holds a process open). */
export const systemClock: Clock = {
  now: () => Date.now(),
  setTimer(callback, delayMs) {
    const timer = setTimeout(callback, delayMs);
    timer.unref();
    return { cancel: () => clearTimeout(timer) };
  },
};

/**
 * Calls `callback` every `intervalMs` on `clock` until cancelled, like
 * `setInterval`: each call is scheduled when the one before it is due,
 * whatever the previous call started is still doing.
 */
export function every(clock: Clock, intervalMs: number, callback: () => void): Timer {
  let timer: Timer | undefined;
  let cancelled = false;
  const schedule = () => {
    timer = clock.setTimer(() => {
      if (cancelled) return;
      schedule();
      callback();
    }, intervalMs);
  };
  schedule();
  return {
    cancel() {
      cancelled = true;
      timer?.cancel();
    },
  };
}
