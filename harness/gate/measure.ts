import type { Criterion } from "../lib/criterion.js";
import { formatDuration, formatInt, formatPercent } from "../lib/format.js";
import { promSummary, type HistogramSummary } from "../lib/prometheus.js";
import { gatherFacts, longestUnknownMs, outboxRows, paymentsByStatus, recordsByState, TERMINAL, type FactSources, type RunFacts } from "./facts.js";
import { judgeRun } from "./judges.js";
import type { GateOptions } from "./options.js";

/**
 * After the run: gathers its facts (facts.ts: the registry, the payments
 * tables, the card provider and what every client saw), judges each line of
 * the gate on them (judges.ts), and sums up what the report shows beside.
 */

export interface Measurement {
  criteria: Criterion[];
  /** Facts of the run shown under the table (no threshold). */
  facts: Array<{ name: string; value: string }>;
  registry: { records: number; byState: Record<string, number>; everUnknown: number; stillUnknown: number; unsettled: number };
  business: { payments: number; byStatus: Record<string, number>; outboxRows: number };
  provider: { charges: number; chargeRequests: number };
  /** The Reserve transaction (BEGIN to COMMIT acknowledged), which the line judges. */
  reserve: HistogramSummary;
  /** The whole Reserve RPC inside the coordinator: the transaction plus waiting for a pooled connection and the event loop. */
  reserveRpc: HistogramSummary;
  /** A few examples of each kind of violation (keys, operation ids), for the report. */
  samples: Record<string, unknown[]>;
}

export async function measure(input: FactSources & { options: GateOptions }): Promise<Measurement> {
  const facts = await gatherFacts(input);
  const { criteria, samples } = judgeRun(facts, input.options);
  const byState = recordsByState(facts);
  return {
    criteria,
    facts: factLines(facts, input.options),
    registry: {
      records: facts.records.length,
      byState,
      everUnknown: facts.unknownEpisodes.length,
      stillUnknown: byState.UNKNOWN ?? 0,
      unsettled: facts.records.filter((r) => !TERMINAL.has(r.state)).length,
    },
    business: { payments: facts.payments.length, byStatus: paymentsByStatus(facts), outboxRows: outboxRows(facts) },
    provider: { charges: facts.provider.charges.length, chargeRequests: facts.provider.chargeRequests.length },
    reserve: promSummary(facts.reserve),
    reserveRpc: promSummary(facts.reserveRpc),
    samples,
  };
}

/** The lines under the gate's table: what was sent and answered, what the registry and the provider hold, how fast Reserve was. */
export function factLines(facts: RunFacts, options: Pick<GateOptions, "judgeReserveLatency">): Array<{ name: string; value: string }> {
  const { keys, stats, provider } = facts;
  const answeredKeys = keys.filter((k) => k.finalStatus !== undefined).length;
  const abandonedChains = keys.reduce((sum, k) => sum + k.abandonedChains, 0);
  const byState = recordsByState(facts);
  const reserve = promSummary(facts.reserve);
  const reserveRpc = promSummary(facts.reserveRpc);
  const counts = (byName: Record<string, number>) =>
    Object.entries(byName)
      .sort()
      .map(([s, n]) => `${s} ${formatInt(n)}`)
      .join(", ");
  return [
    {
      name: "HTTP requests sent",
      value: `${formatInt(stats.sent)}${stats.refused ? ` (and ${formatInt(stats.refused)} connection attempts refused while the service was down, not counted)` : ""}`,
    },
    {
      name: "logical requests (keys)",
      value: `${formatInt(keys.length)}, ${formatPercent(keys.length ? answeredKeys / keys.length : 0, 2)} got a final answer${abandonedChains ? `, ${formatInt(abandonedChains)} client copies gave up` : ""}`,
    },
    { name: "records by state", value: counts(byState) },
    { name: "payments by status", value: counts(paymentsByStatus(facts)) || "none" },
    { name: "provider charges", value: `${formatInt(provider.charges.length)} (from ${formatInt(provider.chargeRequests.length)} charge requests)` },
    {
      name: "records ever UNKNOWN",
      value: `${formatInt(facts.unknownEpisodes.length)}, longest ${formatDuration(longestUnknownMs(facts))}, ${formatInt(byState.UNKNOWN ?? 0)} still UNKNOWN`,
    },
    {
      name: "Reserve transactions measured",
      value:
        `${formatInt(reserve.count)}: P50 ${reserve.p50Ms.toFixed(1)} ms, P90 ${reserve.p90Ms.toFixed(1)} ms, ` +
        `${options.judgeReserveLatency ? "" : `P99 ${reserve.p99Ms.toFixed(1)} ms (not judged: the registry was failed over during the run), `}` +
        `P99.9 ${reserve.beyond ? ">" : ""}${reserve.p999Ms.toFixed(1)} ms`,
    },
    {
      name: "Reserve RPCs, server side (pool wait and queueing included)",
      value: `${formatInt(reserveRpc.count)}: P50 ${reserveRpc.p50Ms.toFixed(1)} ms, P99 ${reserveRpc.beyond ? ">" : ""}${reserveRpc.p99Ms.toFixed(1)} ms`,
    },
  ];
}
