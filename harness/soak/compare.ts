import { Samples } from "../lib/histogram.js";
import type { PromTotals } from "../lib/prometheus.js";
import { latencyBetween } from "./judge.js";
import type { GeneratorSample, MachineSample, SampledLife, StatementsSample } from "./sampler.js";

/**
 * The first and the last windows the P99 line compares, side by side: where
 * an answer's time went in each. When the line fails, this says whether the
 * coordinators' RPCs, the registry's statements, the machine or the load
 * generator's own clock took the extra time.
 */

/** A span of time, Date.now() milliseconds. */
export interface Span {
  from: number;
  to: number;
}

/** One figure in both windows (undefined: not sampled in that window). */
export interface ComparedFigure {
  name: string;
  unit: string;
  first: number | undefined;
  last: number | undefined;
}

/** One registry statement in both windows: calls per second, rows per call, and milliseconds of execution per call and per second. */
export interface ComparedStatement {
  query: string;
  first: StatementRate | undefined;
  last: StatementRate | undefined;
}

export interface StatementRate {
  callsPerSecond: number;
  /** Rows returned or changed per call (pg_stat_statements' rows: 1 for a statement that ends in one count): a statement that takes longer per call may just do more each time. */
  rowsPerCall: number;
  meanMs: number;
  msPerSecond: number;
}

export interface WindowComparison {
  first: Span;
  last: Span;
  figures: ComparedFigure[];
  /** The statements that took the most of the registry's time, ordered by the larger of their two windows' shares. */
  statements: ComparedStatement[];
}

/** The first and last of `samples` within `span`, when they are two samples apart in time. */
function endsWithin<T extends { t: number }>(samples: readonly T[], span: Span): { first: T; last: T; seconds: number } | undefined {
  const inside = samples.filter((s) => s.t >= span.from && s.t <= span.to);
  const first = inside[0];
  const last = inside.at(-1);
  return first && last && last.t > first.t ? { first, last, seconds: (last.t - first.t) / 1000 } : undefined;
}

/** What a cumulative series adds between its first and last sample in `span`, and over how many seconds. */
function changeWithin<T extends { t: number }>(samples: readonly T[], span: Span, value: (s: T) => number): { change: number; seconds: number } | undefined {
  const ends = endsWithin(samples, span);
  return ends && { change: value(ends.last) - value(ends.first), seconds: ends.seconds };
}

function meanWithin<T extends { t: number }>(samples: readonly T[], span: Span, value: (s: T) => number | undefined): number | undefined {
  const values = samples
    .filter((s) => s.t >= span.from && s.t <= span.to)
    .flatMap((s) => {
      const v = value(s);
      return v === undefined || !Number.isFinite(v) ? [] : [v];
    });
  return values.length === 0 ? undefined : values.reduce((a, b) => a + b, 0) / values.length;
}

/** Calls and seconds of one histogram label value over every coordinator life's samples within `span`. */
function rpcWithin(lives: readonly SampledLife[], span: Span, pick: (sample: SampledLife["samples"][number]) => PromTotals | undefined, key: string) {
  let count = 0;
  let seconds = 0;
  let elapsed = 0;
  for (const life of lives) {
    const ends = endsWithin(life.samples, span);
    if (!ends) continue;
    const [before, after] = [pick(ends.first)?.[key], pick(ends.last)?.[key]];
    const calls = (after?.count ?? 0) - (before?.count ?? 0);
    if (calls < 0) continue;
    count += calls;
    seconds += (after?.seconds ?? 0) - (before?.seconds ?? 0);
    elapsed = Math.max(elapsed, ends.seconds);
  }
  return count === 0 ? undefined : { meanMs: (seconds / count) * 1000, perSecond: count / Math.max(1, elapsed) };
}

function statementsWithin(samples: readonly StatementsSample[], span: Span): Map<string, { query: string; rate: StatementRate }> {
  const out = new Map<string, { query: string; rate: StatementRate }>();
  const ends = endsWithin(samples, span);
  if (!ends) return out;
  const { first, last, seconds } = ends;
  for (const [id, now] of Object.entries(last.byQuery)) {
    const before = first.byQuery[id];
    // Counters that went back were reset (another server became primary): nothing comparable.
    if (before && (now.calls < before.calls || now.ms < before.ms)) continue;
    const calls = now.calls - (before?.calls ?? 0);
    const ms = now.ms - (before?.ms ?? 0);
    const rows = now.rows - (before?.rows ?? 0);
    if (calls > 0) out.set(id, { query: now.query, rate: { callsPerSecond: calls / seconds, rowsPerCall: rows / calls, meanMs: ms / calls, msPerSecond: ms / seconds } });
  }
  return out;
}

export interface ComparedInputs {
  /** The load's answers per second since `origin` (LoadStats.windows at one-second windows). */
  answers: readonly Samples[];
  origin: number;
  lives: readonly SampledLife[];
  machine: readonly MachineSample[];
  generator: readonly GeneratorSample[];
  statements: readonly StatementsSample[];
  /** How many statements to list. */
  top?: number;
}

export function compareWindows(inputs: ComparedInputs, first: Span, last: Span): WindowComparison {
  const figures: ComparedFigure[] = [];
  /** One figure of each window, from what `of` works out once per window. */
  const each = <T>(of: (span: Span) => T) => {
    const [a, b] = [of(first), of(last)];
    return (name: string, unit: string, pick: (t: T) => number | undefined) => figures.push({ name, unit, first: pick(a), last: pick(b) });
  };
  const both = (name: string, unit: string, of: (span: Span) => number | undefined) => each(of)(name, unit, (v) => v);
  const answers = each((span) => ({
    ...Samples.merge(latencyBetween(inputs.answers, inputs.origin, span.from, span.to, []).seconds).summary(),
    seconds: (span.to - span.from) / 1000,
  }));
  answers("answers, P50", "ms", (a) => a.p50Ms);
  answers("answers, mean", "ms", (a) => a.meanMs);
  answers("answers per second", "/s", (a) => a.count / a.seconds);
  const coordinators = inputs.lives.filter((life) => life.samples.some((s) => s.rpcs !== undefined));
  const methods = [...new Set(coordinators.flatMap((life) => life.samples.flatMap((s) => Object.keys(s.rpcs ?? {}))))].sort();
  for (const method of methods) {
    const rpcs = each((span) => rpcWithin(coordinators, span, (s) => s.rpcs, method));
    rpcs(`${method} RPCs, mean (every coordinator)`, "ms", (r) => r?.meanMs);
    rpcs(`${method} RPCs per second`, "/s", (r) => r?.perSecond);
  }
  const transactions = [...new Set(coordinators.flatMap((life) => life.samples.flatMap((s) => Object.keys(s.transactions ?? {}))))].sort();
  for (const name of transactions) both(`${name} transactions, mean`, "ms", (span) => rpcWithin(coordinators, span, (s) => s.transactions, name)?.meanMs);
  both("machine, busy cores", "cores", (span) => meanWithin(inputs.machine, span, (m) => m.busyCores));
  both("machine, the soak's processes", "cores", (span) => meanWithin(inputs.machine, span, (m) => m.soakCores));
  both("machine, stolen by the hypervisor", "cores", (span) => meanWithin(inputs.machine, span, (m) => m.stolenCores));
  both("load generator, CPU", "cores", (span) => {
    const cpu = changeWithin(inputs.generator, span, (g) => g.cpuSeconds);
    return cpu && cpu.change / cpu.seconds;
  });
  both("load generator, event-loop delay P99 (mean of samples)", "ms", (span) => meanWithin(inputs.generator, span, (g) => g.eventLoopP99Ms));
  both("load generator, heap used", "MB", (span) => meanWithin(inputs.generator, span, (g) => g.heapUsedBytes / 1e6));
  const firstStatements = statementsWithin(inputs.statements, first);
  const lastStatements = statementsWithin(inputs.statements, last);
  const total = (rates: Map<string, { rate: StatementRate }>) => (rates.size === 0 ? undefined : [...rates.values()].reduce((sum, s) => sum + s.rate.msPerSecond, 0));
  figures.push({ name: "registry statements, execution time per second", unit: "ms/s", first: total(firstStatements), last: total(lastStatements) });
  const ids = [...new Set([...firstStatements.keys(), ...lastStatements.keys()])];
  const weight = (id: string) => Math.max(lastStatements.get(id)?.rate.msPerSecond ?? 0, firstStatements.get(id)?.rate.msPerSecond ?? 0);
  const statements = ids
    .sort((a, b) => weight(b) - weight(a))
    .slice(0, inputs.top ?? 15)
    .map((id) => ({
      query: (lastStatements.get(id) ?? firstStatements.get(id))!.query,
      first: firstStatements.get(id)?.rate,
      last: lastStatements.get(id)?.rate,
    }));
  return { first, last, figures, statements };
}
