import { describe, expect, it } from "vitest";
import { Coalescer } from "../../src/registry/coalescer.js";

/** A coalescer whose units of work are recorded (the items of each, in order) and answered when released. */
function recording(maxInFlight: number, maxBatch = 64) {
  const units: number[][] = [];
  const releases: Array<() => void> = [];
  const held = () => new Promise<void>((resolve) => releases.push(resolve));
  const coalescer = new Coalescer<number, string>({
    maxBatch,
    maxInFlight,
    runAlone: async (item) => {
      units.push([item]);
      await held();
      if (item < 0) throw new Error(`refused ${item}`);
      return `alone ${item}`;
    },
    runBatch: (items) => {
      units.push(items);
      const shared = held();
      return items.map(async (item) => {
        await shared;
        if (item < 0) throw new Error(`refused ${item}`);
        return `batch ${item}`;
      });
    },
  });
  const releaseAll = () => releases.splice(0).forEach((release) => release());
  return { coalescer, units, releaseAll };
}

/** Past the end of this turn of the event loop, and past the end of the next (what a microtask scheduled goes in the next). */
const turn = async () => {
  await new Promise((resolve) => setImmediate(resolve));
  await new Promise((resolve) => setImmediate(resolve));
};

describe("Coalescer", () => {
  it("runs a lone request alone, without waiting for anything but its turn", async () => {
    const { coalescer, units, releaseAll } = recording(4);
    const answer = coalescer.submit("lane", 1);
    await turn();
    expect(units).toEqual([[1]]);
    releaseAll();
    expect(await answer).toBe("alone 1");
  });

  it("shares the requests of one turn out over the free slots, in order, even when they arrive microtasks apart", async () => {
    const { coalescer, units, releaseAll } = recording(4);
    const answers: Array<Promise<string>> = [];
    for (let i = 0; i < 10; i++) {
      // Each request reaches the coalescer a few microtasks after the one before, as the calls of one Batch RPC do.
      answers.push(
        Promise.resolve()
          .then(() => Promise.resolve())
          .then(() => coalescer.submit("lane", i)),
      );
    }
    await turn();
    expect(units).toEqual([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]);
    releaseAll();
    expect(await Promise.all(answers)).toEqual([...Array(10).keys()].map((i) => (i === 9 ? "alone 9" : `batch ${i}`)));
  });

  it("gathers what arrives while every slot is busy into the next free slot's batch, up to maxBatch", async () => {
    const { coalescer, units, releaseAll } = recording(1, 3);
    const first = coalescer.submit("lane", 0);
    await turn();
    const waiting = [1, 2, 3, 4].map((i) => coalescer.submit("lane", i));
    await turn();
    expect(units).toEqual([[0]]);
    releaseAll();
    await first;
    await turn();
    expect(units).toEqual([[0], [1, 2, 3]]);
    releaseAll();
    await turn();
    expect(units).toEqual([[0], [1, 2, 3], [4]]);
    releaseAll();
    expect(await Promise.all(waiting)).toEqual(["batch 1", "batch 2", "batch 3", "alone 4"]);
  });

  it("answers a refused request with its own refusal and its neighbours with theirs", async () => {
    const { coalescer, releaseAll } = recording(1);
    const answers = [1, -2, 3].map((i) => coalescer.submit("lane", i).catch((error: Error) => error.message));
    await turn();
    releaseAll();
    expect(await Promise.all(answers)).toEqual(["batch 1", "refused -2", "batch 3"]);
  });

  it("answers each request of a batch as soon as its own answer is there, and holds the slot until all are", async () => {
    const late: Array<() => void> = [];
    const units: number[][] = [];
    const coalescer = new Coalescer<number, number>({
      maxBatch: 8,
      maxInFlight: 1,
      runAlone: (item) => {
        units.push([item]);
        return Promise.resolve(item);
      },
      // Item 2 is decided apart, later (as a request the batch could not decide is decided alone).
      runBatch: (items) => {
        units.push(items);
        return items.map((item) => (item === 2 ? new Promise<number>((resolve) => late.push(() => resolve(item))) : Promise.resolve(item)));
      },
    });
    const answered: number[] = [];
    const answers = [1, 2, 3].map((i) => coalescer.submit("lane", i).then((value) => answered.push(value)));
    await turn();
    expect(answered).toEqual([1, 3]);
    // The slot is still taken by the batch: a new request waits for it.
    const next = coalescer.submit("lane", 4);
    await turn();
    expect(units).toEqual([[1, 2, 3]]);
    late.forEach((release) => release());
    await Promise.all([...answers, next]);
    expect(answered).toEqual([1, 3, 2]);
    expect(units).toEqual([[1, 2, 3], [4]]);
  });

  it("forgets a lane once its work is done, even when a freed slot took the queue before the turn's dispatch", async () => {
    let releaseFirst!: () => void;
    const coalescer = new Coalescer<number, number>({
      maxBatch: 8,
      maxInFlight: 1,
      // The first request waits to be released; any later one is answered at once.
      runAlone: (item) => (item === 0 ? new Promise<number>((resolve) => (releaseFirst = () => resolve(0))) : Promise.resolve(item)),
      runBatch: (items) => items.map((value) => Promise.resolve(value)),
    });
    const lanes = (coalescer as unknown as { lanes: Map<string, unknown> }).lanes;
    const first = coalescer.submit("lane", 0);
    await turn();
    // Queued with its dispatch due at the end of this turn; the slot frees first and takes it.
    const second = coalescer.submit("lane", 1);
    releaseFirst();
    expect(await Promise.all([first, second])).toEqual([0, 1]);
    await turn();
    expect(lanes.size).toBe(0);
  });

  it("keeps lanes apart: requests of two lanes never share a unit of work", async () => {
    const { coalescer, units, releaseAll } = recording(1);
    const answers = [coalescer.submit("a", 1), coalescer.submit("b", 2), coalescer.submit("a", 3), coalescer.submit("b", 4)];
    await turn();
    expect(units).toEqual([
      [1, 3],
      [2, 4],
    ]);
    releaseAll();
    await Promise.all(answers);
  });
});
