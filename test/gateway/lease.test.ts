import { Code } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { CoordinatorError } from "../../src/gateway/errors.js";
import type { Clock as LeaseClock, Timer as LeaseTimer } from "../../src/clock.js";
import { LeaseKeeper } from "../../src/gateway/lease.js";
import { silentLogger, type RenewLeaseInput } from "../../src/gateway/types.js";

/** A clock the test moves by hand: timers fire only when it says so. */
class ManualClock implements LeaseClock {
  private time = 0;
  private timers: Array<{ at: number; callback: () => void; cancelled: boolean }> = [];

  now(): number {
    return this.time;
  }

  setTimer(callback: () => void, delayMs: number): LeaseTimer {
    const timer = { at: this.time + delayMs, callback, cancelled: false };
    this.timers.push(timer);
    return { cancel: () => (timer.cancelled = true) };
  }

  /** How long until each pending timer fires. */
  pending(): number[] {
    return this.timers.filter((t) => !t.cancelled).map((t) => t.at - this.time);
  }

  /** Moves the time to the one pending timer and fires it. */
  fire(): void {
    const due = this.timers.filter((t) => !t.cancelled);
    expect(due, "exactly one pending timer").toHaveLength(1);
    this.timers = [];
    this.time = due[0]!.at;
    due[0]!.callback();
  }
}

/** A coordinator whose RenewLease answers when the test says. */
class ScriptedCoordinator {
  readonly calls: Array<{ input: RenewLeaseInput; answer: (expiresAt: Date) => void; refuse: (error: unknown) => void }> = [];

  renewLease(input: RenewLeaseInput): Promise<Date | undefined> {
    return new Promise((resolve, reject) => this.calls.push({ input, answer: resolve, refuse: reject }));
  }

  /** The renewal in flight (the latest call). */
  get current() {
    expect(this.calls.length, "a renewal was sent").toBeGreaterThan(0);
    return this.calls.at(-1)!;
  }
}

/** Lets the keeper's continuation of an answered renewal run: every pending promise reaction settles before the next turn. */
const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

const ref = { tenant: "acme", operationId: "0190f3a2-0000-7000-8000-000000000001" };

function keeper(options: { leaseMs?: number; expiresAtMs?: number } = {}) {
  const clock = new ManualClock();
  const coordinator = new ScriptedCoordinator();
  const lost: string[] = [];
  const keeper = new LeaseKeeper({
    client: coordinator,
    ref,
    generation: 3,
    leaseMs: options.leaseMs,
    expiresAt: options.expiresAtMs === undefined ? undefined : new Date(options.expiresAtMs),
    onLost: (reason) => lost.push(reason),
    logger: silentLogger,
    clock,
  });
  return { clock, coordinator, lost, keeper };
}

describe("the lease keeper", () => {
  it("renews at half the lease, measured from the granted expiry, asking for the same lease", async () => {
    const { clock, coordinator, keeper: k } = keeper({ leaseMs: 10_000, expiresAtMs: 10_000 });
    k.start();
    expect(clock.pending()).toEqual([5_000]);

    clock.fire();
    expect(coordinator.current.input).toEqual({ ref, generation: 3, leaseMs: 10_000 });
    coordinator.current.answer(new Date(15_000));
    await settle();

    expect(k.renewals).toBe(1);
    expect(k.leaseExpiresAt).toEqual(new Date(15_000));
    expect(clock.pending()).toEqual([5_000]);
    k.stop();
  });

  it("renews sooner when the policy granted less than asked", () => {
    const { clock, keeper: k } = keeper({ leaseMs: 10_000, expiresAtMs: 4_000 });
    k.start();
    expect(clock.pending()).toEqual([2_000]);
    k.stop();
  });

  it("never waits less than 100 ms, however short the lease", () => {
    const { clock, keeper: k } = keeper({ leaseMs: 50, expiresAtMs: 50 });
    k.start();
    expect(clock.pending()).toEqual([100]);
    k.stop();
  });

  it("tries again at a quarter of the lease after a renewal lost in transit, and carries on", async () => {
    const { clock, coordinator, lost, keeper: k } = keeper({ leaseMs: 10_000, expiresAtMs: 10_000 });
    k.start();
    clock.fire();
    coordinator.current.refuse(new CoordinatorError("unreachable", Code.Unavailable, undefined));
    await settle();

    expect(lost).toEqual([]);
    expect(k.renewals).toBe(0);
    // 5 s of the lease are left at 5 s: half of it, halved again.
    expect(clock.pending()).toEqual([1_250]);

    clock.fire();
    coordinator.current.answer(new Date(16_250));
    await settle();
    expect(k.renewals).toBe(1);
    expect(coordinator.calls).toHaveLength(2);
    k.stop();
  });

  it.each(["STALE_GENERATION", "LEASE_EXPIRED", "INVALID_TRANSITION", "NOT_FOUND"])("stops and reports the lease lost when a renewal is refused with %s", async (reason) => {
    const { clock, coordinator, lost, keeper: k } = keeper({ leaseMs: 10_000, expiresAtMs: 10_000 });
    k.start();
    clock.fire();
    coordinator.current.refuse(new CoordinatorError("refused", Code.FailedPrecondition, reason));
    await settle();

    expect(lost).toEqual([reason]);
    expect(clock.pending()).toEqual([]);
    expect(coordinator.calls).toHaveLength(1);
  });

  it("stops renewing on stop(), and ignores an answer that arrives after it", async () => {
    const { clock, coordinator, lost, keeper: k } = keeper({ leaseMs: 10_000, expiresAtMs: 10_000 });
    k.start();
    clock.fire();
    k.stop();
    coordinator.current.answer(new Date(15_000));
    await settle();

    expect(k.renewals).toBe(0);
    expect(clock.pending()).toEqual([]);
    expect(lost).toEqual([]);

    const idle = keeper({ leaseMs: 10_000, expiresAtMs: 10_000 });
    idle.keeper.start();
    idle.keeper.stop();
    expect(idle.clock.pending()).toEqual([]);
  });
});
