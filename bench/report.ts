/**
 * The result of a run (also its JSON file) and how it is printed: an aligned
 * table for the terminal, or Markdown for docs/benchmark.md.
 */
import type { Summary } from "./load.js";
import { comparedWal, writePathBreakdown, writePathTable, type WritePath } from "./write-path.js";

export interface Row {
  mode: "closed" | "open";
  /** Closed loop: concurrent callers. Open model: callers the arrivals are spread over (most in flight). */
  concurrency: number;
  /** Open model: the arrival rate asked for, and which fraction of the best closed-loop coordinator throughput it is. */
  offeredPerSec?: number;
  fraction?: number;
  coordinator: Summary;
  /** null when pgbench is not installed or its run failed before measuring. */
  pgbench: Summary | null;
  noop: Summary;
  /** At concurrency 1: the pair through a bare relay (bench/relay.ts), the floor of the coordinator's latency. */
  relay?: Summary;
  ratios: {
    /** coordinator ops/s ÷ pgbench ops/s (1 = as fast as the bare SQL). */
    throughputVsPgbench: number | null;
    /** coordinator P99 ÷ pgbench P99 (1 = no added tail latency). */
    p99VsPgbench: number | null;
    throughputVsNoop: number;
    p99VsNoop: number;
  };
}

export interface StatementShare {
  /** The step of an operation (reserve, begin, lock, attempts, finish, commit) or the statement's text. */
  statement: string;
  perCall: number;
  /** Mean execution time in the database, ms. */
  meanMs: number;
}

/** What one RPC (or one pgbench transaction) costs in the database, means over the counted calls. */
export interface RpcCost {
  calls: number;
  /** Round trips on the wire (Query + Sync messages) per call. */
  roundTrips?: number;
  /** Top-level statements per call (pg_stat_statements). */
  statements?: number;
  /** Execution time of those statements per call, ms. */
  databaseMs?: number;
  statementList?: StatementShare[];
  /** As the client saw it, sequential calls (concurrency 1), ms. */
  clientMs: number;
  /** Inside the server: the coordinator's own RPC timer (idem_rpc_duration_seconds), ms. */
  handlerMs?: number;
}

export interface RoundTrips {
  available: boolean;
  method?: string;
  reason?: string;
  wireNote?: string;
  reserve?: RpcCost;
  complete?: RpcCost;
  /** The pgbench transaction (Reserve's and Complete's SQL); null when pgbench did not run. */
  pgbench?: (Omit<RpcCost, "calls" | "clientMs" | "handlerMs"> & { sameStatements?: boolean }) | null;
}

/** The machine a run was measured on; load averages over 1, 5 and 15 minutes (os.loadavg()). */
export interface Machine {
  cpus: number;
  cpuModel: string;
  memoryGb: number;
  os: string;
  node: string;
  loadAverageBefore: number[];
  loadAverageAfter: number[];
}

/** One workload of the service level: the summary of its requests, with what each cost the coordinator. */
export interface ServicePhase extends Summary {
  /** Requests answered during the whole phase (warm-up included): what the calls are divided by. */
  requests: number;
  /** Coordinator calls per request, by method (from its /metrics); undefined when not measurable. */
  callsPerRequest?: Record<string, number>;
}

/** The service level: the same Express handler alone and behind the gateway SDK, side by side. */
export interface ServiceLevel {
  /** Concurrent HTTP clients (closed loop), one user each. */
  clients: number;
  description: string;
  environment: Record<string, string>;
  /** (a) the handler without idempotency, new requests. */
  plain: ServicePhase;
  /** (b) the SDK, a fresh Idempotency-Key per request. */
  newKeys: ServicePhase;
  /** (c) the SDK, keys completed earlier, the same body, the gateway's answer cache off. */
  replays: ServicePhase;
  /** (c') the same with the answer cache on (absent from runs made before it). */
  replaysCached?: ServicePhase;
  /** (d) the SDK in co-located mode (no RPC), new keys and replays; absent in runs before it was measured. */
  colocatedNewKeys?: ServicePhase;
  colocatedReplays?: ServicePhase;
  ratios: {
    /** (b) ÷ (a) ops/s. */
    newVsPlain: number | null;
    /** (c) ÷ (a) ops/s. */
    replaysVsPlain: number | null;
    /** (c') ÷ (a) ops/s. */
    replaysCachedVsPlain?: number | null;
    /** P99 (b) ÷ P99 (a). */
    p99NewVsPlain: number | null;
    /** (d) new keys ÷ (a) ops/s, (d) replays ÷ (a) ops/s, P99 (d) new keys ÷ P99 (a). */
    colocatedNewVsPlain?: number | null;
    colocatedReplaysVsPlain?: number | null;
    p99ColocatedNewVsPlain?: number | null;
  };
}

/** Everything measured under one `synchronous_commit` setting. */
export interface CommitRun {
  /** As a new connection to the database saw it during this part of the run. */
  synchronousCommit: string;
  /** The coordinator level (empty when not run). */
  rows: Row[];
  /** The service level (null when not run). */
  service: ServiceLevel | null;
  /** The database level (absent when not run). */
  writePath?: WritePath;
}

export interface BenchResult {
  benchmark: "idempotency-coordinator";
  /** 2: one part per commit setting (`commits`); 1: one run of the coordinator level (`rows`). */
  version: 1 | 2;
  /** Which levels ran (version 2). */
  level?: "coordinator" | "service" | "database" | "all";
  startedAt: string;
  finishedAt: string;
  durationSec: number;
  command: string;
  options: Record<string, unknown>;
  machine: Machine;
  database: { embedded: boolean; version: string; settings: Record<string, string>; pgStatStatements: boolean };
  server: { mode: string; environment: Record<string, string> };
  loadGenerator: { description: string; protocol: string; connections: number; noop: string; openModel: string };
  pgbench: { path: string; version: string; command?: string; tenantBinding?: boolean; role?: string } | { skipped: string };
  /** Version 2: one part per commit setting, in the order they ran. */
  commits?: CommitRun[];
  /** Version 1: the coordinator level, under the database's one setting. */
  rows?: Row[];
  roundTrips: RoundTrips;
  notes: string[];
}

/** The parts of a result, one per commit setting, whichever version it was saved as. */
export function commitRuns(result: BenchResult): CommitRun[] {
  return result.commits ?? [{ synchronousCommit: result.database.settings.synchronous_commit ?? "?", rows: result.rows ?? [], service: null }];
}

const ms = (v: number | undefined) => (v === undefined || Number.isNaN(v) ? "-" : v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0));
const rate = (v: number | undefined) => (v === undefined || Number.isNaN(v) ? "-" : v.toFixed(0));
const ratio = (v: number | null | undefined) => (v === null || v === undefined || !Number.isFinite(v) ? "-" : v.toFixed(2));

const HEADERS = [
  "mode",
  "conc",
  "offered/s",
  "coord ops/s",
  "p50 ms",
  "p99 ms",
  "pgbench ops/s",
  "p50 ms",
  "p99 ms",
  "no-op ops/s",
  "p50 ms",
  "p99 ms",
  "c/pgb ops",
  "c/pgb p99",
  "c/no-op ops",
  "c/no-op p99",
];

function cells(row: Row): string[] {
  const mode = row.mode === "closed" ? "closed" : `open ${Math.round((row.fraction ?? 0) * 100)}%`;
  const s = (x: Summary | null) => [rate(x?.opsPerSec), ms(x?.p50Ms), ms(x?.p99Ms)];
  return [
    mode,
    row.mode === "open" ? `≤${row.concurrency}` : String(row.concurrency),
    row.offeredPerSec ? rate(row.offeredPerSec) : "-",
    ...s(row.coordinator),
    ...s(row.pgbench),
    ...s(row.noop),
    ratio(row.ratios.throughputVsPgbench),
    ratio(row.ratios.p99VsPgbench),
    ratio(row.ratios.throughputVsNoop),
    ratio(row.ratios.p99VsNoop),
  ];
}

/** Columns aligned (text left, numbers right), with a rule under the header. */
export function aligned(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (r: string[]) =>
    r
      .map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!)))
      .join("  ")
      .trimEnd();
  return [line(headers), widths.map((w) => "-".repeat(w)).join("  "), ...rows.map(line)].join("\n");
}

function markdownTable(headers: string[], rows: string[][]): string {
  const line = (r: string[]) => `| ${r.join(" | ")} |`;
  return [line(headers), `|${headers.map((_, i) => (i === 0 ? "---" : "---:")).join("|")}|`, ...rows.map(line)].join("\n");
}

const CPU_HEADERS = ["mode", "conc", "coord: server", "postgres", "client", "pgbench: postgres", "pgbench", "no-op: server", "client", "max total"];

/** Cores busy on average during each phase, by process (a sum near the core count: the phase was CPU-bound). */
function cpuCells(row: Row): string[] | undefined {
  const c = row.coordinator.cpu;
  const p = row.pgbench?.cpu;
  const n = row.noop.cpu;
  if (!c && !p && !n) return undefined;
  const f = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(2));
  const sum = (u: typeof c) => (u ? (u.coordinator ?? 0) + (u.postgres ?? 0) + u.client : 0);
  return [
    row.mode === "closed" ? "closed" : `open ${Math.round((row.fraction ?? 0) * 100)}%`,
    row.mode === "open" ? `≤${row.concurrency}` : String(row.concurrency),
    f(c?.coordinator),
    f(c?.postgres),
    f(c?.client),
    f(p?.postgres),
    f(p?.client),
    f(n?.coordinator),
    f(n?.client),
    Math.max(sum(c), sum(p), sum(n)).toFixed(2),
  ];
}

function cpuRows(rows: Row[]): string[][] {
  return rows.map(cpuCells).filter((r): r is string[] => r !== undefined);
}

const CPU_PER_OP_HEADERS = ["mode", "conc", "coord: server", "postgres", "client", "pgbench: postgres", "pgbench", "no-op: server", "client"];

/** CPU ms per operation: cores busy over the phase ÷ operations per second. */
const cpuMsPerOp = (cores: number | undefined, s: Summary | null) => (cores === undefined || !s || s.opsPerSec <= 0 ? undefined : (cores * 1000) / s.opsPerSec);
const perOp = (cores: number | undefined, s: Summary | null) => cpuMsPerOp(cores, s)?.toFixed(2) ?? "-";

function cpuPerOpRows(rows: Row[]): string[][] {
  const per = perOp;
  return rows
    .filter((row) => row.coordinator.cpu || row.noop.cpu)
    .map((row) => [
      row.mode === "closed" ? "closed" : `open ${Math.round((row.fraction ?? 0) * 100)}%`,
      row.mode === "open" ? `≤${row.concurrency}` : String(row.concurrency),
      per(row.coordinator.cpu?.coordinator, row.coordinator),
      per(row.coordinator.cpu?.postgres, row.coordinator),
      per(row.coordinator.cpu?.client, row.coordinator),
      per(row.pgbench?.cpu?.postgres, row.pgbench),
      per(row.pgbench?.cpu?.client, row.pgbench),
      per(row.noop.cpu?.coordinator, row.noop),
      per(row.noop.cpu?.client, row.noop),
    ]);
}

function errorLines(run: CommitRun): string[] {
  const lines: string[] = [];
  for (const row of run.rows) {
    const label = row.mode === "closed" ? `closed c=${row.concurrency}` : `open ${Math.round((row.fraction ?? 0) * 100)}%`;
    for (const [side, s] of [
      ["coordinator", row.coordinator],
      ["pgbench", row.pgbench],
      ["no-op", row.noop],
    ] as const) {
      if (s && s.errors > 0) lines.push(`${label} ${side}: ${s.errors} failed (${s.firstError ?? "?"})`);
    }
  }
  if (run.service) {
    for (const [name, s] of serviceSides(run.service)) {
      if (s.errors > 0) lines.push(`service ${name}: ${s.errors} failed (${s.firstError ?? "?"})`);
    }
  }
  return lines.map((l) => `synchronous_commit=${run.synchronousCommit}: ${l}`);
}

const n2 = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(2));

/** The order a transaction sends its statements in: BEGIN, the tenant binding, the registry's statements, COMMIT; anything else after BEGIN. */
export function statementRank(name: string): number {
  return ["begin", "bind", "reserve", "count", "lock", "attempts", "finish", "commit"].indexOf(name) + 1 || 2;
}

function roundTripLines(rt: RoundTrips): string[] {
  if (!rt.available || !rt.reserve || !rt.complete) return [`round trips: unavailable (${rt.reason ?? "not measured"})`];
  const one = (name: string, c: RpcCost | NonNullable<RoundTrips["pgbench"]>) => {
    const list = (c.statementList ?? []).map((s) => `${s.statement} ${s.perCall.toFixed(2)}`).join(", ");
    const times = "clientMs" in c ? `; client ${c.clientMs.toFixed(2)} ms${c.handlerMs !== undefined ? `, in the server ${c.handlerMs.toFixed(2)} ms` : ""}` : "";
    return [
      `  ${name.padEnd(9)} ${n2(c.roundTrips)} round trips, ${n2(c.statements)} statements, database execution ${c.databaseMs === undefined ? "-" : c.databaseMs.toFixed(3)} ms${times}`,
      ...(list ? [`            ${list}`] : []),
    ];
  };
  return [
    `database round trips per RPC (${rt.method}):`,
    ...one("Reserve", rt.reserve),
    ...one("Complete", rt.complete),
    ...(rt.pgbench
      ? [
          ...one("pgbench", rt.pgbench),
          ...(rt.pgbench.sameStatements === undefined
            ? []
            : [
                `  pgbench ran ${rt.pgbench.sameStatements ? "the same statements as" : "NOT the same statements as"} Reserve + Complete ` +
                  "(BEGIN and COMMIT aside: pg_stat_statements counts those pgbench prepares once per prepare; the round trips show them)",
              ]),
        ]
      : []),
    ...(rt.reason ? [`  ${rt.reason}`] : []),
    ...(rt.wireNote ? [`  ${rt.wireNote}`] : []),
  ];
}

function factLines(result: BenchResult): string[] {
  const m = result.machine;
  const settings = result.database.settings;
  return [
    `machine: ${m.cpus} × ${m.cpuModel}, ${m.memoryGb} GB, ${m.os}; load average ${m.loadAverageBefore.map((n) => n.toFixed(2)).join(" ")} before, ${m.loadAverageAfter.map((n) => n.toFixed(2)).join(" ")} after`,
    `node ${m.node}; ${result.database.version.split(" on ")[0]} (${result.database.embedded ? "embedded, dedicated to this run" : "--database-url"}); ${
      "version" in result.pgbench
        ? `${result.pgbench.version}${result.pgbench.tenantBinding ? ", transactions bound to the tenant" : ""}${result.pgbench.role ? `, as role ${result.pgbench.role}` : ""}`
        : `pgbench skipped: ${result.pgbench.skipped}`
    }`,
    `database: fsync=${settings.fsync} synchronous_commit=${
      result.commits ? `${result.commits.map((c) => c.synchronousCommit).join(", then ")} (set for the database, one part of the run each)` : settings.synchronous_commit
    } shared_buffers=${settings.shared_buffers} max_connections=${settings.max_connections} (the same server and settings for every side)`,
    ...(result.server.mode === "none"
      ? []
      : [
          `coordinator: ${result.server.mode === "process" ? "separate process (node --import tsx src/main.ts)" : "in the benchmark's process"}, registry pool ${result.server.environment.IDEM_DB_POOL_MAX} connections; load generator: ${result.loadGenerator.description}`,
        ]),
  ];
}

const serviceSides = (service: ServiceLevel): Array<[string, ServicePhase]> => [
  ["(a) handler alone", service.plain],
  ["(b) SDK, new keys", service.newKeys],
  ["(c) SDK, replays", service.replays],
  ...(service.replaysCached ? [["(c') SDK, replays, answer cache on", service.replaysCached] as [string, ServicePhase]] : []),
  ...(service.colocatedNewKeys ? [["(d) co-located, new keys", service.colocatedNewKeys] as [string, ServicePhase]] : []),
  ...(service.colocatedReplays ? [["(d) co-located, replays", service.colocatedReplays] as [string, ServicePhase]] : []),
];

const SERVICE_HEADERS = [
  "workload",
  "ops/s",
  "p50 ms",
  "p99 ms",
  "ops ÷ (a)",
  "p99 ÷ (a)",
  "calls/req",
  "Batch/req",
  "CPU ms/req: load gen",
  "service",
  "coordinator",
  "postgres",
  "errors",
];

function serviceRows(service: ServiceLevel): string[][] {
  return serviceSides(service).map(([name, s]) => {
    const calls = s.callsPerRequest;
    // Calls are what the SDK asked for (each unary RPC, or each call carried in a Batch RPC); Batch RPCs are counted apart.
    const rpcs = calls ? Object.entries(calls).reduce((a, [method, n]) => (method === "Batch" ? a : a + n), 0) : undefined;
    return [
      name,
      rate(s.opsPerSec),
      ms(s.p50Ms),
      ms(s.p99Ms),
      ratio(service.plain.opsPerSec > 0 ? s.opsPerSec / service.plain.opsPerSec : null),
      ratio(service.plain.p99Ms > 0 ? s.p99Ms / service.plain.p99Ms : null),
      rpcs === undefined ? "-" : rpcs.toFixed(2),
      calls ? (calls.Batch ?? 0).toFixed(2) : "-",
      perOp(s.cpu?.client, s),
      perOp(s.cpu?.service, s),
      perOp(s.cpu?.coordinator, s),
      perOp(s.cpu?.postgres, s),
      String(s.errors),
    ];
  });
}

/** Calls per request by method, for the line under the service table. */
function callLines(service: ServiceLevel): string[] {
  return serviceSides(service)
    .filter(([, s]) => s.callsPerRequest)
    .map(
      ([name, s]) =>
        `  ${name}: ${
          Object.entries(s.callsPerRequest!)
            .map(([method, n]) => `${method} ${n.toFixed(2)}`)
            .join(", ") || "no coordinator calls"
        } per request (${s.requests} requests)`,
    );
}

/** The throughput goals, judged from this run's figures: PASS, FAIL, or n/a when not measured. */
export function goalLines(run: CommitRun): string[] {
  const verdict = (value: number | null | undefined, ok: (v: number) => boolean) =>
    value === null || value === undefined || !Number.isFinite(value) ? "n/a " : ok(value) ? "PASS" : "FAIL";
  const lines: string[] = [];
  if (run.rows.length) {
    const closed = (c: number) => run.rows.find((r) => r.mode === "closed" && r.concurrency === c)?.ratios.throughputVsPgbench;
    const open50 = run.rows.find((r) => r.mode === "open" && r.fraction === 0.5)?.ratios.p99VsPgbench;
    lines.push(
      `${verdict(closed(64), (v) => v >= 1)}  coordinator: Reserve+Complete ops/s ≥ 1.0× pgbench's at concurrency 64 (${ratio(closed(64))}×)`,
      `${verdict(closed(16), (v) => v >= 0.5)}  coordinator: Reserve+Complete ops/s ≥ 0.5× pgbench's at concurrency 16 (${ratio(closed(16))}×)`,
      `${verdict(open50, (v) => v <= 2)}  coordinator: P99 at 50% of the best closed-loop rate ≤ 2× pgbench's (${ratio(open50)}×)`,
    );
    // A no-op operation is two RPCs: a Health/Check each, through the gateway SDK's transport.
    const noop16 = run.rows.find((r) => r.mode === "closed" && r.concurrency === 16)?.noop;
    const perRpc = (cores: number | undefined) => {
      const ms = cpuMsPerOp(cores, noop16 ?? null);
      return ms === undefined ? undefined : ms / 2;
    };
    const serverMs = perRpc(noop16?.cpu?.coordinator);
    const clientMs = perRpc(noop16?.cpu?.client);
    const one = run.rows.find((r) => r.mode === "closed" && r.concurrency === 1);
    const floor = one?.pgbench ? one.noop.p50Ms + one.pgbench.p50Ms : undefined;
    const pairVsFloor = one && floor ? one.coordinator.p50Ms / floor : undefined;
    const ms2 = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(2));
    lines.push(
      `${verdict(serverMs, (v) => v <= 0.2)}  RPC: a no-op RPC's CPU at concurrency 16 ≤ 0.2 ms on the server (${ms2(serverMs)} ms)`,
      `${verdict(clientMs, (v) => v <= 0.2)}  RPC: a no-op RPC's CPU at concurrency 16 ≤ 0.2 ms on the client (${ms2(clientMs)} ms)`,
      `${verdict(pairVsFloor, (v) => v <= 1.5)}  coordinator: Reserve+Complete P50 at concurrency 1 ≤ 1.5× (two no-op RPCs + pgbench's pair) (${ratio(pairVsFloor ?? null)}×: ${ms2(one?.coordinator.p50Ms)} and ${ms2(floor)} ms)`,
    );
    if (one?.relay && floor) {
      // Not a goal: the same pair through a process that does nothing else, so that a FAIL above says how much is the coordinator's own.
      lines.push(
        `floor coordinator: the pair through a bare relay (HTTP/2 to node-postgres, pgbench's statements; no protocol, authentication, checks, sealing or metrics): ${ratio(one.relay.p50Ms / floor)}× (${ms2(one.relay.p50Ms)} ms)`,
      );
    }
  }
  if (run.service) {
    const r = run.service.ratios;
    lines.push(
      `${verdict(r.newVsPlain, (v) => v >= 0.3)}  service: new keys through the SDK and the coordinator ≥ 0.3× the handler alone, ops/s (${ratio(r.newVsPlain)}×)`,
      `${verdict(r.replaysVsPlain, (v) => v >= 1)}  service: replays through the SDK ≥ 1.0× the handler alone, ops/s (${ratio(r.replaysVsPlain)}×)`,
      `${verdict(r.p99NewVsPlain, (v) => v <= 3)}  service: P99 of new keys ≤ 3× the handler alone's (${ratio(r.p99NewVsPlain)}×)`,
      `${verdict(r.replaysCachedVsPlain, (v) => v >= 1.5)}  service: (c') replays with the answer cache ≥ 1.5× (a) ops/s (${ratio(r.replaysCachedVsPlain)}×)`,
    );
    if (run.service.colocatedNewKeys) {
      lines.push(
        `${verdict(r.colocatedNewVsPlain, (v) => v >= 0.5)}  service: (d) co-located new keys ≥ 0.5× (a), ops/s (${ratio(r.colocatedNewVsPlain ?? null)}×)`,
        `${verdict(r.p99ColocatedNewVsPlain, (v) => v <= 3)}  service: P99 of (d) ≤ 3× P99 of (a) (${ratio(r.p99ColocatedNewVsPlain ?? null)}×)`,
      );
    }
  }
  if (run.writePath) {
    const w = run.writePath;
    const ms = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(3));
    lines.push(
      `${verdict(w.ratios.cpu, (v) => v <= 3)}  database: PostgreSQL CPU per Reserve+Complete ≤ 3× bare insert (${ratio(w.ratios.cpu)}×: ${ms(w.registry.postgresMsPerOp)} and ${ms(w.bare.postgresMsPerOp)} ms)`,
      `${verdict(w.ratios.wal, (v) => v <= 4)}  database: WAL bytes per Reserve+Complete ≤ 4× bare insert (${ratio(w.ratios.wal)}×: ${comparedWal(w, w.registry).toFixed(0)} and ${comparedWal(w, w.bare).toFixed(0)} bytes${
        w.walWithoutImages ? ", full-page images aside" : ""
      })`,
    );
    if (w.floor) {
      // Not a goal: what the goals above are measured against, so that a FAIL there says how far any record could go.
      lines.push(
        `floor database: the least a record can be (an insert, then a HOT update with the response; no event, count, job index or row security): ${ratio(w.ratios.floorCpu)}× the bare insert's CPU (${ms(w.floor.postgresMsPerOp)} ms), ${ratio(w.ratios.floorWal)}× its WAL (${comparedWal(w, w.floor).toFixed(0)} bytes)`,
      );
    }
  }
  return lines;
}

const commitTitle = (run: CommitRun) =>
  `synchronous_commit=${run.synchronousCommit}${run.synchronousCommit === "on" ? " (durable: every COMMIT waits for its WAL flush)" : run.synchronousCommit === "off" ? " (COMMIT returns before the WAL flush)" : ""}`;

const reserveRows = (rows: Row[]) =>
  rows
    .filter((r) => r.mode === "closed")
    .map((r) => [String(r.concurrency), ms(r.coordinator.reserveP50Ms), ms(r.coordinator.reserveP99Ms), ms(r.coordinator.p50Ms), ms(r.coordinator.p99Ms)]);

function commitText(result: BenchResult, run: CommitRun): string[] {
  const rows = run.rows;
  return [
    `=== ${commitTitle(run)} ===`,
    "",
    ...(rows.length
      ? [
          "coordinator level:",
          aligned(HEADERS, rows.map(cells)),
          "",
          "ops = one Reserve(claim) + one Complete (coordinator), the same SQL in one pgbench transaction, two Health/Check RPCs (no-op).",
          "c/pgb, c/no-op: coordinator ÷ baseline, measured side by side in this run (ops: <1 is slower; p99: >1 is slower).",
          "",
          aligned(["conc", "Reserve p50 ms", "Reserve p99 ms", "pair p50 ms", "pair p99 ms"], reserveRows(rows)),
          "",
          ...(cpuRows(rows).length
            ? [
                `cores busy on average per phase (${result.machine.cpus} cores; client = load generator or pgbench):`,
                aligned(CPU_HEADERS, cpuRows(rows)),
                "",
                "CPU ms per operation (cores busy ÷ ops/s):",
                aligned(CPU_PER_OP_HEADERS, cpuPerOpRows(rows)),
                "",
              ]
            : []),
        ]
      : []),
    ...(run.writePath
      ? [`database level: ${run.writePath.method}`, aligned(writePathTable(run.writePath).headers, writePathTable(run.writePath).rows), ...writePathBreakdown(run.writePath), ""]
      : []),
    ...(run.service
      ? [
          `service level: ${run.service.description}`,
          aligned(SERVICE_HEADERS, serviceRows(run.service)),
          "",
          "coordinator calls per request (its /metrics):",
          ...callLines(run.service),
          "",
        ]
      : []),
    `goals (${commitTitle(run)}):`,
    ...goalLines(run).map((l) => `  ${l}`),
    "",
  ];
}

export function renderText(result: BenchResult): string {
  const runs = commitRuns(result);
  const errors = runs.flatMap(errorLines);
  return [
    ...runs.flatMap((run) => commitText(result, run)),
    ...roundTripLines(result.roundTrips),
    "",
    ...factLines(result),
    ...(errors.length ? ["", "errors:", ...errors.map((e) => `  ${e}`)] : []),
  ].join("\n");
}

function commitMarkdown(run: CommitRun): string[] {
  const rows = run.rows;
  return [
    `### ${commitTitle(run)}`,
    "",
    ...(rows.length
      ? [
          markdownTable(HEADERS, rows.map(cells)),
          "",
          markdownTable(["conc", "Reserve p50 ms", "Reserve p99 ms", "pair p50 ms", "pair p99 ms"], reserveRows(rows)),
          "",
          ...(cpuRows(rows).length ? [markdownTable(CPU_HEADERS, cpuRows(rows)), "", markdownTable(CPU_PER_OP_HEADERS, cpuPerOpRows(rows)), ""] : []),
        ]
      : []),
    ...(run.writePath
      ? [
          `Database level: ${run.writePath.method}`,
          "",
          markdownTable(writePathTable(run.writePath).headers, writePathTable(run.writePath).rows),
          "",
          ...writePathBreakdown(run.writePath).map((l) => `- ${l}`),
          "",
        ]
      : []),
    ...(run.service
      ? [`Service level: ${run.service.description}`, "", markdownTable(SERVICE_HEADERS, serviceRows(run.service)), "", ...callLines(run.service).map((l) => `- ${l.trim()}`), ""]
      : []),
    ...goalLines(run).map((l) => `- ${l}`),
    "",
  ];
}

export function renderMarkdown(result: BenchResult): string {
  const rt = result.roundTrips;
  const costRow = (name: string, c: RpcCost | NonNullable<RoundTrips["pgbench"]> | undefined) =>
    c
      ? [
          name,
          n2(c.roundTrips),
          n2(c.statements),
          c.databaseMs === undefined ? "-" : c.databaseMs.toFixed(3),
          "clientMs" in c ? c.clientMs.toFixed(2) : "-",
          "handlerMs" in c ? ms(c.handlerMs) : "-",
        ]
      : undefined;
  const costs = [costRow("Reserve", rt.reserve), costRow("Complete", rt.complete), costRow("pgbench transaction", rt.pgbench ?? undefined)].filter(
    (r): r is string[] => r !== undefined,
  );
  const statementNames = [
    ...new Set([...(rt.reserve?.statementList ?? []), ...(rt.complete?.statementList ?? []), ...(rt.pgbench?.statementList ?? [])].map((s) => s.statement)),
  ].sort((a, b) => statementRank(a) - statementRank(b));
  const per = (c: { statementList?: StatementShare[] } | null | undefined, name: string) => {
    const s = c?.statementList?.find((x) => x.statement === name);
    return s ? `${s.perCall.toFixed(2)} (${s.meanMs.toFixed(3)} ms)` : "-";
  };
  const statementRows = statementNames.map((name) => [`\`${name}\``, per(rt.reserve, name), per(rt.complete, name), per(rt.pgbench, name)]);
  return [
    ...commitRuns(result).flatMap(commitMarkdown),
    ...(costs.length
      ? [markdownTable(["per call", "round trips", "statements", "database ms", "client ms", "server ms"], costs), ""]
      : [`round trips: unavailable (${rt.reason ?? "not measured"})`, ""]),
    ...(statementRows.length
      ? [markdownTable(["statement (pg_stat_statements)", "per Reserve (mean exec)", "per Complete (mean exec)", "per pgbench transaction (mean exec)"], statementRows), ""]
      : []),
    "",
    ...factLines(result).map((l) => `- ${l}`),
  ].join("\n");
}
