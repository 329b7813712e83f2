import { mergePromHistograms, parsePromHistogram, promQuantile, type PromHistogram } from "./histogram.js";

/**
 * Follows one of the coordinator's histograms (the Reserve transaction's,
 * `idem_registry_transaction_seconds{transaction="reserve"}`, and the whole
 * Reserve RPC's) across its lives: its counters start at zero on every
 * restart, so the last scrape before each kill ends one life, and the run's
 * total is the sum of the lives. Periodic scrapes in between give the P50 and
 * P99 of each interval (the report's chart of Reserve latency over time).
 */
export interface ReserveInterval {
  /** Seconds since the load started, at the end of the interval. */
  second: number;
  count: number;
  p50Ms: number;
  p99Ms: number;
}

/** Scrapes the coordinator's /metrics once for all its trackers; scrapes never overlap. */
export class MetricsScraper {
  private chain: Promise<void> = Promise.resolve();
  /** Failed scrapes, noted rather than thrown. */
  readonly errors: string[] = [];

  constructor(
    private readonly scrape: () => Promise<string>,
    private readonly trackers: readonly ReserveTracker[],
  ) {}

  sample(): Promise<void> {
    this.chain = this.chain.then(async () => {
      try {
        const text = await this.scrape();
        for (const tracker of this.trackers) tracker.observe(text);
      } catch (error) {
        this.errors.push((error as Error).message);
      }
    });
    return this.chain;
  }

  /** Scrapes, then closes the coordinator's current life (call right before killing it, and at the end). */
  endLife(): Promise<void> {
    void this.sample();
    this.chain = this.chain.then(() => {
      for (const tracker of this.trackers) tracker.endLife();
    });
    return this.chain;
  }
}

export class ReserveTracker {
  private readonly lives: PromHistogram[] = [];
  private current: PromHistogram | undefined;
  readonly series: ReserveInterval[] = [];

  constructor(
    private readonly startedAt: () => number,
    private readonly metric: { name: string; labels: Record<string, string> },
  ) {}

  /** Reads the histogram from one scrape of /metrics. */
  observe(text: string): void {
    this.observeHistogram(parsePromHistogram(text, this.metric.name, this.metric.labels));
  }

  /** Closes the coordinator's current life: its next scrape starts from zero. */
  endLife(): void {
    if (this.current) this.lives.push(this.current);
    this.current = undefined;
  }

  /** Every life so far, the current one included. */
  total(): PromHistogram {
    return mergePromHistograms(this.current ? [...this.lives, this.current] : this.lives);
  }

  get livesSeen(): number {
    return this.lives.length + (this.current ? 1 : 0);
  }

  private observeHistogram(h: PromHistogram): void {
    const count = h.buckets.at(-1)?.count ?? 0;
    const previous = this.current;
    let delta: PromHistogram;
    if (previous && count < (previous.buckets.at(-1)?.count ?? 0)) {
      // The counters went back: the coordinator restarted without endLife (it died on its own).
      this.lives.push(previous);
      delta = h;
    } else if (previous) {
      const before = new Map(previous.buckets.map((b) => [b.le, b.count]));
      delta = {
        buckets: h.buckets.map((b) => ({ le: b.le, count: b.count - (before.get(b.le) ?? 0) })),
        count: h.count - previous.count,
        sumSeconds: h.sumSeconds - previous.sumSeconds,
      };
    } else {
      delta = h;
    }
    this.current = h;
    const n = delta.buckets.at(-1)?.count ?? 0;
    if (n > 0) {
      this.series.push({
        second: Math.round((Date.now() - this.startedAt()) / 100) / 10,
        count: n,
        p50Ms: promQuantile(delta, 0.5).seconds * 1000,
        p99Ms: promQuantile(delta, 0.99).seconds * 1000,
      });
    }
  }
}
