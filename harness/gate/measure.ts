import type pg from "pg";
import { scopeDigest } from "../../src/contract/scope.js";
import { PAYMENTS_OPERATION } from "../../examples/payments/policy.js";
import type { Charge } from "../../examples/payments/provider.js";
import { promQuantile, type PromHistogram } from "../lib/prometheus.js";
import type { LogicalRequest, LoadStats } from "./load.js";
import type { GateOptions } from "./options.js";
import { formatDuration, formatInt, formatPercent } from "../lib/format.js";
import { ascending, percentile } from "../lib/histogram.js";

/**
 * After the run: reads the registry, the payments tables and the card
 * provider, joins them with what every client saw, and decides each line of
 * the gate.
 */

export interface Criterion {
  id: string;
  name: string;
  /** The measured value as a number (count, share or milliseconds). */
  value: number;
  /** The measured value as printed. */
  measured: string;
  /** The threshold as printed. */
  threshold: string;
  pass: boolean;
  /** Whether the line comes from the contract's section 9 or is a supplementary check of the gate. */
  source: "contract" | "supplementary";
  detail: Record<string, unknown>;
}

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

interface RecordRow {
  scope: string;
  operation_id: string;
  principal: string;
  state: string;
  recovering: boolean;
  snapshot_status: number | null;
  tombstoned: boolean;
}

interface PaymentRow {
  id: string;
  operation_id: string;
  downstream_key: string;
  amount: string;
  status: string;
  charge_id: string | null;
}

const TERMINAL = new Set(["SUCCEEDED", "FAILED_FINAL", "REJECTED"]);
const SAMPLE_LIMIT = 10;

export async function measure(input: {
  pool: pg.Pool;
  keys: readonly LogicalRequest[];
  stats: LoadStats;
  provider: { charges: Charge[]; chargeRequests: string[] };
  reserve: PromHistogram;
  reserveRpc: PromHistogram;
  options: GateOptions;
}): Promise<Measurement> {
  const { pool, keys, provider, options } = input;
  const samples: Record<string, unknown[]> = {};
  const sample = (kind: string, item: unknown) => {
    const list = (samples[kind] ??= []);
    if (list.length < SAMPLE_LIMIT) list.push(item);
  };

  const [records, payments, outbox, attempts, episodes, now] = await Promise.all([
    pool.query<RecordRow>(
      `SELECT encode(scope, 'hex') AS scope, operation_id::text, principal, state, recovering, snapshot_status,
              tombstoned_at IS NOT NULL AS tombstoned
         FROM idem_record WHERE operation = $1 AND api_revision = $2`,
      [PAYMENTS_OPERATION.operation, PAYMENTS_OPERATION.apiRevision],
    ),
    pool.query<PaymentRow>("SELECT id::text, operation_id::text, downstream_key, amount::text, status, charge_id FROM payments"),
    pool.query<{ payment_id: string; event: string; n: number }>("SELECT payment_id::text, event, count(*)::int AS n FROM payment_outbox GROUP BY 1, 2"),
    pool.query<{ operation_id: string; downstream_key: string; status: string }>("SELECT operation_id::text, downstream_key, status FROM idem_effect_attempt"),
    pool.query<{ operation_id: string; kind: string; at_ms: number }>(
      `SELECT operation_id::text, kind, (extract(epoch FROM at) * 1000)::float8 AS at_ms
         FROM idem_event
        WHERE operation_id IN (SELECT operation_id FROM idem_event WHERE kind = 'UNKNOWN')
          AND kind IN ('UNKNOWN', 'COMPLETED', 'RECONCILED', 'RELEASED')
        ORDER BY operation_id, at, event_id`,
    ),
    pool.query<{ now_ms: number }>("SELECT (extract(epoch FROM now()) * 1000)::float8 AS now_ms"),
  ]);

  // --- indexes -------------------------------------------------------------
  const recordByScope = new Map(records.rows.map((r) => [r.scope, r]));
  const recordByOperation = new Map(records.rows.map((r) => [r.operation_id, r]));
  const keyByOperation = new Map<string, LogicalRequest>();
  const recordOfKey = new Map<LogicalRequest, RecordRow>();
  for (const key of keys) {
    const scope = Buffer.from(
      scopeDigest({
        subject: { tenant: "acme", principal: key.principal },
        operation: PAYMENTS_OPERATION.operation,
        apiRevision: PAYMENTS_OPERATION.apiRevision,
        idempotencyKey: key.key,
      }),
    ).toString("hex");
    const record = recordByScope.get(scope);
    if (record) {
      recordOfKey.set(key, record);
      keyByOperation.set(record.operation_id, key);
    }
  }
  const paymentsByOperation = groupBy(payments.rows, (p) => p.operation_id);
  const paymentByDownstreamKey = new Map(payments.rows.map((p) => [p.downstream_key, p]));
  const operationByDownstreamKey = new Map<string, string>();
  for (const a of attempts.rows) operationByDownstreamKey.set(a.downstream_key, a.operation_id);
  for (const p of payments.rows) operationByDownstreamKey.set(p.downstream_key, p.operation_id);
  const chargesByDownstreamKey = groupBy(provider.charges, (c) => c.idempotencyKey);
  const outboxByPayment = groupBy(outbox.rows, (o) => o.payment_id);

  // --- 1. duplicate logical effects ---------------------------------------
  const dup = {
    keysWithSeveralOperationIds: 0,
    operationIdsNotTheKeysRecord: 0,
    keysWithSeveralChargeIds: 0,
    extraPaymentRows: 0,
    extraChargesPerDownstreamKey: 0,
    extraChargesPerLogicalRequest: 0,
    extraOutboxEvents: 0,
    paymentsWithContradictoryEvents: 0,
    orphanPayments: 0,
    orphanCharges: 0,
    chargesOfDeclinedPayments: 0,
  };
  let duplicateEffects = 0;
  for (const key of keys) {
    const record = recordOfKey.get(key);
    if (key.operationIds.size > 1) {
      dup.keysWithSeveralOperationIds++;
      duplicateEffects += key.operationIds.size - 1;
      sample("severalOperationIds", { key: key.key, operationIds: [...key.operationIds] });
    }
    if (record) {
      const foreign = [...key.operationIds].filter((id) => id !== record.operation_id);
      if (foreign.length > 0) {
        dup.operationIdsNotTheKeysRecord += foreign.length;
        duplicateEffects += key.operationIds.size > 1 ? 0 : foreign.length;
        sample("operationIdNotTheKeysRecord", { key: key.key, record: record.operation_id, seen: foreign });
      }
    }
    if (key.chargeIds.size > 1) {
      dup.keysWithSeveralChargeIds++;
      duplicateEffects += key.chargeIds.size - 1;
      sample("severalChargeIds", { key: key.key, chargeIds: [...key.chargeIds] });
    }
  }
  for (const [operationId, rows] of paymentsByOperation) {
    if (rows.length > 1) {
      dup.extraPaymentRows += rows.length - 1;
      duplicateEffects += rows.length - 1;
      sample("extraPaymentRows", { operationId, rows: rows.length });
    }
    if (!keyByOperation.has(operationId)) {
      dup.orphanPayments += rows.length;
      duplicateEffects += rows.length;
      sample("orphanPayments", { operationId, record: recordByOperation.get(operationId)?.state ?? "none" });
    }
  }
  const chargesPerLogicalRequest = new Map<LogicalRequest, Set<string>>();
  for (const [downstreamKey, charges] of chargesByDownstreamKey) {
    if (charges.length > 1) {
      dup.extraChargesPerDownstreamKey += charges.length - 1;
      duplicateEffects += charges.length - 1;
      sample("extraChargesPerDownstreamKey", { downstreamKey, charges: charges.map((c) => c.id) });
    }
    const operationId = operationByDownstreamKey.get(downstreamKey);
    const key = operationId ? keyByOperation.get(operationId) : undefined;
    if (!key) {
      dup.orphanCharges += charges.length;
      duplicateEffects += charges.length;
      sample("orphanCharges", { downstreamKey, charges: charges.map((c) => c.id) });
      continue;
    }
    const seen = chargesPerLogicalRequest.get(key) ?? new Set<string>();
    seen.add(downstreamKey);
    chargesPerLogicalRequest.set(key, seen);
    const payment = paymentByDownstreamKey.get(downstreamKey);
    if (payment?.status === "declined") {
      dup.chargesOfDeclinedPayments += charges.length;
      duplicateEffects += charges.length;
      sample("chargesOfDeclinedPayments", { key: key.key, downstreamKey });
    }
  }
  for (const [key, downstreamKeys] of chargesPerLogicalRequest) {
    // One logical request, charges under several downstream keys: effects of several operations.
    if (downstreamKeys.size > 1) {
      dup.extraChargesPerLogicalRequest += downstreamKeys.size - 1;
      duplicateEffects += downstreamKeys.size - 1;
      sample("extraChargesPerLogicalRequest", { key: key.key, downstreamKeys: [...downstreamKeys] });
    }
  }
  for (const [paymentId, events] of outboxByPayment) {
    for (const e of events) {
      if (e.n > 1) {
        dup.extraOutboxEvents += e.n - 1;
        duplicateEffects += e.n - 1;
        sample("extraOutboxEvents", { paymentId, event: e.event, rows: e.n });
      }
    }
    if (new Set(events.map((e) => e.event)).size > 1) {
      dup.paymentsWithContradictoryEvents++;
      duplicateEffects++;
      sample("contradictoryOutboxEvents", { paymentId, events: events.map((e) => e.event) });
    }
  }

  // --- 2. false payload conflicts -------------------------------------------
  const falseConflicts = { total: 0, identical: 0, reordered: 0, reworded: 0, keys: 0 };
  for (const key of keys) {
    if (key.falseConflicts.length === 0) continue;
    falseConflicts.keys++;
    for (const f of key.falseConflicts) {
      falseConflicts.total++;
      if (f.variant === "identical" || f.variant === "reordered" || f.variant === "reworded") falseConflicts[f.variant]++;
    }
    sample("falseConflicts", { key: key.key, sends: key.falseConflicts });
  }
  const samePayloadSends = input.stats.byVariant.identical + input.stats.byVariant.reordered + input.stats.byVariant.reworded;

  // --- 3. replay snapshot digest agreement ----------------------------------
  let keysWithSnapshots = 0;
  let keysAgreeing = 0;
  let keysWithReplays = 0;
  let snapshotAnswers = 0;
  for (const key of keys) {
    if (key.snapshots.size === 0) continue;
    keysWithSnapshots++;
    let answers = 0;
    for (const n of key.snapshots.values()) answers += n;
    snapshotAnswers += answers;
    if (answers > 1) keysWithReplays++;
    if (key.snapshots.size === 1) keysAgreeing++;
    else sample("digestDisagreement", { key: key.key, first: key.firstSnapshot, differing: key.differingSnapshot, distinct: key.snapshots.size });
  }
  const agreement = keysWithSnapshots === 0 ? Number.NaN : keysAgreeing / keysWithSnapshots;

  // --- 4. UNKNOWN beyond the recovery SLO -----------------------------------
  const nowMs = now.rows[0]!.now_ms;
  let everUnknown = 0;
  let overSlo = 0;
  let openOverSlo = 0;
  let longestUnknownMs = 0;
  const unknownDurations: number[] = [];
  for (const [operationId, events] of groupBy(episodes.rows, (e) => e.operation_id)) {
    everUnknown++;
    let openedAt: number | undefined;
    let longest = 0;
    let open = false;
    for (const e of events) {
      if (e.kind === "UNKNOWN") {
        openedAt ??= e.at_ms;
      } else if (openedAt !== undefined) {
        longest = Math.max(longest, e.at_ms - openedAt);
        openedAt = undefined;
      }
    }
    if (openedAt !== undefined) {
      longest = Math.max(longest, nowMs - openedAt);
      open = true;
    }
    unknownDurations.push(longest);
    longestUnknownMs = Math.max(longestUnknownMs, longest);
    if (longest > options.recoverySloMs) {
      overSlo++;
      if (open) openOverSlo++;
      sample("unknownBeyondSlo", { operationId, unknownForMs: Math.round(longest), stillUnknown: open, state: recordByOperation.get(operationId)?.state });
    }
  }
  const unknownSorted = ascending(unknownDurations);
  const unknownAt = (q: number) => (unknownSorted.length === 0 ? 0 : percentile(unknownSorted, q));
  const byState: Record<string, number> = {};
  for (const r of records.rows) byState[r.state] = (byState[r.state] ?? 0) + 1;
  const stillUnknown = byState.UNKNOWN ?? 0;
  const recoveringNow = records.rows.filter((r) => r.recovering).length;
  const unknownShare = records.rows.length === 0 ? 0 : overSlo / records.rows.length;

  // --- 5. P99 of the reservation transaction -------------------------------
  const reserve = summarize(input.reserve);
  const reserveRpc = summarize(input.reserveRpc);
  const reserveLimitMs = options.latencyBudgetMs * options.reserveBudgetShare;

  // --- supplementary: true conflicts refused ---------------------------------
  const conflicts = { planned: 0, sent: 0, refused: 0, missed: 0, skipped: 0, abandoned: 0, byStatus: {} as Record<string, number> };
  for (const key of keys) {
    if (!key.conflictPlanned) continue;
    conflicts.planned++;
    const r = key.conflictResult;
    if (r === undefined || r === "skipped") conflicts.skipped++;
    else if (r === "abandoned") conflicts.abandoned++;
    else {
      conflicts.sent++;
      conflicts.byStatus[r] = (conflicts.byStatus[r] ?? 0) + 1;
      if (r === 422) conflicts.refused++;
      else {
        conflicts.missed++;
        sample("conflictNotRefused", { key: key.key, status: r, body: key.conflictBody });
      }
    }
  }

  // --- supplementary: registry, business tables, provider and clients agree --
  const consistency = {
    succeededWithoutCapturedPayment: 0,
    capturedWithoutMatchingCharge: 0,
    amountDiffersFromFirstRequest: 0,
    declinedButCharged: 0,
    settledWithoutOutboxEvent: 0,
    capturedPaymentOfUnsettledRecord: 0,
    clientStatusDiffersFromRecord: 0,
  };
  let checkedRecords = 0;
  for (const key of keys) {
    const record = recordOfKey.get(key);
    if (!record) continue;
    const rows = paymentsByOperation.get(record.operation_id) ?? [];
    const payment = rows[0];
    if (payment && Number(payment.amount) !== key.payload.amount) {
      consistency.amountDiffersFromFirstRequest++;
      sample("amountDiffers", { key: key.key, paid: payment.amount, requested: key.payload.amount });
    }
    if (!TERMINAL.has(record.state)) {
      if (payment?.status === "captured") {
        consistency.capturedPaymentOfUnsettledRecord++;
        sample("capturedPaymentOfUnsettledRecord", { key: key.key, state: record.state });
      }
      continue;
    }
    checkedRecords++;
    if (key.firstSnapshot && record.snapshot_status !== null && key.firstSnapshot.status !== record.snapshot_status) {
      consistency.clientStatusDiffersFromRecord++;
      sample("clientStatusDiffersFromRecord", { key: key.key, client: key.firstSnapshot.status, record: record.snapshot_status });
    }
    if (record.snapshot_status === 201) {
      const charges = payment ? (chargesByDownstreamKey.get(payment.downstream_key) ?? []) : [];
      if (payment?.status !== "captured") {
        consistency.succeededWithoutCapturedPayment++;
        sample("succeededWithoutCapturedPayment", { key: key.key, payment: payment?.status ?? "none" });
      } else if (!charges.some((c) => c.id === payment.charge_id && c.amount === key.payload.amount)) {
        consistency.capturedWithoutMatchingCharge++;
        sample("capturedWithoutMatchingCharge", { key: key.key, chargeId: payment.charge_id });
      }
    }
    if (payment?.status === "declined" && (chargesByDownstreamKey.get(payment.downstream_key)?.length ?? 0) > 0) consistency.declinedButCharged++;
    if (payment && payment.status !== "pending" && !(outboxByPayment.get(payment.id) ?? []).some((e) => e.event === `payment.${payment.status}`)) {
      consistency.settledWithoutOutboxEvent++;
      sample("settledWithoutOutboxEvent", { key: key.key, payment: payment.id });
    }
  }
  const inconsistencies = Object.values(consistency).reduce((a, b) => a + b, 0);

  // --- supplementary: nothing a client was told is missing from the registry --
  // What survives a crash or a failover must include every decision a client
  // was answered with: its acceptance (an operation id), the effect it saw
  // (a charge, registered as an attempt) and its outcome (a snapshot answer).
  const lost = { acceptances: 0, operationIds: 0, effectAttempts: 0, outcomes: 0 };
  const attemptKeys = new Set(attempts.rows.map((a) => a.downstream_key));
  const paymentByCharge = new Map(payments.rows.filter((p) => p.charge_id !== null).map((p) => [p.charge_id, p]));
  for (const key of keys) {
    const record = recordOfKey.get(key);
    if (key.acceptedSeen && !record) {
      lost.acceptances++;
      sample("acceptanceLost", { key: key.key });
    }
    for (const operationId of key.operationIds) {
      if (!recordByOperation.has(operationId)) {
        lost.operationIds++;
        sample("operationIdLost", { key: key.key, operationId });
      }
    }
    // A tombstone (the retention sweep) keeps the record's state and drops its attempts and snapshot by design.
    const swept = record?.tombstoned ?? false;
    for (const chargeId of key.chargeIds) {
      const payment = paymentByCharge.get(chargeId);
      if (!payment || (!swept && !attemptKeys.has(payment.downstream_key))) {
        lost.effectAttempts++;
        sample("effectAttemptLost", { key: key.key, chargeId, payment: payment?.id ?? "none" });
      }
    }
    if (key.firstSnapshot && (!record || !TERMINAL.has(record.state) || (!swept && record.snapshot_status !== key.firstSnapshot.status))) {
      lost.outcomes++;
      sample("outcomeLost", { key: key.key, client: key.firstSnapshot.status, record: record ? `${record.state} ${record.snapshot_status ?? ""}` : "none" });
    }
  }
  const decisionsLost = Object.values(lost).reduce((a, b) => a + b, 0);

  // --- facts -------------------------------------------------------------------
  const answeredKeys = keys.filter((k) => k.finalStatus !== undefined).length;
  const abandonedChains = keys.reduce((sum, k) => sum + k.abandonedChains, 0);
  const unsettled = records.rows.filter((r) => !TERMINAL.has(r.state)).length;
  const paymentsByStatus: Record<string, number> = {};
  for (const p of payments.rows) paymentsByStatus[p.status] = (paymentsByStatus[p.status] ?? 0) + 1;
  const outboxRows = outbox.rows.reduce((sum, o) => sum + o.n, 0);

  const criteria: Criterion[] = [
    {
      id: "duplicate-effects",
      name: "duplicate logical effects",
      value: duplicateEffects,
      measured: formatInt(duplicateEffects),
      threshold: "= 0",
      pass: duplicateEffects === 0,
      source: "contract",
      detail: {
        ...dup,
        logicalRequests: keys.length,
        keysMatchedToRecords: recordOfKey.size,
        payments: payments.rows.length,
        providerCharges: provider.charges.length,
        providerChargeRequests: provider.chargeRequests.length,
        outboxRows,
      },
    },
    {
      id: "false-conflicts",
      name: "false payload-conflict hits",
      value: falseConflicts.total,
      measured: formatInt(falseConflicts.total),
      threshold: "= 0",
      pass: falseConflicts.total === 0,
      source: "contract",
      detail: {
        ...falseConflicts,
        samePayloadSends,
        samePayloadSendsByVariant: { identical: input.stats.byVariant.identical, reordered: input.stats.byVariant.reordered, reworded: input.stats.byVariant.reworded },
      },
    },
    {
      id: "digest-agreement",
      name: "replay snapshot digest agreement",
      value: agreement,
      measured: Number.isNaN(agreement) ? "n/a" : formatPercent(agreement, agreement === 1 ? 0 : 3),
      threshold: "= 100 %",
      pass: keysWithSnapshots > 0 && keysAgreeing === keysWithSnapshots,
      source: "contract",
      detail: { keysWithSnapshots, keysAgreeing, keysWithReplays, snapshotAnswers, replayedAnswers: input.stats.replayedAnswers },
    },
    {
      id: "unknown-beyond-slo",
      name: `UNKNOWN records older than the recovery SLO (${formatDuration(options.recoverySloMs)})`,
      value: unknownShare,
      measured: `${formatPercent(unknownShare, 4)} (${formatInt(overSlo)} of ${formatInt(records.rows.length)})`,
      threshold: `< ${formatPercent(options.unknownMaxShare, 2)}`,
      pass: unknownShare < options.unknownMaxShare,
      source: "contract",
      detail: {
        records: records.rows.length,
        everUnknown,
        beyondSlo: overSlo,
        beyondSloStillUnknown: openOverSlo,
        stillUnknown,
        recoveringNow,
        longestUnknownMs: Math.round(longestUnknownMs),
        p50UnknownMs: Math.round(unknownAt(0.5)),
        p99UnknownMs: Math.round(unknownAt(0.99)),
        recoverySloMs: options.recoverySloMs,
      },
    },
    {
      id: "reserve-p99",
      name: "P99 of the reservation transaction",
      value: reserve.p99Ms,
      measured: Number.isNaN(reserve.p99Ms)
        ? "no data"
        : `${reserve.beyond ? "> " : ""}${reserve.p99Ms.toFixed(1)} ms (${formatPercent(reserve.p99Ms / options.latencyBudgetMs, 1)} of ${options.latencyBudgetMs} ms)`,
      threshold: `<= ${formatPercent(options.reserveBudgetShare, 0)} of budget (${reserveLimitMs.toFixed(0)} ms)`,
      pass: reserve.count > 0 && !reserve.beyond && reserve.p99Ms <= reserveLimitMs,
      source: "contract",
      detail: {
        ...reserve,
        latencyBudgetMs: options.latencyBudgetMs,
        limitMs: reserveLimitMs,
        buckets: input.reserve.buckets.map((b) => ({ le: Number.isFinite(b.le) ? b.le : "+Inf", count: b.count })),
      },
    },
    {
      id: "conflicts-refused",
      name: "true payload conflicts answered 422",
      value: conflicts.sent === 0 ? Number.NaN : conflicts.refused / conflicts.sent,
      measured:
        conflicts.sent === 0
          ? "n/a (none sent)"
          : `${formatPercent(conflicts.refused / conflicts.sent, conflicts.refused === conflicts.sent ? 0 : 2)} (${formatInt(conflicts.refused)} of ${formatInt(conflicts.sent)})`,
      threshold: "= 100 %",
      pass: conflicts.missed === 0,
      source: "supplementary",
      detail: conflicts,
    },
    {
      id: "acknowledged-lost",
      name: "acknowledged decisions lost",
      value: decisionsLost,
      measured: formatInt(decisionsLost),
      threshold: "= 0",
      pass: decisionsLost === 0,
      source: "supplementary",
      detail: lost,
    },
    {
      id: "consistency",
      name: "registry, payments, outbox and provider agree",
      value: inconsistencies,
      measured: `${formatInt(inconsistencies)} mismatches`,
      threshold: "= 0",
      pass: inconsistencies === 0,
      source: "supplementary",
      detail: { ...consistency, terminalRecordsChecked: checkedRecords },
    },
  ];
  // Under registry faults the latency line measures the failovers, not the request path: it is reported among the facts.
  if (!options.judgeReserveLatency)
    criteria.splice(
      criteria.findIndex((c) => c.id === "reserve-p99"),
      1,
    );

  const facts = [
    {
      name: "HTTP requests sent",
      value: `${formatInt(input.stats.sent)}${input.stats.refused ? ` (and ${formatInt(input.stats.refused)} connection attempts refused while the service was down, not counted)` : ""}`,
    },
    {
      name: "logical requests (keys)",
      value: `${formatInt(keys.length)}, ${formatPercent(keys.length ? answeredKeys / keys.length : 0, 2)} got a final answer${abandonedChains ? `, ${formatInt(abandonedChains)} client copies gave up` : ""}`,
    },
    {
      name: "records by state",
      value: Object.entries(byState)
        .sort()
        .map(([s, n]) => `${s} ${formatInt(n)}`)
        .join(", "),
    },
    {
      name: "payments by status",
      value:
        Object.entries(paymentsByStatus)
          .sort()
          .map(([s, n]) => `${s} ${formatInt(n)}`)
          .join(", ") || "none",
    },
    { name: "provider charges", value: `${formatInt(provider.charges.length)} (from ${formatInt(provider.chargeRequests.length)} charge requests)` },
    { name: "records ever UNKNOWN", value: `${formatInt(everUnknown)}, longest ${formatDuration(longestUnknownMs)}, ${formatInt(stillUnknown)} still UNKNOWN` },
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

  return {
    criteria,
    facts,
    registry: { records: records.rows.length, byState, everUnknown, stillUnknown, unsettled },
    business: { payments: payments.rows.length, byStatus: paymentsByStatus, outboxRows },
    provider: { charges: provider.charges.length, chargeRequests: provider.chargeRequests.length },
    reserve,
    reserveRpc,
    samples,
  };
}

/** Count, interpolated quantiles and mean of a merged Prometheus histogram. */
function summarize(h: PromHistogram): HistogramSummary {
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

/** Records not yet settled: UNKNOWN, or holding a lease (an owner or a recovery worker is at work). */
export async function unsettledCounts(pool: pg.Pool): Promise<{ unknown: number; leased: number; recovering: number }> {
  const { rows } = await pool.query<{ unknown: number; leased: number; recovering: number }>(
    `SELECT count(*) FILTER (WHERE state = 'UNKNOWN')::int AS unknown,
            count(*) FILTER (WHERE state IN ('RESERVED', 'EXECUTING') AND lease_expires_at IS NOT NULL)::int AS leased,
            count(*) FILTER (WHERE recovering)::int AS recovering
       FROM idem_record`,
  );
  return rows[0]!;
}

function groupBy<T, K>(items: readonly T[], keyOf: (item: T) => K): Map<K, T[]> {
  const map = new Map<K, T[]>();
  for (const item of items) {
    const k = keyOf(item);
    const list = map.get(k);
    if (list) list.push(item);
    else map.set(k, [item]);
  }
  return map;
}
