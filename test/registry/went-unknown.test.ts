import { describe, expect, it } from "vitest";
import type { Snapshot } from "../../src/contract/snapshot.js";
import type { OperationRef, StoredRecord } from "../../src/registry/types.js";
import { actor, newKey, reserveInput, testRegistry } from "../support/fixtures.js";
import { useTestDatabase } from "../support/database.js";
import { expectRefusal, expireLease } from "../support/registry-helpers.js";

/**
 * UNKNOWN is for good: once a record has been UNKNOWN, whatever its old owner
 * or a recovery worker says afterwards, no generation executes it again or
 * registers an effect it did not have; an effect that runs again runs under
 * its original downstream key; only an operator's reconciliation, with
 * evidence, reopens it to a fresh execution.
 */

const t = useTestDatabase();

const registry = testRegistry();
const gateway = actor({ caller: "gateway" });
const worker = actor({ caller: "recovery-worker" });
const operator = actor({ caller: "operator", operator: true });

const failed: Snapshot = { statusCode: 502, mediaType: "application/json", location: "", businessVersion: "", headers: [], body: new TextEncoder().encode("{}") };

/** A claimed record whose owner registered `effect` (PENDING) and then went silent: its lease has ended. */
async function silentOwnerWithPendingEffect(effect = "card.charge"): Promise<{ key: string; ref: OperationRef; downstreamKey: string }> {
  const key = newKey();
  const reserved = await registry.reserve(t.db, reserveInput(key, { amount: 10 }, { claim: true }), gateway);
  expect(reserved.decision).toBe("ACCEPTED");
  const ref = { tenant: "acme", operationId: reserved.record!.operationId };
  const attempt = await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect, provider: "cards" }, gateway);
  await expireLease(t.pool, ref.operationId);
  return { key, ref, downstreamKey: attempt.downstreamKey };
}

async function stored(ref: OperationRef): Promise<StoredRecord> {
  return (await registry.lookupById(t.db, { ref }, operator)).record;
}

/** Every way a retry or an owner could run the record again is refused; a retry is told IN_PROGRESS. */
async function expectNeverRunAgain(key: string, ref: OperationRef, generation: number): Promise<void> {
  await expectRefusal(registry.release(t.db, { ref, generation }, gateway), "INVALID_TRANSITION");
  const retry = await registry.reserve(t.db, reserveInput(key, { amount: 10 }, { claim: true }), gateway);
  expect(retry.decision).toBe("IN_PROGRESS");
  const record = await stored(ref);
  expect(record).toMatchObject({ state: "UNKNOWN", wentUnknown: true });
  await expectRefusal(registry.claim(t.db, { ref, mode: "TAKEOVER", generation: record.generation, writerEpoch: 0 }, gateway), "INVALID_TRANSITION");
}

describe("a record that went UNKNOWN", () => {
  it("is never run again after its old owner resolves the pending attempt NO_EFFECT (lease ended, a retry saw it)", async () => {
    const { key, ref } = await silentOwnerWithPendingEffect();
    // The retry finds the lease ended with a possible effect: UNKNOWN.
    expect((await registry.reserve(t.db, reserveInput(key, { amount: 10 }, { claim: true }), gateway)).decision).toBe("IN_PROGRESS");
    expect(await stored(ref)).toMatchObject({ state: "UNKNOWN", wentUnknown: true });

    // The old owner, still at generation 1, says the call did nothing.
    await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "NO_EFFECT", providerHandle: "" }, gateway);
    expect(await stored(ref)).toMatchObject({ state: "UNKNOWN", effectPossible: false, wentUnknown: true });

    await expectNeverRunAgain(key, ref, 1);
    // The old owner may still finish what it knows.
    const done = await registry.complete(t.db, { ref, generation: 1, outcome: "FAILED_FINAL", snapshot: failed }, gateway);
    expect(done.state).toBe("FAILED_FINAL");
  });

  it("is never run again when the recoverer marked it UNKNOWN", async () => {
    const { key, ref } = await silentOwnerWithPendingEffect();
    await registry.recoverExpiredLeases(t.db, { batchSize: 100, caller: "recoverer" });
    expect(await stored(ref)).toMatchObject({ state: "UNKNOWN", wentUnknown: true });
    await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "NO_EFFECT", providerHandle: "" }, gateway);
    await expectNeverRunAgain(key, ref, 1);
  });

  it("is never run again after an Abandon, whatever the owner resolves afterwards", async () => {
    const key = newKey();
    const reserved = await registry.reserve(t.db, reserveInput(key, { amount: 10 }, { claim: true }), gateway);
    const ref = { tenant: "acme", operationId: reserved.record!.operationId };
    await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "cards" }, gateway);
    expect((await registry.abandon(t.db, { ref, generation: 1 }, gateway)).state).toBe("UNKNOWN");
    await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "NO_EFFECT", providerHandle: "" }, gateway);
    // Abandoning again changes nothing; releasing is refused.
    expect((await registry.abandon(t.db, { ref, generation: 1 }, gateway)).state).toBe("UNKNOWN");
    await expectNeverRunAgain(key, ref, 1);
  });

  it("stays recovery's after Claim(RECOVER): no release, no takeover, no new kind of effect, the original downstream key", async () => {
    const { key, ref, downstreamKey } = await silentOwnerWithPendingEffect();
    await registry.recoverExpiredLeases(t.db, { batchSize: 100, caller: "recoverer" });
    const recovered = await registry.claim(t.db, { ref, mode: "RECOVER", generation: 1, writerEpoch: 0 }, worker);
    expect(recovered.record).toMatchObject({ state: "EXECUTING", generation: 2, recovering: true, wentUnknown: true });

    // The recovery worker learns from the provider that attempt 1 did nothing.
    await registry.resolveEffectAttempt(t.db, { ref, generation: 2, attemptNumber: 1, status: "NO_EFFECT", providerHandle: "" }, worker);
    await expectRefusal(registry.release(t.db, { ref, generation: 2 }, worker), "INVALID_TRANSITION");
    await expectRefusal(registry.recordEffectAttempt(t.db, { ref, generation: 2, effect: "email.receipt", provider: "mail" }, worker), "NEW_EFFECT_IN_RECOVERY");
    // It may replay the registered effect: under its original downstream key.
    const replayed = await registry.recordEffectAttempt(t.db, { ref, generation: 2, effect: "card.charge", provider: "cards" }, worker);
    expect(replayed).toMatchObject({ attemptNumber: 2, downstreamKey });
    await registry.resolveEffectAttempt(t.db, { ref, generation: 2, attemptNumber: 2, status: "NO_EFFECT", providerHandle: "" }, worker);

    // The worker goes silent too: its lease ends with nothing possible, and the record is UNKNOWN again, not claimable.
    await expireLease(t.pool, ref.operationId);
    const retry = await registry.reserve(t.db, reserveInput(key, { amount: 10 }, { claim: true }), gateway);
    expect(retry.decision).toBe("IN_PROGRESS");
    expect(await stored(ref)).toMatchObject({ state: "UNKNOWN", generation: 2, effectPossible: false, wentUnknown: true, recovering: false });
    await expectNeverRunAgain(key, ref, 2);

    // The same through the recoverer, after another recovery claim whose worker abandons nothing and goes silent.
    await registry.claim(t.db, { ref, mode: "RECOVER", generation: 2, writerEpoch: 0 }, worker);
    await expireLease(t.pool, ref.operationId);
    expect(await registry.recoverExpiredLeases(t.db, { batchSize: 100, caller: "recoverer" })).toMatchObject({ unknown: 1, claimable: 0 });
    expect(await stored(ref)).toMatchObject({ state: "UNKNOWN", generation: 3, wentUnknown: true, recovering: false });

    // A recovery holder that abandons hands it back to recovery, never to a retry.
    await registry.claim(t.db, { ref, mode: "RECOVER", generation: 3, writerEpoch: 0 }, worker);
    expect(await registry.abandon(t.db, { ref, generation: 4 }, worker)).toMatchObject({ state: "UNKNOWN", wentUnknown: true });
    await expectNeverRunAgain(key, ref, 4);
  });

  it("is opened to a fresh execution only by an operator's reconciliation with evidence, never after a CONFIRMED attempt", async () => {
    const { key, ref, downstreamKey } = await silentOwnerWithPendingEffect();
    await registry.recoverExpiredLeases(t.db, { batchSize: 100, caller: "recoverer" });

    const evidence = { evidence: "provider dashboard: no charge for this key", operatorName: "Dana" };
    await expectRefusal(registry.reconcile(t.db, { ref, ...evidence, outcome: "REJECTED", snapshot: failed }, operator), "INVALID_REQUEST");
    const reopened = await registry.reconcile(t.db, { ref, ...evidence, reopen: true }, operator);
    expect(reopened).toMatchObject({ state: "RESERVED", generation: 2, wentUnknown: false, effectPossible: false, leaseExpiresAt: null });
    const { attempts } = await registry.lookupById(t.db, { ref }, operator);
    expect(attempts.map((a) => a.status)).toEqual(["NO_EFFECT"]);
    const [event] = (await registry.recordHistory(t.db, ref, operator, 1)).events;
    expect(event).toMatchObject({ kind: "REOPENED", caller: "operator", detail: { reopened: true, evidence: evidence.evidence, operator: "Dana", resolvedNoEffect: [1] } });

    // The next identical retry runs it afresh; the effect keeps its downstream key.
    const retry = await registry.reserve(t.db, reserveInput(key, { amount: 10 }, { claim: true }), gateway);
    expect(retry).toMatchObject({ decision: "ACCEPTED", record: { generation: 3, state: "EXECUTING" } });
    const again = await registry.recordEffectAttempt(t.db, { ref, generation: 3, effect: "card.charge", provider: "cards" }, gateway);
    expect(again.downstreamKey).toBe(downstreamKey);
    await registry.resolveEffectAttempt(t.db, { ref, generation: 3, attemptNumber: 2, status: "CONFIRMED", providerHandle: "ch_1" }, gateway);

    // Once an attempt is CONFIRMED the effect happened: a reopening is refused.
    await expireLease(t.pool, ref.operationId);
    await registry.recoverExpiredLeases(t.db, { batchSize: 100, caller: "recoverer" });
    await expectRefusal(registry.reconcile(t.db, { ref, ...evidence, reopen: true }, operator), "EFFECT_POSSIBLE");
    expect(await stored(ref)).toMatchObject({ state: "UNKNOWN", generation: 3, wentUnknown: true });
  });
});

describe("a generation that was never granted", () => {
  it("is refused as such, not as another owner's takeover", async () => {
    const reserved = await registry.reserve(t.db, reserveInput(newKey(), { amount: 10 }, { claim: true }), gateway);
    const ref = { tenant: "acme", operationId: reserved.record!.operationId };
    const refusal = await expectRefusal(registry.renewLease(t.db, { ref, generation: 2 }, gateway), "STALE_GENERATION");
    expect(refusal.message).toMatch(/generation 2 was never granted: the record is at generation 1/);
    expect(refusal.message).not.toMatch(/took over/);
  });
});
