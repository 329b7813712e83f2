import type { Counter } from "prom-client";
import type { Db } from "../registry/db.js";
import type { Registry } from "../registry/registry.js";
import type { ViewScope } from "../registry/types.js";

/**
 * The series of GetEventSeries (the operator console's charts): what the
 * registry's event log says of the last minutes, the same whichever replica
 * is asked, and the decisions that leave no event (replays, answers in
 * progress, expired keys), which only each replica's metrics count.
 */

/** The windows the charts offer, in minutes; each is drawn in 60 buckets, so its step in seconds is its minutes. */
export const CHART_WINDOWS: readonly number[] = [5, 10, 30, 60];

/** One line of a chart: a value per bucket. */
export interface ChartSeries {
  key: string;
  title: string;
  /** "per second", "seconds" or "records". */
  unit: string;
  values: number[];
  /** Per bucket, what a rate was computed from (events or decisions counted in it). */
  counts?: number[];
}

/** The buckets of a window: their starts (epoch seconds) and how many seconds of each have passed (the last one is partial). */
export interface ChartGrid {
  stepSeconds: number;
  buckets: number[];
  spans: number[];
}

/** What the event-log charts count per second, each from the events of some kinds. */
const COUNTED: ReadonlyArray<{ key: string; title: string; kinds: readonly string[] }> = [
  { key: "accepted", title: "Accepted", kinds: ["ACCEPTED", "RECYCLED"] },
  { key: "conflicts", title: "Payload conflicts", kinds: ["CONFLICT"] },
  { key: "takeovers", title: "Takeovers", kinds: ["TAKEOVER"] },
  { key: "completed", title: "Completed", kinds: ["COMPLETED"] },
  { key: "becameUnknown", title: "Went UNKNOWN", kinds: ["UNKNOWN"] },
  { key: "reconciled", title: "Reconciled", kinds: ["RECONCILED"] },
];

/** The decisions of Reserve the event log does not hold, counted by this replica's metrics (idem_decisions_total). */
const UNLOGGED = [
  { key: "replays", title: "Replays", decision: "REPLAY" },
  { key: "inProgress", title: "In progress", decision: "IN_PROGRESS" },
  { key: "expired", title: "Expired", decision: "EXPIRED" },
] as const;

/** The event log's series over the last `minutes`, within a scope, with the grid they are drawn on (in database time). */
export async function eventLogCharts(registry: Registry, db: Db, scope: ViewScope, minutes: number): Promise<{ grid: ChartGrid; now: number; series: ChartSeries[] }> {
  const stepSeconds = minutes;
  const { counts, unknown } = await registry.eventSeries(db, { ...scope, kinds: COUNTED.flatMap((c) => c.kinds), windowSeconds: minutes * 60, stepSeconds });
  const now = unknown[0]!.now;
  const grid: ChartGrid = { stepSeconds, buckets: unknown.map((u) => u.bucket), spans: unknown.map((u) => Math.max(1, Math.min(stepSeconds, now - u.bucket))) };
  const index = new Map(grid.buckets.map((bucket, i) => [bucket, i]));
  const series = COUNTED.map(({ key, title, kinds }) => {
    const perBucket = grid.buckets.map(() => 0);
    for (const c of counts) if (kinds.includes(c.kind) && index.has(c.bucket)) perBucket[index.get(c.bucket)!]! += c.n;
    return rates(key, title, perBucket, grid);
  });
  series.push(
    { key: "unknownOldest", title: "Oldest UNKNOWN age", unit: "seconds", values: unknown.map((u) => Math.round(u.oldest)) },
    { key: "unknownRecords", title: "UNKNOWN records", unit: "records", values: unknown.map((u) => u.unknown) },
  );
  return { grid, now, series };
}

/** A rate per second from counts per bucket. */
function rates(key: string, title: string, counts: number[], grid: ChartGrid): ChartSeries {
  return { key, title, unit: "per second", values: counts.map((n, i) => round(n / grid.spans[i]!)), counts };
}

const round = (value: number) => Math.round(value * 1000) / 1000;

/**
 * Samples this replica's counter of Reserve decisions every `everyMs`, from
 * the first time the charts are asked for until `idleMs` pass without
 * another ask: the decisions per second the event log cannot tell.
 */
export class DecisionSampler {
  private samples: Array<{ at: number; totals: Map<string, number> }> = [];
  private timer: NodeJS.Timeout | undefined;
  private askedAt = 0;

  constructor(
    private readonly decisions: Counter<"operation" | "decision" | "enforced">,
    private readonly everyMs = 5000,
    private readonly idleMs = 60 * 60 * 1000,
  ) {}

  /** Decisions per second in each bucket of `grid`, of the operations `mayOperate` admits, and since when this replica has sampled. */
  async series(grid: ChartGrid, mayOperate: (operation: string) => boolean): Promise<{ since: string; series: ChartSeries[] }> {
    this.askedAt = Date.now();
    if (!this.timer) {
      this.samples = [await this.read()];
      this.timer = setInterval(() => {
        if (Date.now() - this.askedAt > this.idleMs) return this.stop();
        void this.read().then((sample) => this.samples.push(sample));
        while (this.samples.length > 1 && this.samples[0]!.at < Date.now() - this.idleMs) this.samples.shift();
      }, this.everyMs).unref();
    }
    const samples = [...this.samples, await this.read()];
    const series = UNLOGGED.map(({ key, title, decision }) => {
      const perBucket = grid.buckets.map(() => 0);
      for (let i = 1; i < samples.length; i++) {
        const bucket = grid.buckets.findLastIndex((start) => start * 1000 <= samples[i]!.at);
        if (bucket >= 0) perBucket[bucket]! += decided(samples[i]!, decision, mayOperate) - decided(samples[i - 1]!, decision, mayOperate);
      }
      return rates(key, title, perBucket, grid);
    });
    return { since: new Date(this.samples[0]!.at).toISOString(), series };
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    this.samples = [];
  }

  private async read(): Promise<{ at: number; totals: Map<string, number> }> {
    const totals = new Map<string, number>();
    for (const { labels, value } of (await this.decisions.get()).values) {
      const key = `${labels.decision}\u0000${labels.operation}`;
      totals.set(key, (totals.get(key) ?? 0) + value);
    }
    return { at: Date.now(), totals };
  }
}

/** How many decisions of a kind a sample counts, over the operations admitted (shadow mode's included). */
function decided(sample: { totals: Map<string, number> }, decision: string, mayOperate: (operation: string) => boolean): number {
  let n = 0;
  for (const [key, value] of sample.totals) {
    const [kind, operation] = key.split("\u0000");
    if (kind === decision && mayOperate(operation!)) n += value;
  }
  return n;
}
