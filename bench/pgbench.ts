/**
 * The pgbench baseline: the coordinator's SQL (bench/sql.ts) driven by
 * pgbench at the same concurrency or arrival rate, its per-transaction log
 * read back and counted exactly like the coordinator's operations
 * (bench/load.ts).
 */
import { execFile } from "node:child_process";
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import type { Sample } from "./load.js";
import { runVariables } from "./sql.js";
import { runChild, type Child } from "../harness/lib/process.js";

const execFileAsync = promisify(execFile);

export interface Pgbench {
  path: string;
  version: string;
}

/**
 * pgbench from $PGBENCH, then PATH, then /usr/lib/postgresql/<major>/bin
 * (newest first); the first one that answers `--version`.
 */
export async function findPgbench(): Promise<Pgbench | undefined> {
  const candidates: string[] = [];
  if (process.env.PGBENCH) candidates.push(process.env.PGBENCH);
  for (const dir of (process.env.PATH ?? "").split(":").filter(Boolean)) candidates.push(join(dir, "pgbench"));
  const majors = await readdir("/usr/lib/postgresql").catch(() => [] as string[]);
  for (const major of majors.filter((m) => /^\d+$/.test(m)).sort((a, b) => Number(b) - Number(a))) {
    candidates.push(`/usr/lib/postgresql/${major}/bin/pgbench`);
  }
  for (const path of candidates) {
    try {
      const { stdout } = await execFileAsync(path, ["--version"], { timeout: 10_000 });
      return { path, version: stdout.trim() };
    } catch {
      // not there, or not runnable: try the next
    }
  }
  return undefined;
}

/** libpq's environment for a postgres:// URL (the password never appears on a command line). */
export function libpqEnvironment(url: string): Record<string, string> {
  const u = new URL(url);
  return {
    PGHOST: u.hostname,
    PGPORT: u.port || "5432",
    PGUSER: decodeURIComponent(u.username),
    PGPASSWORD: decodeURIComponent(u.password),
    PGDATABASE: decodeURIComponent(u.pathname.replace(/^\//, "")),
    ...(u.searchParams.get("sslmode") ? { PGSSLMODE: u.searchParams.get("sslmode")! } : {}),
  };
}

/** How pgbench reaches the database: as the login of the URL, acting as `role` when given (as the coordinator does). */
export interface PgbenchTarget {
  bin: string;
  databaseUrl: string;
  role?: string;
}

function environmentFor(target: PgbenchTarget): NodeJS.ProcessEnv {
  return {
    ...process.env,
    ...libpqEnvironment(target.databaseUrl),
    ...(target.role ? { PGOPTIONS: `-c role=${target.role}` } : {}),
  };
}

export interface PgbenchRun extends PgbenchTarget {
  scriptFile: string;
  variables: Record<string, string>;
  clients: number;
  /** Open model: transactions per second over all clients (--rate). */
  rate?: number;
  warmupMs: number;
  measureMs: number;
  /** Folder for the per-transaction logs (one file per thread). */
  logDir: string;
  logPrefix: string;
  /** Told about the child so that Ctrl-C can stop it. */
  onChild?: (child: Child | undefined) => void;
}

export interface PgbenchResult extends Sample {
  /** The command, for the report (no secrets: the connection is in the environment). */
  command: string;
  exitCode: number | null;
  /** pgbench's own summary lines (tps, latency average, failures). */
  summary: string[];
}

/**
 * pgbench's -T clock starts before its clients connect (64 SCRAM logins take
 * about a second here): it runs this much longer, so that the window after
 * the warm-up is as long as the other sides'.
 */
const connectSlackSec = (clients: number) => (clients <= 8 ? 1 : 2);

/** Runs pgbench for warm-up + measurement (whole seconds) and counts its log like bench/load.ts counts operations. */
export async function runPgbench(run: PgbenchRun): Promise<PgbenchResult> {
  const seconds = Math.ceil((run.warmupMs + run.measureMs) / 1000) + connectSlackSec(run.clients);
  const args = [
    "-n", // no vacuum of pgbench's own tables (there are none)
    "-M",
    "prepared", // each statement parsed once per connection, its values bound as parameters, as the coordinator's
    "-c",
    String(run.clients),
    "-j",
    String(Math.min(2, run.clients)),
    "-T",
    String(seconds),
    ...(run.rate !== undefined ? ["-R", run.rate.toFixed(2)] : []),
    "-f",
    run.scriptFile,
    "--log",
    `--log-prefix=${join(run.logDir, run.logPrefix)}`,
    ...Object.entries(runVariables(run.variables)).flatMap(([name, value]) => ["-D", `${name}=${value}`]),
  ];
  const shown = args.filter((a, i) => a !== "-D" && args[i - 1] !== "-D");
  const command = ["pgbench", ...shown.map((a) => (a === run.scriptFile ? "reserve-complete.sql" : a.startsWith("--log-prefix") ? "--log-prefix=…" : a)), "-D name=value…"].join(
    " ",
  );
  const { code, output } = await runChild({
    command: run.bin,
    args,
    env: environmentFor(run),
    // Its own process group: Ctrl-C is handled by the benchmark, which stops it.
    detached: true,
    keep: 20_000,
    ...(run.onChild ? { onStart: run.onChild } : {}),
  });
  run.onChild?.(undefined);
  const sample = await readLogs(run.logDir, run.logPrefix, run.warmupMs, run.measureMs);
  const summary = output
    .split("\n")
    .filter((line) => /^(tps|latency average|number of failed|number of transactions actually|initial connection time)/.test(line.trim()) || /abort|error|FATAL/i.test(line))
    .map((line) => line.trim())
    .slice(0, 20);
  if (code !== 0) {
    sample.errors = Math.max(sample.errors, 1);
    sample.firstError ??= `pgbench exited with ${code}: ${output.trim().split("\n").slice(-3).join(" | ")}`;
  }
  return { ...sample, command, exitCode: code, summary };
}

/**
 * The per-transaction logs (`client transaction time_us script epoch us [lag]`):
 * `time` is from the transaction's scheduled start, so under --rate it
 * includes the schedule lag. The window starts `warmupMs` after the first
 * transaction started (all of a thread's clients are connected by then).
 */
async function readLogs(dir: string, prefix: string, warmupMs: number, measureMs: number): Promise<Sample> {
  const files = (await readdir(dir)).filter((f) => f.startsWith(`${prefix}.`));
  const done: Array<{ at: number; latency: number }> = [];
  let errors = 0;
  let firstError: string | undefined;
  for (const file of files) {
    for (const line of (await readFile(join(dir, file), "utf8")).split("\n")) {
      const fields = line.trim().split(/\s+/);
      if (fields.length < 6) continue;
      const at = Number(fields[4]) * 1000 + Number(fields[5]) / 1000;
      const time = fields[2]!;
      if (!/^\d+$/.test(time)) {
        errors++;
        firstError ??= `a transaction ${time}`;
        continue;
      }
      done.push({ at, latency: Number(time) / 1000 });
    }
  }
  let first = Number.POSITIVE_INFINITY;
  let last = Number.NEGATIVE_INFINITY;
  for (const d of done) {
    first = Math.min(first, d.at - d.latency);
    last = Math.max(last, d.at);
  }
  const from = first + warmupMs;
  // Cut short if pgbench stopped before the window ended (slow connections), so that the rate stays right.
  const to = Math.min(from + measureMs, last);
  const inside = done.filter((d) => d.at >= from && d.at <= to);
  return { latencies: inside.map((d) => d.latency), parts: [], errors, ...(firstError ? { firstError } : {}), windowMs: Math.max(0, to - from) };
}

/** Runs the script a fixed number of times on one connection (checks and round-trip counts); no log. */
export async function runPgbenchTransactions(
  target: PgbenchTarget,
  scriptFile: string,
  variables: Record<string, string>,
  transactions: number,
  onChild?: (child: Child | undefined) => void,
): Promise<{ ok: boolean; output: string }> {
  const args = [
    "-n",
    "-M",
    "prepared",
    "-c",
    "1",
    "-j",
    "1",
    "-t",
    String(transactions),
    "-f",
    scriptFile,
    ...Object.entries(runVariables(variables)).flatMap(([name, value]) => ["-D", `${name}=${value}`]),
  ];
  try {
    const { code, output } = await runChild({ command: target.bin, args, env: environmentFor(target), detached: true, keep: 20_000, ...(onChild ? { onStart: onChild } : {}) });
    // A failed statement aborts the client, and pgbench then exits with 2.
    return { ok: code === 0 && !/aborted|error/i.test(output), output };
  } catch (error) {
    return { ok: false, output: (error as Error).message };
  } finally {
    onChild?.(undefined);
  }
}
