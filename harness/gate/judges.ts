import type { Criterion } from "../lib/criterion.js";
import { formatDuration, formatInt, formatPercent } from "../lib/format.js";
import { ascending, percentile } from "../lib/histogram.js";
import { promSummary } from "../lib/prometheus.js";
import { longestUnknownMs, outboxRows, recordsByState, TERMINAL, type RunFacts } from "./facts.js";
import type { LogicalRequest } from "./load.js";
import type { GateOptions } from "./options.js";

/**
 * The gate's lines, each a pure function of the run's facts (facts.ts): the
 * contract's five (docs/contract.md, section 9) and the gate's supplementary
 * ones. Each also gives a few examples of what violated it (keys, operation
 * ids), for the report.
 */

export interface Judged {
  criterion: Criterion;
  /** A few examples of each kind of violation found. */
  examples: Record<string, unknown[]>;
}

const EXAMPLE_LIMIT = 10;

/** Examples of violations by kind, at most EXAMPLE_LIMIT of each, in the order found. */
class Examples {
  readonly byKind: Record<string, unknown[]> = {};
  add(kind: string, item: unknown): void {
    const list = (this.byKind[kind] ??= []);
    if (list.length < EXAMPLE_LIMIT) list.push(item);
  }
}

/** Every line, in the table's order, and the examples of their violations, in the report's. */
export function judgeRun(
  facts: RunFacts,
  options: Pick<GateOptions, "recoverySloMs" | "unknownMaxShare" | "latencyBudgetMs" | "reserveBudgetShare" | "judgeReserveLatency">,
): { criteria: Criterion[]; samples: Record<string, unknown[]> } {
  const duplicates = judgeDuplicateEffects(facts);
  const falseConflicts = judgeFalseConflicts(facts);
  const digests = judgeDigestAgreement(facts);
  const unknown = judgeUnknownBeyondSlo(facts, options);
  const conflicts = judgeConflictsRefused(facts);
  const consistency = judgeConsistency(facts);
  const lost = judgeAcknowledgedLost(facts);
  // Under registry faults the latency line measures the failovers, not the request path: it is reported among the facts.
  const latency = options.judgeReserveLatency ? [judgeReserveP99(facts, options)] : [];
  return {
    criteria: [duplicates, falseConflicts, digests, unknown, ...latency, conflicts, lost, consistency].map((j) => j.criterion),
    samples: Object.assign({}, ...[duplicates, falseConflicts, digests, unknown, conflicts, consistency, lost].map((j) => j.examples)) as Record<string, unknown[]>,
  };
}

/** 1. Duplicate logical effects: a key answered with several operations or charges, a payment, charge or outbox event more than once, or of no key. */
export function judgeDuplicateEffects(facts: RunFacts): Judged {
  const { keys, recordOfKey, keyByOperation, recordByOperation, paymentByDownstreamKey, operationByDownstreamKey } = facts;
  const examples = new Examples();
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
      examples.add("severalOperationIds", { key: key.key, operationIds: [...key.operationIds] });
    }
    if (record) {
      const foreign = [...key.operationIds].filter((id) => id !== record.operation_id);
      if (foreign.length > 0) {
        dup.operationIdsNotTheKeysRecord += foreign.length;
        duplicateEffects += key.operationIds.size > 1 ? 0 : foreign.length;
        examples.add("operationIdNotTheKeysRecord", { key: key.key, record: record.operation_id, seen: foreign });
      }
    }
    if (key.chargeIds.size > 1) {
      dup.keysWithSeveralChargeIds++;
      duplicateEffects += key.chargeIds.size - 1;
      examples.add("severalChargeIds", { key: key.key, chargeIds: [...key.chargeIds] });
    }
  }
  for (const [operationId, rows] of facts.paymentsByOperation) {
    if (rows.length > 1) {
      dup.extraPaymentRows += rows.length - 1;
      duplicateEffects += rows.length - 1;
      examples.add("extraPaymentRows", { operationId, rows: rows.length });
    }
    if (!keyByOperation.has(operationId)) {
      dup.orphanPayments += rows.length;
      duplicateEffects += rows.length;
      examples.add("orphanPayments", { operationId, record: recordByOperation.get(operationId)?.state ?? "none" });
    }
  }
  const chargesPerLogicalRequest = new Map<LogicalRequest, Set<string>>();
  for (const [downstreamKey, charges] of facts.chargesByDownstreamKey) {
    if (charges.length > 1) {
      dup.extraChargesPerDownstreamKey += charges.length - 1;
      duplicateEffects += charges.length - 1;
      examples.add("extraChargesPerDownstreamKey", { downstreamKey, charges: charges.map((c) => c.id) });
    }
    const operationId = operationByDownstreamKey.get(downstreamKey);
    const key = operationId ? keyByOperation.get(operationId) : undefined;
    if (!key) {
      dup.orphanCharges += charges.length;
      duplicateEffects += charges.length;
      examples.add("orphanCharges", { downstreamKey, charges: charges.map((c) => c.id) });
      continue;
    }
    const seen = chargesPerLogicalRequest.get(key) ?? new Set<string>();
    seen.add(downstreamKey);
    chargesPerLogicalRequest.set(key, seen);
    const payment = paymentByDownstreamKey.get(downstreamKey);
    if (payment?.status === "declined") {
      dup.chargesOfDeclinedPayments += charges.length;
      duplicateEffects += charges.length;
      examples.add("chargesOfDeclinedPayments", { key: key.key, downstreamKey });
    }
  }
  for (const [key, downstreamKeys] of chargesPerLogicalRequest) {
    // One logical request, charges under several downstream keys: effects of several operations.
    if (downstreamKeys.size > 1) {
      dup.extraChargesPerLogicalRequest += downstreamKeys.size - 1;
      duplicateEffects += downstreamKeys.size - 1;
      examples.add("extraChargesPerLogicalRequest", { key: key.key, downstreamKeys: [...downstreamKeys] });
    }
  }
  for (const [paymentId, events] of facts.outboxByPayment) {
    for (const e of events) {
      if (e.n > 1) {
        dup.extraOutboxEvents += e.n - 1;
        duplicateEffects += e.n - 1;
        examples.add("extraOutboxEvents", { paymentId, event: e.event, rows: e.n });
      }
    }
    if (new Set(events.map((e) => e.event)).size > 1) {
      dup.paymentsWithContradictoryEvents++;
      duplicateEffects++;
      examples.add("contradictoryOutboxEvents", { paymentId, events: events.map((e) => e.event) });
    }
  }
  return {
    criterion: {
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
        payments: facts.payments.length,
        providerCharges: facts.provider.charges.length,
        providerChargeRequests: facts.provider.chargeRequests.length,
        outboxRows: outboxRows(facts),
      },
    },
    examples: examples.byKind,
  };
}

/** 2. False payload conflicts: a 422 to a send with the key's own payload (the same bytes, or equivalent). */
export function judgeFalseConflicts(facts: RunFacts): Judged {
  const examples = new Examples();
  const falseConflicts = { total: 0, identical: 0, reordered: 0, reworded: 0, keys: 0 };
  for (const key of facts.keys) {
    if (key.falseConflicts.length === 0) continue;
    falseConflicts.keys++;
    for (const f of key.falseConflicts) {
      falseConflicts.total++;
      if (f.variant === "identical" || f.variant === "reordered" || f.variant === "reworded") falseConflicts[f.variant]++;
    }
    examples.add("falseConflicts", { key: key.key, sends: key.falseConflicts });
  }
  const { byVariant } = facts.stats;
  return {
    criterion: {
      id: "false-conflicts",
      name: "false payload-conflict hits",
      value: falseConflicts.total,
      measured: formatInt(falseConflicts.total),
      threshold: "= 0",
      pass: falseConflicts.total === 0,
      source: "contract",
      detail: {
        ...falseConflicts,
        samePayloadSends: byVariant.identical + byVariant.reordered + byVariant.reworded,
        samePayloadSendsByVariant: { identical: byVariant.identical, reordered: byVariant.reordered, reworded: byVariant.reworded },
      },
    },
    examples: examples.byKind,
  };
}

/** 3. Replay snapshot digest agreement: every snapshot answer to a key's own payload the same (status, headers, body). */
export function judgeDigestAgreement(facts: RunFacts): Judged {
  const examples = new Examples();
  let keysWithSnapshots = 0;
  let keysAgreeing = 0;
  let keysWithReplays = 0;
  let snapshotAnswers = 0;
  for (const key of facts.keys) {
    if (key.snapshots.size === 0) continue;
    keysWithSnapshots++;
    let answers = 0;
    for (const n of key.snapshots.values()) answers += n;
    snapshotAnswers += answers;
    if (answers > 1) keysWithReplays++;
    if (key.snapshots.size === 1) keysAgreeing++;
    else examples.add("digestDisagreement", { key: key.key, first: key.firstSnapshot, differing: key.differingSnapshot, distinct: key.snapshots.size });
  }
  const agreement = keysWithSnapshots === 0 ? Number.NaN : keysAgreeing / keysWithSnapshots;
  return {
    criterion: {
      id: "digest-agreement",
      name: "replay snapshot digest agreement",
      value: agreement,
      measured: Number.isNaN(agreement) ? "n/a" : formatPercent(agreement, agreement === 1 ? 0 : 3),
      threshold: "= 100 %",
      pass: keysWithSnapshots > 0 && keysAgreeing === keysWithSnapshots,
      source: "contract",
      detail: { keysWithSnapshots, keysAgreeing, keysWithReplays, snapshotAnswers, replayedAnswers: facts.stats.replayedAnswers },
    },
    examples: examples.byKind,
  };
}

/** 4. UNKNOWN beyond the recovery SLO: the share of records whose longest UNKNOWN episode outlasted it. */
export function judgeUnknownBeyondSlo(facts: RunFacts, options: Pick<GateOptions, "recoverySloMs" | "unknownMaxShare">): Judged {
  const examples = new Examples();
  const { records, unknownEpisodes } = facts;
  let overSlo = 0;
  let openOverSlo = 0;
  for (const episode of unknownEpisodes) {
    if (episode.longestMs > options.recoverySloMs) {
      overSlo++;
      if (episode.open) openOverSlo++;
      examples.add("unknownBeyondSlo", {
        operationId: episode.operationId,
        unknownForMs: Math.round(episode.longestMs),
        stillUnknown: episode.open,
        state: facts.recordByOperation.get(episode.operationId)?.state,
      });
    }
  }
  const durations = ascending(unknownEpisodes.map((e) => e.longestMs));
  const unknownAt = (q: number) => (durations.length === 0 ? 0 : percentile(durations, q));
  const unknownShare = records.length === 0 ? 0 : overSlo / records.length;
  return {
    criterion: {
      id: "unknown-beyond-slo",
      name: `UNKNOWN records older than the recovery SLO (${formatDuration(options.recoverySloMs)})`,
      value: unknownShare,
      measured: `${formatPercent(unknownShare, 4)} (${formatInt(overSlo)} of ${formatInt(records.length)})`,
      threshold: `< ${formatPercent(options.unknownMaxShare, 2)}`,
      pass: unknownShare < options.unknownMaxShare,
      source: "contract",
      detail: {
        records: records.length,
        everUnknown: unknownEpisodes.length,
        beyondSlo: overSlo,
        beyondSloStillUnknown: openOverSlo,
        stillUnknown: recordsByState(facts).UNKNOWN ?? 0,
        recoveringNow: records.filter((r) => r.recovering).length,
        longestUnknownMs: Math.round(longestUnknownMs(facts)),
        p50UnknownMs: Math.round(unknownAt(0.5)),
        p99UnknownMs: Math.round(unknownAt(0.99)),
        recoverySloMs: options.recoverySloMs,
      },
    },
    examples: examples.byKind,
  };
}

/**
 * 5. The P99 of the reservation transaction against its share of the API's
 * latency budget, interpolated in the coordinators' histogram buckets; one
 * beyond the last finite bucket fails.
 */
export function judgeReserveP99(facts: RunFacts, options: Pick<GateOptions, "latencyBudgetMs" | "reserveBudgetShare">): Judged {
  const reserve = promSummary(facts.reserve);
  const limitMs = options.latencyBudgetMs * options.reserveBudgetShare;
  return {
    criterion: {
      id: "reserve-p99",
      name: "P99 of the reservation transaction",
      value: reserve.p99Ms,
      measured: Number.isNaN(reserve.p99Ms)
        ? "no data"
        : `${reserve.beyond ? "> " : ""}${reserve.p99Ms.toFixed(1)} ms (${formatPercent(reserve.p99Ms / options.latencyBudgetMs, 1)} of ${options.latencyBudgetMs} ms)`,
      threshold: `<= ${formatPercent(options.reserveBudgetShare, 0)} of budget (${limitMs.toFixed(0)} ms)`,
      pass: reserve.count > 0 && !reserve.beyond && reserve.p99Ms <= limitMs,
      source: "contract",
      detail: {
        ...reserve,
        latencyBudgetMs: options.latencyBudgetMs,
        limitMs,
        buckets: facts.reserve.buckets.map((b) => ({ le: Number.isFinite(b.le) ? b.le : "+Inf", count: b.count })),
      },
    },
    examples: {},
  };
}

/** Supplementary: every true conflict (the key sent again with another amount, once accepted) answered 422. */
export function judgeConflictsRefused(facts: RunFacts): Judged {
  const examples = new Examples();
  const conflicts = { planned: 0, sent: 0, refused: 0, missed: 0, skipped: 0, abandoned: 0, byStatus: {} as Record<string, number> };
  for (const key of facts.keys) {
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
        examples.add("conflictNotRefused", { key: key.key, status: r, body: key.conflictBody });
      }
    }
  }
  return {
    criterion: {
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
    examples: examples.byKind,
  };
}

/** Supplementary: the registry, the payments tables, the outbox, the provider and what the clients were told agree. */
export function judgeConsistency(facts: RunFacts): Judged {
  const examples = new Examples();
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
  for (const key of facts.keys) {
    const record = facts.recordOfKey.get(key);
    if (!record) continue;
    const rows = facts.paymentsByOperation.get(record.operation_id) ?? [];
    const payment = rows[0];
    if (payment && Number(payment.amount) !== key.payload.amount) {
      consistency.amountDiffersFromFirstRequest++;
      examples.add("amountDiffers", { key: key.key, paid: payment.amount, requested: key.payload.amount });
    }
    if (!TERMINAL.has(record.state)) {
      if (payment?.status === "captured") {
        consistency.capturedPaymentOfUnsettledRecord++;
        examples.add("capturedPaymentOfUnsettledRecord", { key: key.key, state: record.state });
      }
      continue;
    }
    checkedRecords++;
    if (key.firstSnapshot && record.snapshot_status !== null && key.firstSnapshot.status !== record.snapshot_status) {
      consistency.clientStatusDiffersFromRecord++;
      examples.add("clientStatusDiffersFromRecord", { key: key.key, client: key.firstSnapshot.status, record: record.snapshot_status });
    }
    if (record.snapshot_status === 201) {
      const charges = payment ? (facts.chargesByDownstreamKey.get(payment.downstream_key) ?? []) : [];
      if (payment?.status !== "captured") {
        consistency.succeededWithoutCapturedPayment++;
        examples.add("succeededWithoutCapturedPayment", { key: key.key, payment: payment?.status ?? "none" });
      } else if (!charges.some((c) => c.id === payment.charge_id && c.amount === key.payload.amount)) {
        consistency.capturedWithoutMatchingCharge++;
        examples.add("capturedWithoutMatchingCharge", { key: key.key, chargeId: payment.charge_id });
      }
    }
    if (payment?.status === "declined" && (facts.chargesByDownstreamKey.get(payment.downstream_key)?.length ?? 0) > 0) consistency.declinedButCharged++;
    if (payment && payment.status !== "pending" && !(facts.outboxByPayment.get(payment.id) ?? []).some((e) => e.event === `payment.${payment.status}`)) {
      consistency.settledWithoutOutboxEvent++;
      examples.add("settledWithoutOutboxEvent", { key: key.key, payment: payment.id });
    }
  }
  const inconsistencies = Object.values(consistency).reduce((a, b) => a + b, 0);
  return {
    criterion: {
      id: "consistency",
      name: "registry, payments, outbox and provider agree",
      value: inconsistencies,
      measured: `${formatInt(inconsistencies)} mismatches`,
      threshold: "= 0",
      pass: inconsistencies === 0,
      source: "supplementary",
      detail: { ...consistency, terminalRecordsChecked: checkedRecords },
    },
    examples: examples.byKind,
  };
}

/**
 * Supplementary: nothing a client was told is missing from the registry.
 * What survives a crash or a failover must include every decision a client
 * was answered with: its acceptance (an operation id), the effect it saw (a
 * charge, registered as an attempt) and its outcome (a snapshot answer).
 */
export function judgeAcknowledgedLost(facts: RunFacts): Judged {
  const examples = new Examples();
  const lost = { acceptances: 0, operationIds: 0, effectAttempts: 0, outcomes: 0 };
  const attemptKeys = new Set(facts.attempts.map((a) => a.downstream_key));
  const paymentByCharge = new Map(facts.payments.filter((p) => p.charge_id !== null).map((p) => [p.charge_id, p]));
  for (const key of facts.keys) {
    const record = facts.recordOfKey.get(key);
    if (key.acceptedSeen && !record) {
      lost.acceptances++;
      examples.add("acceptanceLost", { key: key.key });
    }
    for (const operationId of key.operationIds) {
      if (!facts.recordByOperation.has(operationId)) {
        lost.operationIds++;
        examples.add("operationIdLost", { key: key.key, operationId });
      }
    }
    // A tombstone (the retention sweep) keeps the record's state and drops its attempts and snapshot by design.
    const swept = record?.tombstoned ?? false;
    for (const chargeId of key.chargeIds) {
      const payment = paymentByCharge.get(chargeId);
      if (!payment || (!swept && !attemptKeys.has(payment.downstream_key))) {
        lost.effectAttempts++;
        examples.add("effectAttemptLost", { key: key.key, chargeId, payment: payment?.id ?? "none" });
      }
    }
    if (key.firstSnapshot && (!record || !TERMINAL.has(record.state) || (!swept && record.snapshot_status !== key.firstSnapshot.status))) {
      lost.outcomes++;
      examples.add("outcomeLost", { key: key.key, client: key.firstSnapshot.status, record: record ? `${record.state} ${record.snapshot_status ?? ""}` : "none" });
    }
  }
  const decisionsLost = Object.values(lost).reduce((a, b) => a + b, 0);
  return {
    criterion: {
      id: "acknowledged-lost",
      name: "acknowledged decisions lost",
      value: decisionsLost,
      measured: formatInt(decisionsLost),
      threshold: "= 0",
      pass: decisionsLost === 0,
      source: "supplementary",
      detail: lost,
    },
    examples: examples.byKind,
  };
}
