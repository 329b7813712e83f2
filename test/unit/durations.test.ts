import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { parseDuration as gateDuration } from "../../harness/gate/options.js";
import { parseDuration } from "../../src/policy/document.js";

/** One duration syntax across the project's commands: policies and idemctl, the gate, the benchmark. */
const run = promisify(execFile);

describe("durations", () => {
  it("read the same in policies, idemctl and the gate: 1500ms, 2s, 1m, 1h, 7d", () => {
    for (const [text, ms] of [
      ["1500ms", 1500],
      ["2s", 2000],
      ["1m", 60_000],
      ["1h", 3_600_000],
      ["7d", 604_800_000],
    ] as const) {
      expect(parseDuration(text), text).toBe(ms);
      expect(gateDuration(text, "--late-delay"), text).toBe(ms);
    }
    // The gate also takes a whole number of milliseconds, as it always did.
    expect(gateDuration("250", "--late-delay")).toBe(250);
    expect(() => gateDuration("2x", "--late-delay")).toThrow(/--late-delay: not a duration: 2x/);
    expect(parseDuration("2x")).toBeUndefined();
  });

  it("read the same in the benchmark, which also takes whole seconds", async () => {
    const bench = (...args: string[]) =>
      run(process.execPath, ["--import", "tsx", "bench/run.ts", ...args, "--pgbench-script"]).then(
        ({ stdout }) => ({ code: 0, stdout, stderr: "" }),
        (error: { code: number; stdout: string; stderr: string }) => error,
      );
    expect((await bench("--duration", "2m", "--warmup", "3s")).code).toBe(0);
    expect((await bench("--duration", "4")).code).toBe(0);
    const refused = await bench("--duration", "1500ms");
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toMatch(/--duration needs a duration of whole seconds/);
  });
});
