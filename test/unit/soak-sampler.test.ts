import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { Samples } from "../../harness/lib/histogram.js";
import { cpuUsage, sampleCpu } from "../../harness/lib/machine.js";
import { promGauge, promTotalsBy } from "../../harness/lib/prometheus.js";
import { compareWindows } from "../../harness/soak/compare.js";
import { cpuSecondsOf, type SampledLife, type StatementsSample } from "../../harness/soak/sampler.js";

// The soak's CPU time per process, read from /proc/<pid>/stat.

describe("cpuSecondsOf", () => {
  it("adds utime and stime, counting fields after the command name even when it holds spaces and parentheses", () => {
    // pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime ...
    expect(cpuSecondsOf("4242 (node (a) b) S 1 4242 4242 0 -1 4194560 9 0 0 0 250 70 0 0 20 0 11 0")).toBe(3.2);
  });

  it("agrees with what Node says this process used", () => {
    const usage = process.cpuUsage();
    const fromProc = cpuSecondsOf(readFileSync("/proc/self/stat", "utf8"));
    // /proc counts in ticks of 10 ms; both clocks read within the same few milliseconds.
    expect(Math.abs(fromProc - (usage.user + usage.system) / 1e6)).toBeLessThan(0.05);
  });
});

describe("sampleCpu", () => {
  it("counts this process's CPU in its tree's, and the work done between two samples", async () => {
    const own = cpuSecondsOf(readFileSync("/proc/self/stat", "utf8")) * 100;
    const before = await sampleCpu();
    expect(before!.tree).toBeGreaterThanOrEqual(Math.round(own));
    // Busy until this process has used 300 ms more CPU, however long a shared machine takes to give it.
    const start = process.cpuUsage();
    const usedMs = () => {
      const { user, system } = process.cpuUsage(start);
      return (user + system) / 1e3;
    };
    while (usedMs() < 300);
    const after = await sampleCpu();
    // In jiffies of 10 ms: at least 30, less the two samples' rounding.
    expect(after!.tree - before!.tree).toBeGreaterThanOrEqual(28);
    expect(after!.hostBusy - before!.hostBusy).toBeGreaterThanOrEqual(after!.tree - before!.tree - 2);
    const usage = cpuUsage(before, after, 2)!;
    expect(usage.gateShare).toBeGreaterThan(0);
    expect(usage.hostBusyShare).toBeGreaterThanOrEqual(usage.gateShare);
  });
});

describe("promTotalsBy", () => {
  it("adds a histogram's _count and _sum over the other labels, by the value of one", () => {
    const text = [
      "# TYPE idem_rpc_duration_seconds histogram",
      'idem_rpc_duration_seconds_bucket{service="idem.v1.Coordinator",method="Reserve",code="ok",le="0.005"} 7',
      'idem_rpc_duration_seconds_sum{service="idem.v1.Coordinator",method="Reserve",code="ok"} 0.25',
      'idem_rpc_duration_seconds_count{service="idem.v1.Coordinator",method="Reserve",code="ok"} 10',
      'idem_rpc_duration_seconds_sum{service="idem.v1.Coordinator",method="Reserve",code="unavailable"} 0.5',
      'idem_rpc_duration_seconds_count{service="idem.v1.Coordinator",method="Reserve",code="unavailable"} 2',
      'idem_rpc_duration_seconds_sum{service="idem.v1.Coordinator",method="Complete",code="ok"} 0.1',
      'idem_rpc_duration_seconds_count{service="idem.v1.Coordinator",method="Complete",code="ok"} 4',
      'idem_rpc_duration_seconds_total_sum{method="Lookup"} 9',
    ].join("\n");
    expect(promTotalsBy(text, "idem_rpc_duration_seconds", "method")).toEqual({ Reserve: { count: 12, seconds: 0.75 }, Complete: { count: 4, seconds: 0.1 } });
  });
});

describe("promGauge", () => {
  const text = [
    "# HELP idem_db_pool_connections Registry pool connections by state.",
    'idem_db_pool_connections{state="total"} 8',
    'idem_db_pool_connections{state="idle"} 6',
    'idem_db_pool_connections_max{state="idle"} 99',
    "idem_nodejs_heap_size_used_bytes 1.5e7",
    "idem_nodejs_heap_size_used_bytes_max 9",
  ].join("\n");

  it("reads the series whose labels match, and not a metric whose name only begins the same", () => {
    expect(promGauge(text, "idem_db_pool_connections", { state: "idle" })).toBe(6);
    expect(promGauge(text, "idem_db_pool_connections", { state: "total" })).toBe(8);
    expect(promGauge(text, "idem_nodejs_heap_size_used_bytes")).toBe(1.5e7);
  });

  it("is NaN for a gauge or a series the text does not hold", () => {
    expect(promGauge(text, "idem_db_pool_connections", { state: "waiting" })).toBeNaN();
    expect(promGauge(text, "idem_nodejs_heap_size")).toBeNaN();
  });
});

describe("compareWindows", () => {
  const origin = 1_000_000;
  const at = (s: number) => origin + s * 1000;
  const first = { from: at(0), to: at(60) };
  const last = { from: at(120), to: at(180) };
  // A coordinator whose Reserve RPCs take 4 ms in the first minute and 9 ms in the last, 10 a second.
  const coordinator: SampledLife = { process: "coordinator 0", pid: 1, rss: [], fds: [], samples: [] };
  let count = 0;
  let seconds = 0;
  for (let s = 0; s <= 180; s += 5) {
    coordinator.samples.push({ t: at(s), cpuSeconds: s / 10, sockets: 3, rpcs: { Reserve: { count, seconds } } });
    count += 50;
    seconds += 50 * (s < 120 ? 0.004 : 0.009);
  }
  // A statement run twice a second, 1 ms at first and 3 ms per call at the end; one seen only at the end.
  const statements: StatementsSample[] = [];
  let calls = 0;
  let ms = 0;
  for (let s = 0; s <= 180; s += 5) {
    statements.push({
      t: at(s),
      byQuery: {
        "1": { query: "SELECT count(*) FROM idem_record", calls, ms, rows: calls },
        ...(s >= 120 ? { "2": { query: "SELECT 1", calls: s - 120, ms: s - 120, rows: 0 } } : {}),
      },
    });
    calls += 10;
    ms += 10 * (s < 120 ? 1 : 3);
  }
  const answers = Array.from({ length: 181 }, (_, s) => {
    const second = new Samples();
    for (let i = 0; i < 10; i++) second.add(s < 120 ? 20 : 50);
    return second;
  });
  const generator = Array.from({ length: 37 }, (_, i) => ({
    t: at(i * 5),
    cpuSeconds: i * 2.5,
    rssBytes: 1e8,
    heapUsedBytes: 5e7,
    eventLoopP99Ms: i < 24 ? 12 : 30,
    eventLoopMeanMs: 10,
  }));

  const comparison = compareWindows({ answers, origin, lives: [coordinator], machine: [], generator, statements }, first, last);
  const figure = (name: string) => comparison.figures.find((f) => f.name === name);

  it("sets each window's answers, RPCs and the load generator's own figures side by side", () => {
    expect(figure("answers, P50")).toMatchObject({ first: 20, last: 50 });
    expect(figure("Reserve RPCs, mean (every coordinator)")!.first).toBeCloseTo(4, 6);
    expect(figure("Reserve RPCs, mean (every coordinator)")!.last).toBeCloseTo(9, 6);
    expect(figure("Reserve RPCs per second")!.first).toBeCloseTo(10, 6);
    expect(figure("load generator, CPU")!.last).toBeCloseTo(0.5, 6);
    expect(figure("load generator, event-loop delay P99 (mean of samples)")).toMatchObject({ first: 12, last: 30 });
    expect(figure("machine, busy cores")).toMatchObject({ first: undefined, last: undefined });
  });

  it("lists the registry's statements by their time in either window, with calls and time per call", () => {
    expect(comparison.statements.map((s) => s.query)).toEqual(["SELECT count(*) FROM idem_record", "SELECT 1"]);
    const [counting, one] = comparison.statements;
    expect(counting!.first).toEqual({ callsPerSecond: 2, rowsPerCall: 1, meanMs: 1, msPerSecond: 2 });
    expect(counting!.last).toEqual({ callsPerSecond: 2, rowsPerCall: 1, meanMs: 3, msPerSecond: 6 });
    expect(one!.first).toBeUndefined();
    expect(figure("registry statements, execution time per second")).toMatchObject({ first: 2, last: 7 });
  });

  it("leaves out a statement whose counters went back (another server became primary)", () => {
    const reset = statements.map((s) => (s.t === last.to ? { t: s.t, byQuery: { "1": { query: "SELECT count(*) FROM idem_record", calls: 3, ms: 3, rows: 3 } } } : s));
    const after = compareWindows({ answers, origin, lives: [], machine: [], generator: [], statements: reset }, first, last);
    expect(after.statements.find((s) => s.query.startsWith("SELECT count"))!.last).toBeUndefined();
  });
});
