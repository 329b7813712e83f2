import { describe, expect, it } from "vitest";
import { MAX_WAIT_FOR_OWNER_MS, RecordWatch, waitBudgetMs } from "../../src/server/owner-wait.js";

describe("RecordWatch", () => {
  it("wakes the waiters of the record that changed, and only them", async () => {
    const watch = new RecordWatch();
    const never = new AbortController().signal;
    let woken = "";
    const a = watch.next("acme", "op-1", 60_000, never).then(() => (woken += "a"));
    const b = watch.next("acme", "op-1", 60_000, never).then(() => (woken += "b"));
    const other = watch.next("globex", "op-1", 60_000, new AbortController().signal);
    expect(watch.size).toBe(3);
    watch.changed("acme", "op-1");
    await Promise.all([a, b]);
    expect(woken).toHaveLength(2);
    expect(watch.size).toBe(1);
    watch.changed("globex", "op-1");
    await other;
    expect(watch.size).toBe(0);
  });

  it("lets go of a waiter after its time or its signal, leaving nothing behind", async () => {
    const watch = new RecordWatch();
    await watch.next("acme", "op-2", 5, new AbortController().signal);
    const aborting = new AbortController();
    const waiting = watch.next("acme", "op-3", 60_000, aborting.signal);
    expect(watch.size).toBe(1);
    aborting.abort();
    await waiting;
    expect(watch.size).toBe(0);
    watch.changed("acme", "op-3");
  });
});

describe("waitBudgetMs", () => {
  it("is what was asked, within the cap and before the deadline", () => {
    expect(waitBudgetMs(undefined, 10_000)).toBe(0);
    expect(waitBudgetMs(0, 10_000)).toBe(0);
    expect(waitBudgetMs(500, undefined)).toBe(500);
    expect(waitBudgetMs(10 * MAX_WAIT_FOR_OWNER_MS, undefined)).toBe(MAX_WAIT_FOR_OWNER_MS);
    // A fifth of the time left, at most a second, is kept for the answer.
    expect(waitBudgetMs(5000, 2000)).toBe(1600);
    expect(waitBudgetMs(60_000, 20_000)).toBe(19_000);
    expect(waitBudgetMs(5000, 0)).toBe(0);
  });
});
