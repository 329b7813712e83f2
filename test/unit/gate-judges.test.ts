import { describe, expect, it } from "vitest";
import { PAYMENTS_OPERATION } from "../../examples/payments/policy.js";
import type { Charge } from "../../examples/payments/provider.js";
import { runFacts, unknownEpisodes, type PaymentRow, type RecordRow, type RunFacts } from "../../harness/gate/facts.js";
import { judgeAcknowledgedLost, judgeDigestAgreement, judgeDuplicateEffects, judgeFalseConflicts, judgeRun, judgeUnknownBeyondSlo } from "../../harness/gate/judges.js";
import type { LoadStats, LogicalRequest } from "../../harness/gate/load.js";
import { resolveOptions } from "../../harness/gate/options.js";
import { scopeDigest } from "../../src/contract/scope.js";

// The gate's lines are pure functions of the facts a run gathers: a clean run passes each, and
// each catches what it is there for, without a database or a process.

const OPTIONS = resolveOptions({});
const SECOND = 1000;

/** One logical request answered 201 once, with the operation and the charge it was told of. */
function key(index: number, overrides: Partial<LogicalRequest> = {}): LogicalRequest {
  return {
    index,
    key: `gate.test.${index}`,
    principal: "alice",
    token: "alice-token",
    payload: { amount: 100 + index, currency: "EUR", card: "tok_visa", description: `order ${index}` },
    firstBody: Buffer.from("{}"),
    copies: 2,
    lateReplays: 1,
    conflictPlanned: false,
    sent: 3,
    acceptedSeen: true,
    operationIds: new Set([`op-${index}`]),
    chargeIds: new Set([`ch-${index}`]),
    snapshots: new Map([["digest", 3]]),
    firstSnapshot: { status: 201, contentType: "application/json", location: "", etag: "", body: "{}", replayed: false, variant: "identical" },
    finalStatus: 201,
    falseConflicts: [],
    abandonedChains: 0,
    replayed: 2,
    done: true,
    ...overrides,
  };
}

const scopeOf = (k: LogicalRequest) =>
  Buffer.from(
    scopeDigest({
      subject: { tenant: "acme", principal: k.principal },
      operation: PAYMENTS_OPERATION.operation,
      apiRevision: PAYMENTS_OPERATION.apiRevision,
      idempotencyKey: k.key,
    }),
  ).toString("hex");

/** A run in which every key's record, payment, outbox event, attempt and charge are where they belong. */
function facts(keys: LogicalRequest[], change: (rows: { records: RecordRow[]; payments: PaymentRow[]; charges: Charge[] }) => void = () => {}): RunFacts {
  const records: RecordRow[] = keys.map((k) => ({
    scope: scopeOf(k),
    operation_id: `op-${k.index}`,
    principal: k.principal,
    state: "SUCCEEDED",
    recovering: false,
    snapshot_status: 201,
    tombstoned: false,
  }));
  const payments: PaymentRow[] = keys.map((k) => ({
    id: `pay-${k.index}`,
    operation_id: `op-${k.index}`,
    downstream_key: `dk-${k.index}`,
    amount: String(k.payload.amount),
    status: "captured",
    charge_id: `ch-${k.index}`,
  }));
  const charges: Charge[] = keys.map((k) => ({
    id: `ch-${k.index}`,
    idempotencyKey: `dk-${k.index}`,
    amount: k.payload.amount,
    currency: "EUR",
    card: "tok_visa",
    status: "succeeded",
    created: "2026-12-01T10:00:00Z",
  }));
  change({ records, payments, charges });
  return runFacts({
    keys,
    stats: { byVariant: { identical: 6, reordered: 0, reworded: 0, conflicting: 0 }, replayedAnswers: 4, sent: 6, refused: 0 } as unknown as LoadStats,
    records,
    payments,
    outbox: payments.map((p) => ({ payment_id: p.id, event: "payment.captured", n: 1 })),
    attempts: payments.map((p) => ({ operation_id: p.operation_id, downstream_key: p.downstream_key, status: "CONFIRMED" })),
    unknownEpisodes: [],
    provider: { charges, chargeRequests: charges.map((c) => c.idempotencyKey) },
    reserve: {
      buckets: [
        { le: 0.005, count: 99 },
        { le: 0.01, count: 100 },
        { le: Number.POSITIVE_INFINITY, count: 100 },
      ],
      count: 100,
      sumSeconds: 0.3,
    },
    reserveRpc: { buckets: [], count: 0, sumSeconds: 0 },
  });
}

describe("the launch gate's judges", () => {
  it("pass every line of a clean run, in the table's order", () => {
    const { criteria, samples } = judgeRun(facts([key(1), key(2)]), OPTIONS);
    expect(criteria.map((c) => [c.id, c.pass])).toEqual([
      ["duplicate-effects", true],
      ["false-conflicts", true],
      ["digest-agreement", true],
      ["unknown-beyond-slo", true],
      ["reserve-p99", true],
      ["conflicts-refused", true],
      ["acknowledged-lost", true],
      ["consistency", true],
    ]);
    expect(samples).toEqual({});
    // Under registry faults the latency line is not judged.
    expect(judgeRun(facts([key(1)]), { ...OPTIONS, judgeReserveLatency: false }).criteria.map((c) => c.id)).not.toContain("reserve-p99");
  });

  it("count a key answered with two operations, and a charge made twice under one downstream key", () => {
    const line = judgeDuplicateEffects(facts([key(1, { operationIds: new Set(["op-1", "op-9"]) }), key(2)], ({ charges }) => charges.push({ ...charges[1]!, id: "ch-2b" })));
    expect(line.criterion).toMatchObject({ value: 2, pass: false, detail: { keysWithSeveralOperationIds: 1, extraChargesPerDownstreamKey: 1 } });
    // The foreign operation id is shown too, and counted once with the key's second one.
    expect(Object.keys(line.examples)).toEqual(["severalOperationIds", "operationIdNotTheKeysRecord", "extraChargesPerDownstreamKey"]);
  });

  it("count a 422 to a send of the key's own payload as a false conflict", () => {
    const line = judgeFalseConflicts(facts([key(1, { falseConflicts: [{ variant: "reordered", kind: "late" }] })]));
    expect(line.criterion).toMatchObject({ value: 1, pass: false, detail: { reordered: 1, keys: 1, samePayloadSends: 6 } });
  });

  it("measure the share of keys whose snapshot answers all agree", () => {
    const line = judgeDigestAgreement(
      facts([
        key(1),
        key(2, {
          snapshots: new Map([
            ["a", 1],
            ["b", 2],
          ]),
        }),
      ]),
    );
    expect(line.criterion).toMatchObject({ value: 0.5, measured: "50.000 %", pass: false });
    expect(line.examples.digestDisagreement).toHaveLength(1);
  });

  it("judge each record's longest UNKNOWN episode against the recovery SLO, an open one up to now", () => {
    const episodes = unknownEpisodes(
      [
        { operation_id: "op-1", kind: "UNKNOWN", at_ms: 0 },
        { operation_id: "op-1", kind: "COMPLETED", at_ms: 5 * SECOND },
        { operation_id: "op-2", kind: "UNKNOWN", at_ms: 0 },
      ],
      90 * SECOND,
    );
    expect(episodes).toEqual([
      { operationId: "op-1", longestMs: 5 * SECOND, open: false },
      { operationId: "op-2", longestMs: 90 * SECOND, open: true },
    ]);
    const run = { ...facts([key(1), key(2)]), unknownEpisodes: episodes };
    const line = judgeUnknownBeyondSlo(run, { recoverySloMs: 60 * SECOND, unknownMaxShare: 0.0001 });
    expect(line.criterion).toMatchObject({ value: 0.5, pass: false, detail: { everUnknown: 2, beyondSlo: 1, beyondSloStillUnknown: 1, longestUnknownMs: 90_000 } });
    expect(judgeUnknownBeyondSlo(run, { recoverySloMs: 120 * SECOND, unknownMaxShare: 0.0001 }).criterion.pass).toBe(true);
  });

  it("find an acknowledged acceptance with no record, and a charge with no attempt", () => {
    const line = judgeAcknowledgedLost(
      facts([key(1), key(2)], ({ records }) => {
        records.splice(1, 1);
      }),
    );
    expect(line.criterion).toMatchObject({ pass: false, detail: { acceptances: 1, operationIds: 1, outcomes: 1 } });
    const noAttempt = { ...facts([key(1)]), attempts: [] };
    expect(judgeAcknowledgedLost(noAttempt).criterion.detail).toMatchObject({ effectAttempts: 1 });
  });
});
