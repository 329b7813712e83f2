/** `npm run soak`'s options: its help text, the command line read, and the rate to run at. */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { parseDuration, UsageError } from "../gate/options.js";
import { COMMON_OPTIONS } from "../ha/on-registry.js";
import type { SoakOptions } from "./soak.js";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

export const USAGE = `usage: npm run soak -- [options]

Runs the launch gate's load (replays, conflicts, card-provider faults) through the payments example
and three coordinator replicas on a two-node Patroni registry (etcd, HAProxy: apt-get install -y
patroni etcd-server haproxy), paced at half of its peak (--rate below), while a registry
backend is terminated every 5 s, a replica (not replica 0) is killed and restarted every minute, the
service is killed now and then, and the registry is switched over, its standby paused and its
primary killed once each. Samples every process and the registry every 5 s; judges the gate's
lines and its own (P99 drift, memory and handles flat, connections at rest, retention). Prints the
table, writes soak.html and soak.json; exit code 0 when every line passes, 1 when one fails, 2 on
bad usage. Needs root or the postgres user (as root, the engines run as postgres).

  --quick          the CI variant: 4 minutes
  --duration D     how long the load runs, e.g. 30m, 1h (30m; quick 4m)
  --rate N         requests per second (default: the lower of half the newest bench/results/*.json's
                   service-level new keys per second under synchronous_commit=on, and half of this
                   stack's peak, measured by a closed-loop calibration run of a minute first)
  --replicas N     coordinator replicas, at least 2 (3)
  --out DIR        where soak.html, soak.json and the gate's report go (soak-report)
  --verbose        print the processes' output
  --help           this text`;

/** The soak's options from its command line (`help` for --help); throws UsageError. */
export function parseSoakArgs(argv: string[]): SoakOptions | "help" {
  const { values } = parseArgs({
    args: argv,
    options: { ...COMMON_OPTIONS, duration: { type: "string" }, rate: { type: "string" } },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) return "help";
  const quick = values.quick ?? false;
  const durationMs = values.duration === undefined ? (quick ? 4 : 30) * 60_000 : durationOf(values.duration);
  const rate = values.rate === undefined ? undefined : Number(values.rate);
  if (rate !== undefined && !(rate > 0)) throw new UsageError(`--rate: a positive number of requests per second, not ${values.rate}`);
  const replicas = values.replicas === undefined ? 3 : Number(values.replicas);
  if (!Number.isInteger(replicas) || replicas < 2) throw new UsageError(`--replicas: a whole number of at least 2 (replica 0 is never killed), not ${values.replicas}`);
  const target = rate ? { rate, source: "--rate" } : halfOfBenchPeak();
  return { quick, durationMs, rate, target, replicas, outDir: values.out ?? "soak-report", verbose: values.verbose ?? false };
}

function durationOf(text: string): number {
  const ms = parseDuration(text, "--duration");
  if (ms < 2 * 60_000) throw new UsageError(`--duration: at least 2m (the P99 line compares the first and the last minute at least), not ${text}`);
  return ms;
}

/** Half of the newest benchmark's service-level peak (new keys per second, synchronous_commit=on), and which file said so. */
export function halfOfBenchPeak(dir = join(ROOT, "bench/results")): { rate: number; source: string } {
  type Bench = { startedAt?: string; commits?: Array<{ synchronousCommit: string; service?: { newKeys?: { opsPerSec: number } } }> };
  const runs = readdirSync(dir)
    .filter((file) => file.endsWith(".json"))
    .map((file) => ({ file, bench: JSON.parse(readFileSync(join(dir, file), "utf8")) as Bench }))
    .flatMap(({ file, bench }) => {
      const peak = bench.commits?.find((c) => c.synchronousCommit === "on")?.service?.newKeys?.opsPerSec;
      return peak ? [{ file, startedAt: bench.startedAt ?? "", peak }] : [];
    })
    .sort((a, b) => a.startedAt.localeCompare(b.startedAt));
  const newest = runs.at(-1);
  if (!newest) throw new UsageError(`no benchmark with a service level under synchronous_commit=on in ${dir}: run npm run bench first, or give --rate`);
  return { rate: Math.max(1, Math.round(newest.peak / 2)), source: `half of ${newest.peak.toFixed(0)} new keys/s (bench/results/${newest.file}, ${newest.startedAt})` };
}
