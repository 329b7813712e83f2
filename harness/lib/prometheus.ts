/**
 * Prometheus text exposition as the coordinator's /metrics serves it, read
 * by one parser: samples by metric name and labels, in whatever order the
 * labels come. The coordinator's histograms (cumulative buckets, summed over
 * its replicas and their lives, percentiles by interpolation as Prometheus'
 * histogram_quantile), its counters and gauges, and the running count and
 * sum of a histogram by one label.
 */

/** One cumulative bucket of a Prometheus histogram: count of observations <= le (seconds). */
export interface PromBucket {
  le: number;
  count: number;
}

export interface PromHistogram {
  /** Ascending, the last one +Inf. */
  buckets: PromBucket[];
  count: number;
  sumSeconds: number;
}

/**
 * The histogram `name` from a Prometheus text exposition, summed over the
 * series whose labels match `match` (e.g. every result code of method Reserve).
 * A counter `name` reads as a histogram of one +Inf bucket holding its value,
 * so that the same arithmetic over a process's lives sums it.
 */
export function parsePromHistogram(text: string, name: string, match: Record<string, string>): PromHistogram {
  const byLe = new Map<number, number>();
  let count = 0;
  let sum = 0;
  const names = new Set([name, `${name}_bucket`, `${name}_count`, `${name}_sum`]);
  for (const { metric, labels, value } of promSamples(text, names)) {
    if (!labelsMatch(labels, match)) continue;
    if (metric === name) {
      byLe.set(Number.POSITIVE_INFINITY, (byLe.get(Number.POSITIVE_INFINITY) ?? 0) + value);
      count += value;
    } else if (metric === `${name}_bucket`) {
      const le = labels.le === "+Inf" ? Number.POSITIVE_INFINITY : Number(labels.le);
      byLe.set(le, (byLe.get(le) ?? 0) + value);
    } else if (metric === `${name}_count`) count += value;
    else sum += value;
  }
  const buckets = [...byLe.entries()].map(([le, c]) => ({ le, count: c })).sort((a, b) => a.le - b.le);
  return { buckets, count, sumSeconds: sum };
}

/** A histogram's running count and sum of seconds, by the value of one label. */
export type PromTotals = Record<string, { count: number; seconds: number }>;

/**
 * The histogram `name`'s _count and _sum from a Prometheus text exposition, added up by the value
 * of `label` (e.g. by method, over every code), over the series whose labels match `match`.
 */
export function promTotalsBy(text: string, name: string, label: string, match: Record<string, string> = {}): PromTotals {
  const out: PromTotals = {};
  for (const { metric, labels, value } of promSamples(text, new Set([`${name}_count`, `${name}_sum`]))) {
    const key = labels[label];
    if (key === undefined || !labelsMatch(labels, match)) continue;
    const entry = (out[key] ??= { count: 0, seconds: 0 });
    if (metric === `${name}_count`) entry.count += value;
    else entry.seconds += value;
  }
  return out;
}

/** The value of the gauge `name` from a Prometheus text exposition, in its first series whose labels match `match`; NaN when it has none. */
export function promGauge(text: string, name: string, match: Record<string, string> = {}): number {
  for (const { labels, value } of promSamples(text, new Set([name]))) {
    if (labelsMatch(labels, match)) return value;
  }
  return Number.NaN;
}

/** The sample lines of some metrics in a Prometheus text exposition: metric name, labels and value (labels parsed only for those metrics). */
function* promSamples(text: string, metrics: ReadonlySet<string>): Generator<{ metric: string; labels: Record<string, string>; value: number }> {
  const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)/;
  for (const raw of text.split("\n")) {
    if (raw.startsWith("#")) continue;
    const m = line.exec(raw);
    if (m && metrics.has(m[1]!)) yield { metric: m[1]!, labels: parseLabels(m[2] ?? ""), value: Number(m[3]) };
  }
}

/** Whether a series' labels hold every label of `match` with its value (others may be there too). */
function labelsMatch(labels: Record<string, string>, match: Record<string, string>): boolean {
  return Object.entries(match).every(([k, v]) => labels[k] === v);
}

function parseLabels(text: string): Record<string, string> {
  const labels: Record<string, string> = {};
  const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (let m = re.exec(text); m; m = re.exec(text)) labels[m[1]!] = m[2]!.replace(/\\(.)/g, "$1");
  return labels;
}

/** Sums histograms of several process lives (each one's counters start at zero). */
export function mergePromHistograms(parts: readonly PromHistogram[]): PromHistogram {
  const byLe = new Map<number, number>();
  let count = 0;
  let sum = 0;
  for (const part of parts) {
    for (const b of part.buckets) byLe.set(b.le, (byLe.get(b.le) ?? 0) + b.count);
    count += part.count;
    sum += part.sumSeconds;
  }
  return { buckets: [...byLe.entries()].map(([le, c]) => ({ le, count: c })).sort((a, b) => a.le - b.le), count, sumSeconds: sum };
}

/**
 * The q-quantile (seconds) by linear interpolation inside the bucket that
 * holds it (as Prometheus' histogram_quantile does). `beyond` is true when it
 * falls in the +Inf bucket: the value is then the largest finite bound, a
 * lower bound of the truth.
 */
export function promQuantile(h: PromHistogram, q: number): { seconds: number; beyond: boolean } {
  const total = h.buckets.at(-1)?.count ?? 0;
  if (total === 0) return { seconds: Number.NaN, beyond: false };
  const rank = q * total;
  let prevLe = 0;
  let prevCount = 0;
  for (const b of h.buckets) {
    if (b.count >= rank) {
      if (!Number.isFinite(b.le)) return { seconds: prevLe, beyond: true };
      const inBucket = b.count - prevCount;
      const fraction = inBucket > 0 ? (rank - prevCount) / inBucket : 1;
      return { seconds: prevLe + (b.le - prevLe) * fraction, beyond: false };
    }
    prevLe = b.le;
    prevCount = b.count;
  }
  return { seconds: prevLe, beyond: true };
}

export interface HistogramSummary {
  count: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  p999Ms: number;
  /** The P99 lies beyond the last finite bucket. */
  beyond: boolean;
  meanMs: number;
}

/** Count, interpolated quantiles and mean of a merged Prometheus histogram. */
export function promSummary(h: PromHistogram): HistogramSummary {
  const q = (p: number) => promQuantile(h, p);
  const p99 = q(0.99);
  return {
    count: h.buckets.at(-1)?.count ?? 0,
    p50Ms: q(0.5).seconds * 1000,
    p90Ms: q(0.9).seconds * 1000,
    p99Ms: p99.seconds * 1000,
    p999Ms: q(0.999).seconds * 1000,
    beyond: p99.beyond,
    meanMs: h.count > 0 ? (h.sumSeconds / h.count) * 1000 : Number.NaN,
  };
}
