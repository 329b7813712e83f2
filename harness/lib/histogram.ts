/**
 * Latency distributions measured by the harness and the benchmark: raw
 * samples, so that their percentiles are exact (nearest rank: the smallest
 * value with at least the share q of the samples at or below it), and
 * bucketed for the charts. The one percentile of every run: the gate's
 * client latency and UNKNOWN episodes, the failover scenario's write pauses,
 * the soak's P99 line, the benchmark's operations. (The coordinator's own
 * histograms, read from /metrics, are Prometheus buckets interpolated:
 * prometheus.ts.)
 */

/** The index of the q-quantile in `count` sorted values, by nearest rank. */
export function rankIndex(count: number, q: number): number {
  return Math.min(count - 1, Math.max(0, Math.ceil(q * count) - 1));
}

/** The q-quantile (0..1) of ascending `sorted` values, by nearest rank; NaN when there are none. */
export function percentile(sorted: ArrayLike<number>, q: number): number {
  return sorted.length === 0 ? Number.NaN : sorted[rankIndex(sorted.length, q)]!;
}

/** `values` in ascending order, as a new array. */
export function ascending(values: Iterable<number>): Float64Array {
  return Float64Array.from(values).sort();
}

/** Upper bounds (ms) of the client histogram: 10 per decade from 0.1 ms to 100 s. */
export const CLIENT_BOUNDS_MS: readonly number[] = Array.from({ length: 61 }, (_, i) => Number((0.1 * 10 ** (i / 10)).toPrecision(3)));

export interface Distribution {
  count: number;
  minMs: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  p999Ms: number;
  maxMs: number;
  meanMs: number;
  /** Counts per CLIENT_BOUNDS_MS bucket (value <= bound), the last one also holding everything above. */
  buckets: number[];
}

/** Raw samples, in ms. */
export class Samples {
  private values: number[] = [];
  add(ms: number): void {
    this.values.push(ms);
  }
  get count(): number {
    return this.values.length;
  }
  /** Every sample, in the order added. */
  all(): readonly number[] {
    return this.values;
  }
  /** The samples of all of `parts` together. */
  static merge(parts: readonly Samples[]): Samples {
    const merged = new Samples();
    for (const part of parts) for (const value of part.values) merged.values.push(value);
    return merged;
  }
  summary(): Distribution {
    const sorted = ascending(this.values);
    const n = sorted.length;
    const at = (q: number) => (n === 0 ? 0 : percentile(sorted, q));
    const buckets = new Array<number>(CLIENT_BOUNDS_MS.length).fill(0);
    let b = 0;
    let sum = 0;
    for (const v of sorted) {
      sum += v;
      while (b < CLIENT_BOUNDS_MS.length - 1 && v > CLIENT_BOUNDS_MS[b]!) b++;
      buckets[b]!++;
    }
    return {
      count: n,
      minMs: n ? sorted[0]! : 0,
      p50Ms: at(0.5),
      p90Ms: at(0.9),
      p99Ms: at(0.99),
      p999Ms: at(0.999),
      maxMs: n ? sorted[n - 1]! : 0,
      meanMs: n ? sum / n : 0,
      buckets,
    };
  }
}
