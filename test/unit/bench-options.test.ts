import { describe, expect, it } from "vitest";
import { parseBenchArgs, UsageError, type Options } from "../../bench/options.js";

// npm run bench's command line, read by node:util's parseArgs in the order the options are given.

const options = (...argv: string[]) => parseBenchArgs(argv) as Options;

describe("npm run bench's options", () => {
  it("take --quick's defaults wherever it stands, and let a later option override an earlier one", () => {
    expect(options("--concurrency", "8", "--quick")).toMatchObject({ quick: true, concurrency: [8], commit: ["on"], warmupSec: 1, measureSec: 2, open: [0.5], roundTripOps: 50 });
    expect(options("--durable", "--commit", "on,off").commit).toEqual(["on", "off"]);
    expect(options("--commit", "on,off", "--durable").commit).toEqual(["on"]);
    expect(options("--duration", "2m", "--warmup", "3")).toMatchObject({ measureSec: 120, warmupSec: 3 });
  });

  it("repeat --setting, and read --help, --pgbench-script and --render as what to do instead of a run", () => {
    expect(options("--setting", "IDEM_BATCH_IN_FLIGHT=8", "--setting", "IDEM_DB_POOL_MAX=4").settings).toEqual({ IDEM_BATCH_IN_FLIGHT: "8", IDEM_DB_POOL_MAX: "4" });
    expect(parseBenchArgs(["-h"])).toBe("help");
    expect(parseBenchArgs(["--pgbench-script"])).toBe("script");
    expect(parseBenchArgs(["--render", "run.json", "--markdown"])).toEqual({ render: "run.json", markdown: true });
  });

  it("refuse what they do not know, a missing value and a bad one", () => {
    expect(() => parseBenchArgs(["--bogus"])).toThrow(UsageError);
    expect(() => parseBenchArgs(["--out"])).toThrow(UsageError);
    expect(() => parseBenchArgs(["--level", "cluster"])).toThrow(/--level is coordinator, service, database or all, got 'cluster'/);
    expect(() => parseBenchArgs(["--protocol", "connect"])).toThrow(/--protocol connect needs --client unary/);
    expect(() => parseBenchArgs(["--setting", "LOG_LEVEL=info"])).toThrow(/--setting is NAME=VALUE with an IDEM_ name/);
  });
});
