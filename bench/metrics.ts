/**
 * What the benchmark reads of the coordinator's /metrics (its own RPC timer,
 * idem_rpc_duration_seconds): the calls it answered, and how long it took
 * over them, by method.
 */
import { CoordinatorService } from "../src/gen/idempotency/v1/coordinator_pb.js";
import { promTotalsBy, type PromTotals } from "../harness/lib/prometheus.js";

/** Count and seconds of the coordinator's own RPC timer (idem_rpc_duration_seconds on /metrics) of the calls it answered, by method. */
export async function handlerTimes(adminUrl: string): Promise<PromTotals> {
  const text = await fetch(`${adminUrl}/metrics`).then(
    (r) => r.text(),
    () => "",
  );
  return promTotalsBy(text, "idem_rpc_duration_seconds", "method", { code: "ok" });
}

/** Mean server-side time of a method between two scrapes, in ms (undefined without /metrics). */
export function handlerMean(before: PromTotals, after: PromTotals, method: string): number | undefined {
  const a = after[method];
  const b = before[method] ?? { count: 0, seconds: 0 };
  if (!a || a.count <= b.count) return undefined;
  return ((a.seconds - b.seconds) / (a.count - b.count)) * 1000;
}

/**
 * Calls the coordinator answered, by method, from /metrics
 * (idem_rpc_duration_seconds_count of its CoordinatorService, every code).
 * A Batch RPC counts as itself and each call it carries under that call's
 * method; undefined without /metrics.
 */
export async function coordinatorCalls(adminUrl: string): Promise<Map<string, number> | undefined> {
  const text = await fetch(`${adminUrl}/metrics`).then(
    (r) => (r.ok ? r.text() : ""),
    () => "",
  );
  if (!text.includes("idem_rpc_duration_seconds_count")) return undefined;
  const byMethod = promTotalsBy(text, "idem_rpc_duration_seconds", "method", { service: CoordinatorService.typeName });
  return new Map(Object.entries(byMethod).map(([method, { count }]) => [method, count]));
}

/** Calls per request by method between two scrapes (methods with none left out). */
export function callsPerRequest(before: Map<string, number> | undefined, after: Map<string, number> | undefined, requests: number): Record<string, number> | undefined {
  if (!before || !after || requests <= 0) return undefined;
  const per: Record<string, number> = {};
  for (const [method, count] of after) {
    const made = count - (before.get(method) ?? 0);
    if (made > 0) per[method] = made / requests;
  }
  return per;
}
