/**
 * Load generation and latency statistics, shared by the coordinator, the
 * no-op RPC and (for the statistics) pgbench, so that every side is counted
 * the same way: an operation counts when it completes inside the measurement
 * window (after the warm-up), throughput is those completions over the
 * window, and percentiles are over their latencies.
 */
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import { ascending, percentile } from "../harness/lib/histogram.js";
import type { CpuUse } from "./cpu.js";

/** One operation; resolves to the duration of its first part (Reserve alone) when it has one, in ms. */
export type Operation = (worker: number) => Promise<number | void>;

export interface Sample {
  /** Latency of each operation completed inside the window, in ms. */
  latencies: number[];
  /** Duration of the first part (Reserve alone) of the same operations, when known. */
  parts: number[];
  /** Failed operations (anywhere in the run). */
  errors: number;
  firstError?: string;
  windowMs: number;
}

export interface Summary {
  opsPerSec: number;
  p50Ms: number;
  p99Ms: number;
  meanMs: number;
  maxMs: number;
  /** Operations completed inside the window. */
  count: number;
  errors: number;
  firstError?: string;
  /** Reserve alone, when measured. */
  reserveP50Ms?: number;
  reserveP99Ms?: number;
  /** Cores busy on average during the whole phase (warm-up included), by process. */
  cpu?: CpuUse;
}

export function summarize(sample: Sample): Summary {
  const sorted = ascending(sample.latencies);
  const parts = ascending(sample.parts);
  const sum = sorted.reduce((a, b) => a + b, 0);
  return {
    opsPerSec: sample.windowMs > 0 ? sorted.length / (sample.windowMs / 1000) : 0,
    p50Ms: percentile(sorted, 0.5),
    p99Ms: percentile(sorted, 0.99),
    meanMs: sorted.length ? sum / sorted.length : Number.NaN,
    maxMs: sorted.length ? sorted[sorted.length - 1]! : Number.NaN,
    count: sorted.length,
    errors: sample.errors,
    ...(sample.firstError ? { firstError: sample.firstError } : {}),
    ...(parts.length ? { reserveP50Ms: percentile(parts, 0.5), reserveP99Ms: percentile(parts, 0.99) } : {}),
  };
}

export interface Phase {
  warmupMs: number;
  measureMs: number;
  /** Aborts the phase (Ctrl-C): workers stop issuing operations. */
  signal: AbortSignal;
}

class Recorder {
  readonly latencies: number[] = [];
  readonly parts: number[] = [];
  errors = 0;
  firstError: string | undefined;
  constructor(
    private readonly from: number,
    private readonly to: number,
  ) {}

  record(done: number, latency: number, part: number | void): void {
    if (done < this.from || done > this.to) return;
    this.latencies.push(latency);
    if (typeof part === "number") this.parts.push(part);
  }

  fail(error: unknown): void {
    this.errors++;
    this.firstError ??= error instanceof Error ? error.message : String(error);
  }

  sample(windowMs: number): Sample {
    return { latencies: this.latencies, parts: this.parts, errors: this.errors, ...(this.firstError ? { firstError: this.firstError } : {}), windowMs };
  }
}

/** Too many failures in a row means the system under test is down: stop instead of spinning. */
const MAX_ERRORS = 1000;

/** Closed loop: `workers` concurrent callers, each issuing its next operation when the previous one answered. */
export async function closedLoop(workers: number, phase: Phase, op: Operation): Promise<Sample> {
  const start = performance.now();
  const from = start + phase.warmupMs;
  const end = from + phase.measureMs;
  const recorder = new Recorder(from, end);
  await Promise.all(
    Array.from({ length: workers }, async (_, worker) => {
      while (!phase.signal.aborted && recorder.errors < MAX_ERRORS) {
        const t0 = performance.now();
        if (t0 >= end) return;
        try {
          const part = await op(worker);
          const t1 = performance.now();
          recorder.record(t1, t1 - t0, part);
        } catch (error) {
          recorder.fail(error);
        }
      }
    }),
  );
  return recorder.sample(phase.measureMs);
}

/**
 * Open model: operations arrive at `ratePerSec` whatever the answers take
 * (Poisson arrivals), spread over `workers` callers the way pgbench --rate
 * schedules its clients: each has its own Poisson schedule at rate/workers,
 * and an operation whose scheduled time passed while its caller was busy
 * starts late. Latency is measured from the scheduled time, so waiting for a
 * caller counts (no coordinated omission).
 */
export async function openLoop(workers: number, ratePerSec: number, phase: Phase, op: Operation): Promise<Sample> {
  const start = performance.now();
  const from = start + phase.warmupMs;
  const end = from + phase.measureMs;
  const recorder = new Recorder(from, end);
  const meanGapMs = (1000 * workers) / ratePerSec;
  const gap = () => -Math.log(1 - Math.random()) * meanGapMs;
  await Promise.all(
    Array.from({ length: workers }, async (_, worker) => {
      for (let scheduled = start + gap(); scheduled < end; scheduled += gap()) {
        if (phase.signal.aborted || recorder.errors >= MAX_ERRORS) return;
        const wait = scheduled - performance.now();
        if (wait > 0) await sleep(wait);
        try {
          const part = await op(worker);
          const t1 = performance.now();
          recorder.record(t1, t1 - scheduled, part);
        } catch (error) {
          recorder.fail(error);
        }
      }
    }),
  );
  return recorder.sample(phase.measureMs);
}
