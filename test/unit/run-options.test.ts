import { describe, expect, it } from "vitest";
import { parseHaArgs } from "../../harness/ha/options.js";
import { halfOfBenchPeak, parseSoakArgs } from "../../harness/soak/options.js";

// The command lines of npm run ha and npm run soak, read without starting a registry.

describe("npm run ha's options", () => {
  it("take the quick variant's one round, or three, and refuse what is not a count", () => {
    expect(parseHaArgs(["--quick"])).toEqual({ quick: true, rounds: 1, requests: undefined, replicas: 3, outDir: "ha-report", verbose: false });
    expect(parseHaArgs(["--rounds", "2", "--requests", "5000", "--out", "x"])).toMatchObject({ quick: false, rounds: 2, requests: 5000, outDir: "x" });
    expect(parseHaArgs(["--help"])).toBe("help");
    expect(() => parseHaArgs(["--rounds", "0"])).toThrow(/--rounds: a whole number of at least 1, not 0/);
    expect(() => parseHaArgs(["--duration", "1m"])).toThrow(/Unknown option '--duration'/);
  });
});

describe("npm run soak's options", () => {
  it("run the quick variant for 4 minutes at the rate given, or at half the newest benchmark's peak", () => {
    expect(parseSoakArgs(["--quick", "--rate", "20"])).toEqual({
      quick: true,
      durationMs: 4 * 60_000,
      rate: 20,
      target: { rate: 20, source: "--rate" },
      replicas: 3,
      outDir: "soak-report",
      verbose: false,
    });
    const soak = parseSoakArgs(["--duration", "1h", "--replicas", "2"]);
    expect(soak).toMatchObject({ quick: false, durationMs: 3_600_000, rate: undefined, replicas: 2, target: halfOfBenchPeak() });
    expect(halfOfBenchPeak().source).toMatch(/^half of \d+ new keys\/s \(bench\/results\/.*\.json, /);
  });

  it("refuse a run too short to compare two windows, a replica count that would kill replica 0, and no rate", () => {
    expect(() => parseSoakArgs(["--duration", "1m"])).toThrow(/--duration: at least 2m/);
    expect(() => parseSoakArgs(["--replicas", "1"])).toThrow(/--replicas: a whole number of at least 2/);
    expect(() => parseSoakArgs(["--rate", "0"])).toThrow(/--rate: a positive number of requests per second/);
  });
});
