import { describe, expect, it } from "vitest";
import { IdempotencyError } from "../../src/contract/errors.js";
import type { ReserveResult, StoredRecord } from "../../src/registry/types.js";
import { MAX_WAIT_FOR_OWNER_MS, RecordWatch, waitBudgetMs, waitForOwner } from "../../src/server/owner-wait.js";
import { until } from "../support/wait.js";

describe("RecordWatch", () => {
  it("wakes the waiters of the record that changed, and only them", async () => {
    const watch = new RecordWatch();
    const never = new AbortController().signal;
    let woken = "";
    const a = watch.next("acme", "op-1", 60_000, never).then(() => (woken += "a"));
    const b = watch.next("acme", "op-1", 60_000, never).then(() => (woken += "b"));
    const other = watch.next("globex", "op-1", 60_000, new AbortController().signal);
    expect(watch.size).toBe(3);
    const said = watch.next("acme", "op-1", 60_000, never);
    watch.changed("acme", "op-1");
    expect(await said).toBe(true);
    await Promise.all([a, b]);
    expect(woken).toHaveLength(2);
    expect(watch.size).toBe(1);
    watch.changed("globex", "op-1");
    await other;
    expect(watch.size).toBe(0);
  });

  it("lets go of a waiter after its time or its signal, leaving nothing behind", async () => {
    const watch = new RecordWatch();
    expect(await watch.next("acme", "op-2", 5, new AbortController().signal)).toBe(false);
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

describe("waitForOwner", () => {
  const inProgress = { decision: "IN_PROGRESS", record: { tenant: "acme", operationId: "op-9" } as StoredRecord, enforced: true, schemaRevision: 1 } as ReserveResult;
  const replay = { ...inProgress, decision: "REPLAY" } as ReserveResult;

  it("decides again only when a recheck finds the record moved on, or a local change wakes it", async () => {
    const watch = new RecordWatch();
    let decisions = 0;
    let rechecks = 0;
    const result = await waitForOwner(inProgress, {
      tenant: "acme",
      caller: "gateway",
      budgetMs: 5_000,
      watch,
      signal: new AbortController().signal,
      decide: async () => (++decisions === 1 ? inProgress : replay),
      // Unmoved at the first two rechecks, then moved: one decision (still in progress); then a local change wakes it.
      moved: async () => {
        rechecks++;
        // The change comes once the Reserve, having decided again, waits on the record again.
        // (Should it never do so, the answer below is IN_PROGRESS and the test fails there.)
        if (rechecks === 3) {
          void until(() => watch.size === 1, "the Reserve to wait on the record again", 5_000).then(
            () => watch.changed("acme", "op-9"),
            () => undefined,
          );
        }
        return rechecks === 3;
      },
    });
    expect(result.decision).toBe("REPLAY");
    expect(rechecks).toBe(3);
    expect(decisions).toBe(2);
    expect(watch.size).toBe(0);
  });

  it("answers IN_PROGRESS when nothing moved within its budget, without deciding again", async () => {
    let decisions = 0;
    const result = await waitForOwner(inProgress, {
      tenant: "acme",
      caller: "gateway",
      budgetMs: 120,
      watch: new RecordWatch(),
      signal: new AbortController().signal,
      decide: async () => (decisions++, replay),
      moved: async () => false,
    });
    expect(result.decision).toBe("IN_PROGRESS");
    expect(decisions).toBe(0);
  });

  it("ends within its budget even when a recheck is never answered, and decides nothing after it", async () => {
    const watch = new RecordWatch();
    let decisions = 0;
    const result = await waitForOwner(inProgress, {
      tenant: "acme",
      caller: "gateway",
      budgetMs: 100,
      watch,
      signal: new AbortController().signal,
      decide: async () => (decisions++, replay),
      // A registry too busy to answer: were the wait to await it, this test would never end.
      moved: () => new Promise<boolean>(() => undefined),
    });
    expect(result.decision).toBe("IN_PROGRESS");
    expect(decisions).toBe(0);
    expect(watch.waitingOf("gateway")).toBe(0);
  });

  it("asks one recheck for every waiter of a record at a time", async () => {
    const watch = new RecordWatch();
    let rechecks = 0;
    const answers: Array<(moved: boolean) => void> = [];
    const moved = () => {
      rechecks++;
      return new Promise<boolean>((resolve) => answers.push(resolve));
    };
    const record = { tenant: "acme", operationId: "op-7", state: "EXECUTING", generation: 1 } as StoredRecord;
    const first = watch.recheck(record, moved);
    const second = watch.recheck(record, moved);
    // Another generation of the record is another question.
    void watch.recheck({ ...record, generation: 2 }, moved);
    expect(rechecks).toBe(2);
    answers.forEach((answer) => answer(true));
    expect(await first).toBe(true);
    expect(await second).toBe(true);
    // Once answered, the next recheck asks again.
    void watch.recheck(record, moved);
    expect(rechecks).toBe(3);
  });

  it("lets a caller have at most its bound of waiters at once; one more is refused, other callers are not", async () => {
    const watch = new RecordWatch(2);
    const stop = new AbortController();
    const wait = (caller: string) =>
      waitForOwner(inProgress, { tenant: "acme", caller, budgetMs: 60_000, watch, signal: stop.signal, decide: async () => inProgress, moved: async () => false });
    const waiting = [wait("gateway"), wait("gateway"), wait("other")];
    expect(watch.waitingOf("gateway")).toBe(2);
    const refused = await wait("gateway").catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(IdempotencyError);
    expect(refused).toMatchObject({ reason: "TOO_MANY_WAITERS", metadata: { limit: "2" } });
    expect((refused as Error).message).toMatch(/already has 2 Reserves waiting .*IDEM_WAITERS_PER_CALLER.*retry/);
    // An answer that needs no wait does not count.
    expect(await wait("gateway").catch(() => "refused")).toBe("refused");
    expect(
      (await waitForOwner(replay, { tenant: "acme", caller: "gateway", budgetMs: 60_000, watch, signal: stop.signal, decide: async () => replay, moved: async () => false }))
        .decision,
    ).toBe("REPLAY");
    stop.abort();
    await Promise.all(waiting);
    expect(watch.waitingOf("gateway")).toBe(0);
    expect(watch.waitingOf("other")).toBe(0);
  });
});
