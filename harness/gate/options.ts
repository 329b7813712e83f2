import { parseArgs } from "node:util";
import type pg from "pg";
import type { Cluster } from "../lib/cluster.js";
import type { LoadStats } from "./load.js";
import type { ChaosEvent, RegistryFault } from "./chaos.js";
import type { Criterion } from "../lib/criterion.js";
import { parseDuration as durationOf } from "../../src/policy/document.js";
import { defaultWriter } from "./progress.js";

/**
 * Everything the launch gate can be told. `runGate` fills what is missing
 * from the full or the quick defaults (`quick: true`).
 */
export interface GateOptions {
  /** Total HTTP requests to send (retries included); the run stops starting new logical requests near it. */
  requests: number;
  /** HTTP requests in flight at most. */
  concurrency: number;
  /** Most HTTP requests sent per second (undefined: as many as `concurrency` allows); with it, the run lasts about requests / rate seconds. */
  rate: number | undefined;
  /** Width of the windows the client latency is also kept in (LoadStats.windows), in ms. */
  latencyWindowMs: number;
  /** Most copies of a logical request sent at once (each copy a client that retries on its own); at least min(2, burst). */
  burst: number;
  /** Replays of each logical request sent later, after its first answer. */
  lateReplays: number;
  /** Longest wait before a late replay, in ms (uniformly drawn). */
  lateDelayMs: number;
  /** Share of logical requests that also send the key with a different amount (true conflicts, 422 expected). */
  conflictShare: number;
  /** Share of new charges the card provider declines (402, replayed as such). */
  declineShare: number;
  /** Share of new charges the provider answers ambiguously (charges and never answers, or drops the connection): UNKNOWN records. */
  ambiguousShare: number;
  /** SIGKILLs (and restarts) of the payments service during the run. */
  serviceKills: number;
  /** Coordinator replicas on the registry; the service spreads its calls over them. */
  replicas: number;
  /** SIGKILLs (and restarts) of a coordinator replica during the run (the replicas in turn). */
  coordinatorKills: number;
  /** Replica 0 is never killed (the others take the kills in turn), so that one process lives through the whole run. */
  spareFirstReplica: boolean;
  /** The share of the run the kills are spread over ([0.1, 0.85]). */
  killSpan: [number, number];
  /** Extra environment of every coordinator replica (a policy, a sweep interval): programmatic only. */
  coordinatorEnv: Record<string, string>;
  /** Faults of the registry's database during the run (a failover, say): programmatic only. */
  registryFaults: RegistryFault[];
  /** Judge the P99 of the reservation transaction (default true); false when the run fails the registry over. */
  judgeReserveLatency: boolean;
  /** Lines the caller judges after the run, added to the gate's (programmatic only). */
  moreCriteria: (() => Promise<Criterion[]>) | undefined;
  /** Watches the run from the start of the load until its end (programmatic only): sampling, faults of its own. */
  observe: ((run: RunView) => RunObserver) | undefined;
  /** How long a killed process stays down before it is restarted, in ms. */
  downtimeMs: number;
  /** The recovery SLO: an UNKNOWN record must be settled within it, in ms. */
  recoverySloMs: number;
  /** Longest wait after the load for UNKNOWN and leased records to settle, in ms. */
  settleTimeoutMs: number;
  /** The API's latency budget, in ms. */
  latencyBudgetMs: number;
  /** Share of the budget the P99 of Reserve may use (0.05: 5 %). */
  reserveBudgetShare: number;
  /** Largest share of records allowed to stay UNKNOWN longer than the recovery SLO (0.0001: 0.01 %). */
  unknownMaxShare: number;
  /** Cap on an honored Retry-After, in ms. */
  retryAfterCapMs: number;
  /** Cap of the exponential backoff after 503, 5xx and connection errors, in ms. */
  backoffCapMs: number;
  /** Client-side timeout of one HTTP request, in ms (then the client retries). */
  clientTimeoutMs: number;
  /** A logical request whose client got no final answer for this long gives up, in ms. */
  giveUpMs: number;
  /** PostgreSQL to use (a fresh schema in it); undefined: an embedded PostgreSQL in a temporary folder. */
  databaseUrl: string | undefined;
  /** Keep the schema (or the embedded cluster's files) for inspection. */
  keep: boolean;
  /** Embedded PostgreSQL only: keep fsync and synchronous commit on (slower, closer to production). */
  durable: boolean;
  /** Folder of report.json and report.html. */
  outDir: string;
  /** The reports' title (GATE_TITLE): a scenario of its own on the gate's machinery (a failover) names its reports for itself (programmatic only). */
  title: string;
  /** Progress on stderr: true, false, or "auto" (a bar on a terminal, a line every few seconds otherwise). */
  progress: boolean | "auto";
  /** Seed of the plan's random choices (amounts, copies, conflicts, delays); timing is not reproducible. */
  seed: number;
  /** Print the child processes' output. */
  verbose: boolean;
  /** Aborts the run (Ctrl-C): processes and database are cleaned up, runGate rejects with GateAborted. */
  signal: AbortSignal | undefined;
  /** Where progress and notes go (default: stderr). */
  log: (line: string) => void;
}

export type GateInput = Partial<GateOptions> & { quick?: boolean };

/** The launch gate's own title, of its table and its reports. */
export const GATE_TITLE = "Launch gate";

/** What an observer of a run sees: the processes, the registry's pool, the progress notes. */
export interface RunView {
  cluster: Cluster;
  /** Reads the run's schema, every tenant. */
  pool: pg.Pool;
  database: { url: string; schema: string | undefined };
  /** The load's statistics, filled in as it runs. */
  stats: LoadStats;
  /** The chaos plan's events, each filled in as it runs (when it killed, how long the target was down). */
  chaos: readonly ChaosEvent[];
  note: (line: string) => void;
  signal: AbortSignal;
}

export interface RunObserver {
  /** The load has ended: stop watching. */
  stop(): Promise<void>;
}

export const FULL_DEFAULTS = {
  requests: 100_000,
  // What a 2-core machine carrying the generator, both services, the provider
  // and PostgreSQL serves within the latency line (docs/launch-gate.md, "Reading
  // the P99 line"); a deployment's gate sets the load it must carry.
  concurrency: 8,
  burst: 4,
  lateReplays: 1,
  lateDelayMs: 2_000,
  conflictShare: 0.02,
  declineShare: 0.01,
  ambiguousShare: 0.004,
  replicas: 3,
  serviceKills: 3,
  coordinatorKills: 2,
  downtimeMs: 1_000,
  recoverySloMs: 60_000,
  settleTimeoutMs: 120_000,
  latencyBudgetMs: 1_000,
  latencyWindowMs: 60_000,
  reserveBudgetShare: 0.05,
  unknownMaxShare: 0.0001,
  retryAfterCapMs: 2_000,
  backoffCapMs: 5_000,
  clientTimeoutMs: 15_000,
  giveUpMs: 180_000,
} satisfies Partial<GateOptions>;

/** `--quick`: the CI variant, about 3,000 requests and a short run. */
export const QUICK_DEFAULTS = {
  ...FULL_DEFAULTS,
  requests: 3_000,
  lateDelayMs: 1_000,
  serviceKills: 1,
  coordinatorKills: 1,
  settleTimeoutMs: 90_000,
  giveUpMs: 120_000,
} satisfies Partial<GateOptions>;

export function resolveOptions(input: GateInput): GateOptions {
  const base = input.quick ? QUICK_DEFAULTS : FULL_DEFAULTS;
  const defined = Object.fromEntries(Object.entries(input).filter(([, v]) => v !== undefined)) as Partial<GateOptions>;
  const options: GateOptions = {
    ...base,
    databaseUrl: undefined,
    rate: undefined,
    spareFirstReplica: false,
    killSpan: [0.1, 0.85],
    coordinatorEnv: {},
    registryFaults: [],
    judgeReserveLatency: true,
    moreCriteria: undefined,
    observe: undefined,
    keep: false,
    durable: false,
    outDir: "gate-report",
    title: GATE_TITLE,
    progress: "auto",
    seed: Math.floor(Math.random() * 2 ** 31),
    verbose: false,
    signal: undefined,
    log: defaultWriter,
    ...defined,
  };
  validate(options);
  return options;
}

export class UsageError extends Error {
  override readonly name = "UsageError";
}

/** The options whose values are numbers. */
type NumberOption = { [K in keyof GateOptions]-?: GateOptions[K] extends number ? K : never }[keyof GateOptions];

function validate(o: GateOptions): void {
  const problems: string[] = [];
  const int = (name: NumberOption, min: number, max = Number.MAX_SAFE_INTEGER) => {
    const v = o[name];
    if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) problems.push(`${name} must be an integer from ${min} to ${max} (got ${String(v)})`);
  };
  const share = (name: NumberOption) => {
    const v = o[name];
    if (typeof v !== "number" || !(v >= 0 && v <= 1)) problems.push(`${name} must be a share from 0 to 1 (got ${String(v)})`);
  };
  int("requests", 10);
  int("concurrency", 1, 4096);
  int("burst", 1, 64);
  int("lateReplays", 0, 16);
  int("lateDelayMs", 0);
  share("conflictShare");
  share("declineShare");
  share("ambiguousShare");
  int("serviceKills", 0, 100);
  int("replicas", 1, 16);
  int("coordinatorKills", 0, 100);
  if (o.spareFirstReplica && o.coordinatorKills > 0 && o.replicas < 2) problems.push("spareFirstReplica needs at least 2 replicas when coordinators are killed");
  if (o.rate !== undefined && !(o.rate > 0)) problems.push(`rate must be a positive number of requests per second (got ${String(o.rate)})`);
  int("latencyWindowMs", 1_000);
  if (!(o.killSpan[0] >= 0 && o.killSpan[0] < o.killSpan[1] && o.killSpan[1] <= 1))
    problems.push(`killSpan must be two shares, the first below the second (got ${o.killSpan.join(", ")})`);
  int("downtimeMs", 0);
  int("recoverySloMs", 1);
  int("settleTimeoutMs", 0);
  int("latencyBudgetMs", 1);
  share("reserveBudgetShare");
  share("unknownMaxShare");
  int("retryAfterCapMs", 0);
  int("backoffCapMs", 1);
  int("clientTimeoutMs", 1);
  int("giveUpMs", 1);
  int("seed", 0, 2 ** 31);
  if (problems.length > 0) throw new UsageError(problems.join("\n"));
}

export const USAGE = `usage: npm run gate -- [options]

The launch gate (docs/contract.md, "Launch gate"): drives HTTP requests with concurrent and late
replays and conflicting payloads through the payments example and the coordinator's replicas,
SIGKILLs and restarts the service and the replicas during the run, then reads the
database and the card provider and prints the gate's table. Exit code 0 when every line
passes, 1 when one fails (or the run could not be completed), 2 on bad usage.

PostgreSQL: DATABASE_URL if set (in a fresh schema, dropped at the end unless --keep),
otherwise an embedded PostgreSQL in a temporary folder (removed at the end).

load
  --quick                   the CI variant: ${QUICK_DEFAULTS.requests} requests, ${QUICK_DEFAULTS.serviceKills} service kill, ${QUICK_DEFAULTS.coordinatorKills} coordinator kill
  --replicas N              coordinator replicas the service spreads its calls over (${FULL_DEFAULTS.replicas})
  --requests N              HTTP requests in all, retries included (${FULL_DEFAULTS.requests})
  --concurrency N           requests in flight (${FULL_DEFAULTS.concurrency})
  --burst N                 most copies of one logical request sent at once (${FULL_DEFAULTS.burst})
  --late-replays N          replays of each logical request after its answer (${FULL_DEFAULTS.lateReplays})
  --late-delay DURATION     longest wait before a late replay (${FULL_DEFAULTS.lateDelayMs}ms)
  --conflict-share F        share of keys also sent with another amount (${FULL_DEFAULTS.conflictShare})
  --decline-share F         share of new charges the provider declines (${FULL_DEFAULTS.declineShare})
  --ambiguous-share F       share of new charges answered ambiguously: UNKNOWN records (${FULL_DEFAULTS.ambiguousShare})
  --retry-after-cap DURATION  cap on an honored Retry-After (${FULL_DEFAULTS.retryAfterCapMs}ms)
  --backoff-cap DURATION    cap of the exponential backoff after 503, 5xx, connection errors (${FULL_DEFAULTS.backoffCapMs}ms)
  --client-timeout DURATION   client timeout of one request (${FULL_DEFAULTS.clientTimeoutMs}ms)
  --give-up DURATION        a client without a final answer for this long gives up (${FULL_DEFAULTS.giveUpMs}ms)
  --seed N                  seed of the plan's random choices

chaos
  --service-kills N         SIGKILL + restart of the payments service (${FULL_DEFAULTS.serviceKills}; quick ${QUICK_DEFAULTS.serviceKills})
  --coordinator-kills N     SIGKILL + restart of a coordinator replica, in turn (${FULL_DEFAULTS.coordinatorKills}; quick ${QUICK_DEFAULTS.coordinatorKills})
  --downtime DURATION       how long a killed process stays down (${FULL_DEFAULTS.downtimeMs}ms)

criteria
  --recovery-slo DURATION   an UNKNOWN record must be settled within it (${FULL_DEFAULTS.recoverySloMs / 1000}s)
  --settle-timeout DURATION longest wait for UNKNOWN records to settle after the load (${FULL_DEFAULTS.settleTimeoutMs / 1000}s)
  --latency-budget-ms N     the API's latency budget (${FULL_DEFAULTS.latencyBudgetMs})
  --reserve-budget-share F  share of the budget the P99 of Reserve may use (${FULL_DEFAULTS.reserveBudgetShare})
  --unknown-max-share F     share of records allowed UNKNOWN beyond the SLO (${FULL_DEFAULTS.unknownMaxShare})

output and environment
  --out DIR                 where report.json and report.html go (gate-report)
  --keep                    keep the schema (or the embedded cluster's files)
  --durable                 embedded PostgreSQL with fsync and synchronous commit on
  --no-progress             no progress on stderr
  --verbose                 print the processes' output
  --help                    this text

DURATION: as everywhere in this project (policies, idemctl, bench): 1500ms, 2s, 1m, 1h; or a
whole number of milliseconds.`;

/** The project's durations (`1500ms`, `2s`, `1m`, `1h`, as in policies and idemctl), or a whole number of milliseconds. */
export function parseDuration(text: string, flag: string): number {
  const trimmed = text.trim();
  const ms = durationOf(trimmed) ?? (/^\d+$/.test(trimmed) ? Number(trimmed) : undefined);
  if (ms === undefined) throw new UsageError(`${flag}: not a duration: ${text} (e.g. 500ms, 2s, 1m)`);
  return ms;
}

function parseNumber(text: string, flag: string, integer: boolean): number {
  const value = Number(text.replaceAll("_", ""));
  if (text.trim() === "" || !Number.isFinite(value) || (integer && !Number.isInteger(value))) {
    throw new UsageError(`${flag}: not ${integer ? "an integer" : "a number"}: ${text}`);
  }
  return value;
}

/** The CLI's options; `help` when --help was given. Throws UsageError. */
export function parseCli(argv: string[], env: NodeJS.ProcessEnv = process.env): { help: boolean; input: GateInput } {
  let parsed: ReturnType<typeof parseArgs<{ options: typeof CLI_OPTIONS; allowPositionals: false; strict: true }>>;
  try {
    parsed = parseArgs({ args: argv, options: CLI_OPTIONS, allowPositionals: false, strict: true });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  const v = parsed.values;
  if (v.help) return { help: true, input: {} };
  const input: GateInput = { quick: v.quick ?? false, databaseUrl: env.DATABASE_URL || undefined };
  const int = (value: string | undefined, flag: string) => (value === undefined ? undefined : parseNumber(value, flag, true));
  const num = (value: string | undefined, flag: string) => (value === undefined ? undefined : parseNumber(value, flag, false));
  const dur = (value: string | undefined, flag: string) => (value === undefined ? undefined : parseDuration(value, flag));
  Object.assign(input, {
    requests: int(v.requests, "--requests"),
    concurrency: int(v.concurrency, "--concurrency"),
    burst: int(v.burst, "--burst"),
    lateReplays: int(v["late-replays"], "--late-replays"),
    lateDelayMs: dur(v["late-delay"], "--late-delay"),
    conflictShare: num(v["conflict-share"], "--conflict-share"),
    declineShare: num(v["decline-share"], "--decline-share"),
    ambiguousShare: num(v["ambiguous-share"], "--ambiguous-share"),
    retryAfterCapMs: dur(v["retry-after-cap"], "--retry-after-cap"),
    backoffCapMs: dur(v["backoff-cap"], "--backoff-cap"),
    clientTimeoutMs: dur(v["client-timeout"], "--client-timeout"),
    giveUpMs: dur(v["give-up"], "--give-up"),
    seed: int(v.seed, "--seed"),
    replicas: int(v.replicas, "--replicas"),
    serviceKills: int(v["service-kills"], "--service-kills"),
    coordinatorKills: int(v["coordinator-kills"], "--coordinator-kills"),
    downtimeMs: dur(v.downtime, "--downtime"),
    recoverySloMs: dur(v["recovery-slo"], "--recovery-slo"),
    settleTimeoutMs: dur(v["settle-timeout"], "--settle-timeout"),
    latencyBudgetMs: int(v["latency-budget-ms"], "--latency-budget-ms"),
    reserveBudgetShare: num(v["reserve-budget-share"], "--reserve-budget-share"),
    unknownMaxShare: num(v["unknown-max-share"], "--unknown-max-share"),
    outDir: v.out,
    keep: v.keep,
    durable: v.durable,
    progress: v["no-progress"] ? false : "auto",
    verbose: v.verbose,
  } satisfies GateInput);
  return { help: false, input };
}

const CLI_OPTIONS = {
  quick: { type: "boolean" },
  requests: { type: "string" },
  concurrency: { type: "string" },
  burst: { type: "string" },
  "late-replays": { type: "string" },
  "late-delay": { type: "string" },
  "conflict-share": { type: "string" },
  "decline-share": { type: "string" },
  "ambiguous-share": { type: "string" },
  "retry-after-cap": { type: "string" },
  "backoff-cap": { type: "string" },
  "client-timeout": { type: "string" },
  "give-up": { type: "string" },
  seed: { type: "string" },
  replicas: { type: "string" },
  "service-kills": { type: "string" },
  "coordinator-kills": { type: "string" },
  downtime: { type: "string" },
  "recovery-slo": { type: "string" },
  "settle-timeout": { type: "string" },
  "latency-budget-ms": { type: "string" },
  "reserve-budget-share": { type: "string" },
  "unknown-max-share": { type: "string" },
  out: { type: "string" },
  keep: { type: "boolean" },
  durable: { type: "boolean" },
  "no-progress": { type: "boolean" },
  verbose: { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const;
