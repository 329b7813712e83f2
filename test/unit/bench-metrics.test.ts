import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { coordinatorCalls, handlerMean, handlerTimes } from "../../bench/metrics.js";
import { summarize } from "../../bench/load.js";
import { percentile, Samples } from "../../harness/lib/histogram.js";

// The benchmark reads the coordinator's /metrics with the harness's Prometheus parser, and takes
// its percentiles as the gate and the soak do.

/** An exposition whose label order differs from series to series, as any exporter may write it. */
const METRICS = [
  "# TYPE idem_rpc_duration_seconds histogram",
  'idem_rpc_duration_seconds_sum{code="ok",method="Reserve",service="idempotency.v1.CoordinatorService"} 0.3',
  'idem_rpc_duration_seconds_count{code="ok",method="Reserve",service="idempotency.v1.CoordinatorService"} 100',
  'idem_rpc_duration_seconds_sum{service="idempotency.v1.CoordinatorService",method="Reserve",code="unavailable"} 9',
  'idem_rpc_duration_seconds_count{service="idempotency.v1.CoordinatorService",method="Reserve",code="unavailable"} 3',
  'idem_rpc_duration_seconds_sum{method="Complete",service="idempotency.v1.CoordinatorService",code="ok"} 0.1',
  'idem_rpc_duration_seconds_count{method="Complete",service="idempotency.v1.CoordinatorService",code="ok"} 50',
  'idem_rpc_duration_seconds_sum{service="grpc.health.v1.Health",method="Check",code="ok"} 0.01',
  'idem_rpc_duration_seconds_count{service="grpc.health.v1.Health",method="Check",code="ok"} 20',
  "",
].join("\n");

let server: Server;
let adminUrl: string;

beforeAll(async () => {
  server = createServer((_req, res) => res.end(METRICS));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  adminUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

describe("the benchmark's reading of /metrics", () => {
  it("times the calls answered by method, whatever the order of their labels", async () => {
    const times = await handlerTimes(adminUrl);
    expect(times).toEqual({ Reserve: { count: 100, seconds: 0.3 }, Complete: { count: 50, seconds: 0.1 }, Check: { count: 20, seconds: 0.01 } });
    expect(handlerMean({}, times, "Reserve")).toBeCloseTo(3, 9);
  });

  it("counts the coordinator service's calls by method, every code, and no other service's", async () => {
    expect(await coordinatorCalls(adminUrl)).toEqual(
      new Map([
        ["Reserve", 103],
        ["Complete", 50],
      ]),
    );
  });
});

describe("percentiles", () => {
  it("are the same nearest rank in the benchmark's summaries and the harness's samples", () => {
    const latencies = Array.from({ length: 1_001 }, (_, i) => ((i * 7919) % 1_001) / 10);
    const samples = new Samples();
    for (const ms of latencies) samples.add(ms);
    const bench = summarize({ latencies, parts: latencies, errors: 0, windowMs: 1_000 });
    const harness = samples.summary();
    expect([bench.p50Ms, bench.p99Ms]).toEqual([harness.p50Ms, harness.p99Ms]);
    // The smallest value with at least the share asked at or below it: the 501st, 991st and 1,000th of 1,001.
    expect([harness.p50Ms, harness.p99Ms, harness.p999Ms]).toEqual([50, 99, 99.9]);
    expect(percentile([1, 2, 3, 4], 0.5)).toBe(2);
    expect(percentile([], 0.5)).toBeNaN();
  });
});
