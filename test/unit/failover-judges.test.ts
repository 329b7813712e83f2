import { describe, expect, it } from "vitest";
import { judgeProbeWrites, judgeWritePause } from "../../harness/ha/scenario.js";

// The failover scenario's own lines (npm run ha), judged on what its write probe saw.

describe("the failover scenario's judges", () => {
  it("fail when an acknowledged probe write is gone, and when the probe wrote nothing at all", () => {
    expect(judgeProbeWrites({ lost: [], acknowledged: 4_000, failedWrites: 12 })).toMatchObject({ pass: true, measured: "0 of 4000" });
    expect(judgeProbeWrites({ lost: [17, 18], acknowledged: 4_000, failedWrites: 12 })).toMatchObject({ pass: false, value: 2, measured: "2 of 4000" });
    expect(judgeProbeWrites({ lost: [], acknowledged: 0, failedWrites: 0 }).pass).toBe(false);
  });

  it("hold every round's write pause within Patroni's ttl, and every round run", () => {
    expect(judgeWritePause("primary kill", [9_000, 4_000, 6_000], 3)).toMatchObject({
      id: "pause-primary-kill",
      pass: true,
      value: 9_000,
      measured: "P50 6.0 s, P99 9.0 s",
      threshold: "<= 15.0 s",
    });
    expect(judgeWritePause("primary kill", [9_000, 16_000, 6_000], 3).pass).toBe(false);
    expect(judgeWritePause("switchover", [2_000], 3)).toMatchObject({ pass: false, name: "write pause, switchover (1 of 3 run)" });
    expect(judgeWritePause("commit in flight", [], 1)).toMatchObject({ pass: false, measured: "n/a (did not run)" });
  });
});
