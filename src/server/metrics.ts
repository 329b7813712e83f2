import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import type pg from "pg";
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry as MetricsRegistry } from "prom-client";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import type { Census } from "../registry/types.js";
import { RECORD_STATES } from "../contract/words.js";

/** Every metric the coordinator exposes on the admin port's /metrics. */
export class Metrics {
  readonly registry = new MetricsRegistry();

  readonly rpcDuration = new Histogram({
    name: "idem_rpc_duration_seconds",
    help: "RPC latency by service, method and result code",
    labelNames: ["service", "method", "code"] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [this.registry],
  });

  readonly transactionDuration = new Histogram({
    name: "idem_registry_transaction_seconds",
    help: "Committed registry transactions, from BEGIN sent to COMMIT acknowledged (no pool wait), by registry call",
    labelNames: ["transaction"] as const,
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [this.registry],
  });

  readonly decisions = new Counter({
    name: "idem_decisions_total",
    help: "Reserve decisions by operation and decision; enforced=false counts what shadow mode would have done",
    labelNames: ["operation", "decision", "enforced"] as const,
    registers: [this.registry],
  });

  readonly refusals = new Counter({
    name: "idem_refusals_total",
    help: "Refused RPCs by method and reason",
    labelNames: ["method", "reason"] as const,
    registers: [this.registry],
  });

  readonly takeovers = new Counter({
    name: "idem_takeovers_total",
    help: "Ownership taken over after a lease ended (Reserve or Claim TAKEOVER), and recovery claims",
    labelNames: ["operation", "mode"] as const,
    registers: [this.registry],
  });

  readonly recovered = new Counter({
    name: "idem_recoverer_transitions_total",
    help: "Records whose lease ended, as the recoverer left them: unknown (an effect was possible) or claimable",
    labelNames: ["to"] as const,
    registers: [this.registry],
  });

  readonly tombstoned = new Counter({
    name: "idem_tombstoned_total",
    help: "Finished records turned into tombstones by the retention sweep",
    registers: [this.registry],
  });

  readonly retries = new Counter({
    name: "idem_db_retries_total",
    help: "Registry work retried after a transient failure, by SQLSTATE (or 'connection')",
    labelNames: ["cause"] as const,
    registers: [this.registry],
  });

  readonly reservesWaiting = new Gauge({
    name: "idem_reserves_waiting",
    help: "Reserves waiting for an owner in flight (wait_for_owner) on this coordinator; each caller has at most IDEM_WAITERS_PER_CALLER",
    registers: [this.registry],
  });

  readonly readerFallbacks = new Counter({
    name: "idem_db_reader_fallbacks_total",
    help: "Reads meant for the reader (IDEM_DB_READ_URL) served by the registry database instead: why=down (its probe failed) or failed (the read failed there)",
    labelNames: ["why"] as const,
    registers: [this.registry],
  });

  constructor(options: {
    pool: pg.Pool;
    /** Counts the records of every tenant (Registry.census over the cross-tenant pool). */
    census: () => Promise<Census>;
    unknownSloSeconds: number;
    censusMaxAgeMs?: number;
  }) {
    collectDefaultMetrics({ register: this.registry, prefix: "idem_" });
    const { pool } = options;
    new Gauge({
      name: "idem_db_pool_connections",
      help: "Registry pool connections: total open, idle, and requests waiting for one",
      labelNames: ["state"] as const,
      registers: [this.registry],
      collect() {
        this.set({ state: "total" }, pool.totalCount);
        this.set({ state: "idle" }, pool.idleCount);
        this.set({ state: "waiting" }, pool.waitingCount);
      },
    });
    new Gauge({
      name: "idem_unknown_recovery_slo_seconds",
      help: "How long a record may stay UNKNOWN before it breaches the recovery SLO (IDEM_UNKNOWN_SLO_SECONDS)",
      registers: [this.registry],
    }).set(options.unknownSloSeconds);

    // Counting records scans the table: do it at most every censusMaxAgeMs, whatever the scrape rate.
    const census = cached(options.census, options.censusMaxAgeMs ?? 15_000);
    new Gauge({
      name: "idem_records",
      help: "Records by state (tombstones excluded)",
      labelNames: ["state"] as const,
      registers: [this.registry],
      async collect() {
        const { byState } = await census();
        for (const state of RECORD_STATES.words) this.set({ state }, byState.get(state) ?? 0);
      },
    });
    new Gauge({
      name: "idem_unknown_oldest_age_seconds",
      help: "Age of the oldest UNKNOWN record (0 when there is none); compare with idem_unknown_recovery_slo_seconds",
      registers: [this.registry],
      async collect() {
        this.set((await census()).oldestUnknownSeconds);
      },
    });
    new Gauge({
      name: "idem_records_overdue",
      help: "Unfinished records without a lease (released, or lease cleared) untouched for over a day: nobody is retrying them",
      registers: [this.registry],
      async collect() {
        this.set((await census()).overdue);
      },
    });
  }

  /** Times every RPC and counts refusals by reason. */
  interceptor(): Interceptor {
    return (next) => async (req) => {
      const startedAt = performance.now();
      try {
        const res = await next(req);
        this.observeCall(req.service.typeName, req.method.name, startedAt);
        return res;
      } catch (error) {
        this.observeCall(req.service.typeName, req.method.name, startedAt, error);
        throw error;
      }
    };
  }

  /**
   * Times one call since `startedAt` (performance.now()) and counts its
   * refusal, if any: an RPC, or one call of a Batch under the name of its own
   * RPC, so that a method's numbers mean the same whether its calls come
   * alone or batched.
   */
  observeCall(service: string, method: string, startedAt: number, error?: unknown): void {
    const seconds = (performance.now() - startedAt) / 1000;
    if (error === undefined) {
      this.rpcDuration.observe({ service, method, code: "ok" }, seconds);
      return;
    }
    const connectError = ConnectError.from(error);
    this.rpcDuration.observe({ service, method, code: Code[connectError.code] ?? String(connectError.code) }, seconds);
    this.refusals.inc({ method, reason: reasonOf(connectError) ?? "NONE" });
  }
}

/** The reason of a refusal as errorMapping built it (framework refusals carry none). */
function reasonOf(error: ConnectError): string | undefined {
  for (const detail of error.details) {
    if ("desc" in detail && detail.desc.typeName === ErrorInfoSchema.typeName) return (detail.value as { reason?: string }).reason;
  }
  return undefined;
}

/** `load`, called at most once per `maxAgeMs`; callers in between share the last result. */
function cached<T>(load: () => Promise<T>, maxAgeMs: number): () => Promise<T> {
  let value: Promise<T> | undefined;
  let loadedAt = 0;
  return () => {
    if (!value || Date.now() - loadedAt > maxAgeMs) {
      loadedAt = Date.now();
      value = load().catch((error: unknown) => {
        value = undefined;
        throw error;
      });
    }
    return value;
  };
}
