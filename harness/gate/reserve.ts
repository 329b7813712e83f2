import { mergePromHistograms, parsePromHistogram, promQuantile, type PromHistogram } from "../lib/prometheus.js";

/**
 * Follows one of the coordinators' histograms (the Reserve transaction's,
 * `idem_registry_transaction_seconds{transaction="reserve"}`, and the whole
 * Reserve RPC's) across every replica and every life of each: a replica's
 * counters start at zero on every restart, so the last scrape before each
 * kill ends one life, and the run's total is the sum of all lives of all
 * replicas. Periodic scrapes of every replica at once give the P50 and P99 of
 * each interval (the report's chart of Reserve latency over time).
 */
export interface ReserveInterval {
  /** Seconds since the load started, at the end of the interval. */
  second: number;
  count: number;
  p50Ms: number;
  p99Ms: number;
}

/** Scrapes every replica's /metrics at once for all the trackers; scrapes never overlap. */
export class MetricsScraper {
  private chain: Promise<void> = Promise.resolve();
  /** Failed scrapes, noted rather than thrown. */
  readonly errors: string[] = [];

  constructor(
    /** One scrape function per replica. */
    private readonly scrapes: ReadonlyArray<() => Promise<string>>,
    private readonly trackers: readonly ReserveTracker[],
  ) {}

  sample(): Promise<void> {
    this.chain = this.chain.then(async () => {
      const outcomes = await Promise.allSettled(this.scrapes.map((scrape) => scrape()));
      const texts = outcomes.map((outcome, replica) => {
        if (outcome.status === "fulfilled") return outcome.value;
        this.errors.push(`replica ${replica}: ${(outcome.reason as Error).message}`);
        return undefined;
      });
      for (const tracker of this.trackers) tracker.observe(texts);
    });
    return this.chain;
  }

  /** Scrapes, then closes a replica's current life (call right before killing it, and for every replica at the end). */
  endLife(replica: number): Promise<void> {
    void this.sample();
    this.chain = this.chain.then(() => {
      for (const tracker of this.trackers) tracker.endLife(replica);
    });
    return this.chain;
  }

  /** Scrapes, then closes every replica's current life (at the end). */
  async endAllLives(): Promise<void> {
    for (let replica = 0; replica < this.scrapes.length; replica++) await this.endLife(replica);
  }
}

export class ReserveTracker {
  private readonly lives: PromHistogram[] = [];
  /** Each replica's current life, by replica index. */
  private readonly current = new Map<number, PromHistogram>();
  readonly series: ReserveInterval[] = [];

  constructor(
    private readonly startedAt: () => number,
    private readonly metric: { name: string; labels: Record<string, string> },
  ) {}

  /** Reads the histogram from one scrape of every replica's /metrics (undefined: that replica's scrape failed). */
  observe(texts: ReadonlyArray<string | undefined>): void {
    const deltas: PromHistogram[] = [];
    texts.forEach((text, replica) => {
      if (text !== undefined) deltas.push(this.observeReplica(replica, parsePromHistogram(text, this.metric.name, this.metric.labels)));
    });
    const interval = mergePromHistograms(deltas);
    const n = interval.buckets.at(-1)?.count ?? 0;
    if (n > 0) {
      this.series.push({
        second: Math.round((Date.now() - this.startedAt()) / 100) / 10,
        count: n,
        p50Ms: promQuantile(interval, 0.5).seconds * 1000,
        p99Ms: promQuantile(interval, 0.99).seconds * 1000,
      });
    }
  }

  /** Closes a replica's current life: its next scrape starts from zero. */
  endLife(replica: number): void {
    const life = this.current.get(replica);
    if (life) this.lives.push(life);
    this.current.delete(replica);
  }

  /** Every life so far, the current ones included. */
  total(): PromHistogram {
    return mergePromHistograms([...this.lives, ...this.current.values()]);
  }

  get livesSeen(): number {
    return this.lives.length + this.current.size;
  }

  /** Takes a replica's new reading as its current life and returns what it adds since its last one. */
  private observeReplica(replica: number, h: PromHistogram): PromHistogram {
    const count = h.buckets.at(-1)?.count ?? 0;
    const previous = this.current.get(replica);
    this.current.set(replica, h);
    if (previous && count < (previous.buckets.at(-1)?.count ?? 0)) {
      // The counters went back: the replica restarted without endLife (it died on its own).
      this.lives.push(previous);
      return h;
    }
    if (!previous) return h;
    const before = new Map(previous.buckets.map((b) => [b.le, b.count]));
    return {
      buckets: h.buckets.map((b) => ({ le: b.le, count: b.count - (before.get(b.le) ?? 0) })),
      count: h.count - previous.count,
      sumSeconds: h.sumSeconds - previous.sumSeconds,
    };
  }
}
