import type { Clock, Timer } from "../../src/clock.js";

/**
 * A clock the test moves by hand: `now()` stands still and timers fire only
 * inside `advance`, each at its own time and in order, so that "after the
 * interval" is a step the test takes instead of a wait.
 */
export class ManualClock implements Clock {
  private time: number;
  private sequence = 0;
  private readonly timers = new Map<number, { at: number; callback: () => void }>();

  /** Starts at `start` milliseconds since the epoch (any fixed instant will do). */
  constructor(start = Date.UTC(2026, 0, 1)) {
    this.time = start;
  }

  now(): number {
    return this.time;
  }

  setTimer(callback: () => void, delayMs: number): Timer {
    const id = this.sequence++;
    this.timers.set(id, { at: this.time + Math.max(0, delayMs), callback });
    return { cancel: () => void this.timers.delete(id) };
  }

  /**
   * Moves time forward by `ms`, calling every timer that falls due on the way
   * synchronously, at its due time: a timer set by a callback fires too when
   * it falls due within the step.
   */
  advance(ms: number): void {
    const until = this.time + ms;
    for (;;) {
      const next = this.soonest();
      if (!next || next.at > until) break;
      this.timers.delete(next.id);
      this.time = next.at;
      next.callback();
    }
    this.time = until;
  }

  /** Delays from now of the pending timers, soonest first. */
  pending(): number[] {
    return [...this.timers.values()].map((t) => t.at - this.time).sort((a, b) => a - b);
  }

  private soonest(): { id: number; at: number; callback: () => void } | undefined {
    let soonest: { id: number; at: number; callback: () => void } | undefined;
    // Equal due times fire in the order they were set (Map iterates in insertion order).
    for (const [id, timer] of this.timers) if (!soonest || timer.at < soonest.at) soonest = { id, ...timer };
    return soonest;
  }
}
