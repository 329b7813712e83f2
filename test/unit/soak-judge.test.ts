import { describe, expect, it } from "vitest";
import { Samples } from "../../harness/lib/histogram.js";
import { Random } from "../../harness/lib/random.js";
import {
  BOUNDS,
  floors,
  judgeConnectionsAtRest,
  judgeFlat,
  judgeP99Drift,
  judgeRetention,
  latencyBetween,
  slopePerHour,
  type Life,
  type SpanLatency,
  type Point,
  type Spans,
} from "../../harness/soak/judge.js";

// The soak's judge on series shaped like what it samples: a healthy process,
// and the drifts it is there to catch (a listener added per request and
// never removed, a connection checked out and never released, a socket
// opened per retry, a P99 that climbs, a sweep that falls behind), and
// what the P99 line leaves out: the answers sent while a killed process
// recovered, in both of its windows alike.

const MINUTE = 60_000;
const START = Date.parse("2026-12-01T10:00:00Z");
/** The full soak's spans: 5 min of warm-up, 8 min judged at least, 1-min floors. */
const FULL: Spans = { warmupMs: 5 * MINUTE, minSpanMs: 8 * MINUTE, bucketMs: MINUTE };

/** A deterministic sawtooth around `base` (a garbage-collected heap), plus `perHour` growth, sampled every 5 s for `minutes`. */
function series(base: number, swing: number, perHour: number, minutes = 30): Point[] {
  const points: Point[] = [];
  for (let t = 0; t <= minutes * MINUTE; t += 5_000) {
    const saw = ((t / 5_000) % 12) / 12; // rises for a minute, then a collection
    points.push({ t: START + t, v: base + swing * saw + (perHour * t) / 3_600_000 });
  }
  return points;
}

function coordinator(overrides: Partial<Life> = {}): Life {
  return {
    process: "coordinator 0",
    pid: 4242,
    rss: series(150e6, 40e6, 0),
    heap: series(40e6, 60e6, 0),
    fds: series(40, 6, 0),
    handles: series(20, 4, 0),
    poolAtRest: { inUse: 0, waiting: 0, t: START + 31 * MINUTE },
    ...overrides,
  };
}

describe("the soak's judge", () => {
  it("fits slopes and takes the floor of each whole bucket", () => {
    expect(slopePerHour(series(0, 0, 120))).toBeCloseTo(120, 6);
    // 3 minutes and one more sample: that last minute holds one sample, from the top of a sawtooth.
    const sawing = [...series(100, 50, 0, 3), { t: START + 3 * MINUTE + 55_000, v: 150 }];
    expect(floors(sawing, MINUTE).map((p) => p.v)).toEqual([100, 100, 100]);
  });

  it("does not mistake memory held for a minute and given back for a leak, at either end of a life", () => {
    // An RSS flat at 170 MB whose floor sits 30 to 60 MB higher in four minutes of 25, the last one among them.
    const held = new Map([
      [10, 200e6],
      [20, 235e6],
      [21, 230e6],
      [29, 230e6],
    ]);
    const rss = series(170e6, 20e6, 0).map((p) => {
      const minute = Math.floor((p.t - START) / MINUTE);
      return { t: p.t, v: Math.max(p.v, held.get(minute) ?? 0) };
    });
    const verdict = judgeFlat("memory", [coordinator({ process: "service", rss, heap: undefined })], FULL);
    expect(verdict.pass).toBe(true);
    // A least-squares line through the same floors would have grown by over 12 MB, the noise allowed.
    const lsq = (points: Point[]) => {
      const mt = points.reduce((sum, p) => sum + p.t, 0) / points.length;
      const mv = points.reduce((sum, p) => sum + p.v, 0) / points.length;
      const num = points.reduce((sum, p) => sum + (p.t - mt) * (p.v - mv), 0);
      const den = points.reduce((sum, p) => sum + (p.t - mt) ** 2, 0);
      return (num / den) * (points.at(-1)!.t - points[0]!.t);
    };
    expect(
      lsq(
        floors(
          rss.filter((p) => p.t >= START + 5 * MINUTE),
          MINUTE,
        ),
      ),
    ).toBeGreaterThan(BOUNDS.rss.noise);
  });

  it("passes a healthy process: sawtooth heap and RSS, steady descriptors and handles, nothing held at rest", () => {
    const lives = [coordinator()];
    expect(judgeFlat("memory", lives, FULL).pass).toBe(true);
    expect(judgeFlat("handles", lives, FULL).pass).toBe(true);
    expect(judgeConnectionsAtRest(lives).pass).toBe(true);
  });

  it("catches a listener leak: the heap's floor climbing 30 MB an hour under its sawtooth", () => {
    const leaking = coordinator({ heap: series(40e6, 60e6, 30e6), rss: series(150e6, 40e6, 30e6) });
    const verdict = judgeFlat("memory", [coordinator({ process: "coordinator 1", pid: 1 }), leaking], FULL);
    expect(verdict.pass).toBe(false);
    expect(verdict.measured).toMatch(/^grew: coordinator 0 rss .*coordinator 0 heap/);
  });

  it("leaves out the provider's memory, which its ledger of charges grows by design, and still judges its descriptors", () => {
    const provider = coordinator({ process: "provider", pid: 9, rss: series(100e6, 10e6, 60e6), heap: undefined, handles: undefined });
    const memory = judgeFlat("memory", [coordinator(), provider], FULL);
    expect(memory.pass).toBe(true);
    expect((memory.detail as { verdicts: Array<{ process: string }> }).verdicts.map((v) => v.process)).not.toContain("provider");
    expect(judgeFlat("handles", [coordinator(), { ...provider, fds: series(40, 6, 60) }], FULL).measured).toMatch(/^grew: provider fds/);
  });

  it("does not mistake the warm-up climb for a leak, nor judge a life too short to tell", () => {
    // 60 MB in the first five minutes (caches, compiled code), flat after.
    const warming = series(40e6, 60e6, 0).map((p) => ({ t: p.t, v: p.v + Math.min(p.t - START, 5 * MINUTE) * (60e6 / (5 * MINUTE)) }));
    expect(judgeFlat("memory", [coordinator({ heap: warming })], FULL).pass).toBe(true);
    const restarted = coordinator({ heap: series(40e6, 60e6, 300e6, 10), rss: series(150e6, 0, 0, 10), fds: [], handles: [] });
    const verdict = judgeFlat("memory", [restarted], FULL);
    // 10 minutes minus 5 of warm-up is shorter than the 8 judged at least: no verdict, and no line passes on nothing.
    expect(verdict.pass).toBe(false);
    expect(verdict.measured).toBe("no life long enough to judge");
  });

  it("in a short run judges only the heap's gross growth: the RSS still climbs to its working size there", () => {
    const quick: Spans = { warmupMs: 72_000, minSpanMs: 72_000, bucketMs: 10_000, short: true };
    const climbing = coordinator({ rss: series(150e6, 0, 1e9, 3), heap: series(40e6, 0, 200e6, 3), fds: [], handles: [] });
    expect(judgeFlat("memory", [climbing], quick).pass).toBe(true);
    const leaking = coordinator({ rss: series(150e6, 0, 0, 3), heap: series(40e6, 0, 1.2e9, 3), fds: [], handles: [] });
    expect(judgeFlat("memory", [leaking], quick).measured).toMatch(/^grew: coordinator 0 heap/);
  });

  it("catches a connection leak: a pool connection still checked out at rest", () => {
    const verdict = judgeConnectionsAtRest([coordinator(), coordinator({ process: "coordinator 2", pid: 7, poolAtRest: { inUse: 1, waiting: 0, t: START } })]);
    expect(verdict.pass).toBe(false);
    expect(verdict.measured).toBe("coordinator 2: 1 checked out, 0 waiting");
  });

  it("catches a socket opened per retry and never closed: descriptors climbing", () => {
    const verdict = judgeFlat("handles", [coordinator({ fds: series(40, 6, 60) })], FULL);
    expect(verdict.pass).toBe(false);
    expect(verdict.measured).toMatch(/coordinator 0 fds/);
  });

  describe("the answers the P99 line counts", () => {
    /** 30 minutes of answers kept per second, 100 a second: 98 at `fast` ms and 2 at `slow` ms (the P99), and `during` ms in the seconds of `slowSeconds`. */
    function perSecond(shape: (second: number) => { fast: number; slow: number }, slowSeconds: ReadonlySet<number> = new Set(), during = 2_000): Samples[] {
      return Array.from({ length: 30 * 60 }, (_, second) => {
        const samples = new Samples();
        const { fast, slow } = shape(second);
        for (let i = 0; i < 100; i++) samples.add(slowSeconds.has(second) ? during : i < 98 ? fast : slow);
        return samples;
      });
    }
    /** A kill at `atSecond`, down `downSeconds`, and the answers of those seconds slow. */
    const kill = (atSecond: number, downSeconds: number) => ({ from: START + atSecond * 1000, to: START + (atSecond + downSeconds) * 1000 });
    const secondsOf = (...outages: Array<{ from: number; to: number }>) =>
      new Set(outages.flatMap((o) => Array.from({ length: (o.to - o.from) / 1000 }, (_, i) => (o.from - START) / 1000 + i)));
    const FIRST = [START, START + 5 * MINUTE] as const;
    const LAST = [START + 25 * MINUTE, START + 30 * MINUTE] as const;
    const steady = () => ({ fast: 20, slow: 40 });

    it("catches a P99 that drifts up by more than 20 %, not one within it", () => {
      const first = latencyBetween(perSecond(steady), START, ...FIRST, []);
      const within = latencyBetween(
        perSecond(() => ({ fast: 20, slow: 47 })),
        START,
        ...LAST,
        [],
      );
      expect(judgeP99Drift(first, within, 5 * MINUTE).pass).toBe(true);
      const drifted = judgeP99Drift(
        first,
        latencyBetween(
          perSecond(() => ({ fast: 20, slow: 60 })),
          START,
          ...LAST,
          [],
        ),
        5 * MINUTE,
      );
      expect(drifted.pass).toBe(false);
      // Every second alike: drawing seconds again changes nothing, and the interval is the ratio.
      expect(drifted.measured).toMatch(/^60\.0 ms against 40\.0 ms \(150 %, 90 % interval 150 % to 150 %/);
      // Too few answers in a window make no verdict.
      const tooFew = latencyBetween(perSecond(steady), START, START, START + 1_000, []);
      expect(tooFew.count).toBe(100);
      expect(judgeP99Drift(first, { ...tooFew, count: 99 }, 5 * MINUTE).pass).toBe(false);
    });

    it("leaves out the seconds of a kill's recovery, in both windows alike, and says how many answers it left out", () => {
      // One kill in the first window costs 2 s of 2 000 ms answers, under 1 % of the window's; two in the last cost 10 s each, 6.7 %.
      const outages = [kill(120, 2), kill(1_560, 10), kill(1_700, 10)];
      const seconds = perSecond(steady, secondsOf(...outages));
      const counted = (from: number, to: number) => latencyBetween(seconds, START, from, to, outages);
      const first = counted(...FIRST);
      const last = counted(...LAST);
      expect(first).toMatchObject({ p99Ms: 40, count: 29_800, leftOut: 200 });
      expect(last).toMatchObject({ p99Ms: 40, count: 28_000, leftOut: 2_000 });
      const line = judgeP99Drift(first, last, 5 * MINUTE);
      expect(line.pass).toBe(true);
      expect(line.measured).toMatch(/2000 and 200 sent while a killed process recovered left out/);
      // Counting every answer, the kills' clusters decide the P99, not the request path.
      const everyAnswer = judgeP99Drift(latencyBetween(seconds, START, ...FIRST, []), latencyBetween(seconds, START, ...LAST, []), 5 * MINUTE);
      expect(everyAnswer.measured).toMatch(/^2000\.0 ms against 40\.0 ms/);
    });

    it("still catches a drift of the request path outside the kills", () => {
      const outages = [kill(120, 4), kill(1_560, 10)];
      // From minute 20 on, every answer is 50 % slower.
      const drifting = (second: number) => (second >= 20 * 60 ? { fast: 30, slow: 60 } : steady());
      const seconds = perSecond(drifting, secondsOf(...outages));
      const line = judgeP99Drift(latencyBetween(seconds, START, ...FIRST, outages), latencyBetween(seconds, START, ...LAST, outages), 5 * MINUTE);
      expect(line.pass).toBe(false);
      expect(line.measured).toMatch(/^60\.0 ms against 40\.0 ms \(150 %/);
    });

    it("makes no verdict when the outages leave too few answers", () => {
      const everything = [{ from: START, to: START + 30 * MINUTE }];
      const seconds = perSecond(steady);
      const first = latencyBetween(seconds, START, ...FIRST, everything);
      expect(first).toMatchObject({ p99Ms: 0, count: 0, leftOut: 30_000 });
      expect(judgeP99Drift(first, latencyBetween(seconds, START, ...LAST, everything), 5 * MINUTE).pass).toBe(false);
    });
  });

  describe("the P99 line on a quick run's minute", () => {
    /**
     * A minute like the quick run's, from `seed`: 40 answers a second, most 5 to
     * 60 ms and one in forty 60 to 200 ms, and every 5 s a terminated backend's
     * 3 transactions retried together, 100 to 600 ms; `scale` multiplies them all.
     */
    function quickMinute(seed: number, scale = 1): SpanLatency {
      const random = new Random(seed);
      const seconds = Array.from({ length: 60 }, (_, second) => {
        const samples = new Samples();
        for (let i = 0; i < 40; i++) samples.add(scale * (random.chance(1 / 40) ? 60 + 140 * random.next() : 5 + 55 * random.next()));
        if (second % 5 === 2) for (let i = 0; i < 3; i++) samples.add(scale * (100 + 500 * random.next()));
        return samples;
      });
      return latencyBetween(seconds, START, START, START + MINUTE, []);
    }

    it("does not fail a steady service whose last minute's P99 came out 38 % above its first", () => {
      // The slowest 1 % is about 24 answers, most of them from the 12 clusters: which ones a minute
      // happens to get moves its P99 by a third. Seeds 6 and 1006 are such a pair.
      const line = judgeP99Drift(quickMinute(6), quickMinute(1_006), MINUTE);
      expect(line.value).toBeGreaterThan(1.3);
      expect(line.measured).toMatch(/^297\.4 ms against 215\.3 ms \(138 %, 90 % interval 69 % to 223 %/);
      expect(line.pass).toBe(true);
    });

    it("fails the same minute three times slower, beyond its noise", () => {
      const line = judgeP99Drift(quickMinute(6), quickMinute(1_006, 3), MINUTE);
      expect(line.pass).toBe(false);
      expect((line.detail as { interval: { low: number } }).interval.low).toBeGreaterThan(1.2);
    });
  });

  it("catches a retention sweep that falls behind, and one that never ran", () => {
    const keptUp = [0, 0, 0].map((v, i) => ({ t: START + (3 + i) * MINUTE, v }));
    expect(judgeRetention(keptUp, 1_200, START + 2 * MINUTE).pass).toBe(true);
    expect(judgeRetention([...keptUp, { t: START + 6 * MINUTE, v: 35 }], 1_200, START + 2 * MINUTE).pass).toBe(false);
    expect(judgeRetention(keptUp, 0, START + 2 * MINUTE).pass).toBe(false);
  });
});
