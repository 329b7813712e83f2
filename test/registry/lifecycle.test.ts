import { describe, expect, it } from "vitest";
import type { Snapshot } from "../../src/contract/snapshot.js";
import type { OperationRef, ReserveResult } from "../../src/registry/types.js";
import { actor, newKey, reserveInput, testRegistry } from "../support/fixtures.js";
import { useTestDatabase } from "../support/database.js";
import { countRows, expectRefusal, expireLease } from "../support/registry-helpers.js";

const t = useTestDatabase();

const registry = testRegistry();
const gateway = actor({ caller: "gateway" });
const worker = actor({ caller: "recovery-worker" });

const okSnapshot: Snapshot = {
  statusCode: 201,
  mediaType: "application/json",
  location: "/v1/payments/p_1",
  businessVersion: "v1",
  headers: [
    ["Content-Type", "application/json"],
    ["ETag", '"v1"'],
    ["Date", "Mon, 30 Nov 2026 00:00:00 GMT"],
    ["Set-Cookie", "session=secret"],
    ["traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],
    ["X-Request-Id", "req-1"],
  ],
  body: new TextEncoder().encode('{"id":"p_1","amount":10}'),
};

async function accepted(body: unknown = { amount: 10 }, claim = true): Promise<{ key: string; ref: OperationRef; result: ReserveResult }> {
  const key = newKey();
  const result = await registry.reserve(t.db, reserveInput(key, body, { claim }), gateway);
  expect(result.decision).toBe("ACCEPTED");
  return { key, ref: { tenant: "acme", operationId: result.record!.operationId }, result };
}

describe("the happy path", () => {
  it("runs reserve, claim, effect, resolve, complete, then replays the identical snapshot", async () => {
    const { key, ref } = await accepted(undefined, false);
    const claimed = await registry.claim(t.db, { ref, mode: "OWNER", generation: 1, writerEpoch: 0 }, gateway);
    expect(claimed.record).toMatchObject({ state: "EXECUTING", generation: 1, recovering: false });

    const attempt = await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "card-provider" }, gateway);
    expect(attempt).toMatchObject({ attemptNumber: 1, status: "PENDING", generation: 1 });
    expect(attempt.downstreamKey).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const resolved = await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "CONFIRMED", providerHandle: "ch_123" }, gateway);
    expect(resolved).toMatchObject({ status: "CONFIRMED", providerHandle: "ch_123" });

    const done = await registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway);
    expect(done.state).toBe("SUCCEEDED");
    expect(done.snapshot!.headers).toEqual([
      ["content-type", "application/json"],
      ["etag", '"v1"'],
    ]);

    const replays = await Promise.all([1, 2, 3].map(() => registry.reserve(t.db, reserveInput(key), gateway)));
    for (const replay of replays) {
      expect(replay.decision).toBe("REPLAY");
      expect(Buffer.from(replay.record!.snapshot!.body).equals(Buffer.from(okSnapshot.body))).toBe(true);
      expect(Buffer.from(replay.record!.snapshot!.digest).equals(Buffer.from(done.snapshot!.digest))).toBe(true);
      expect(replay.record!.snapshot!.headers).toEqual(done.snapshot!.headers);
    }
    const conflict = await registry.reserve(t.db, reserveInput(key, { amount: 11 }), gateway);
    expect(conflict.decision).toBe("PAYLOAD_CONFLICT");

    const { rows } = await t.pool.query<{ kind: string }>("SELECT kind FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [ref.operationId]);
    expect(rows.map((r) => r.kind)).toEqual(["ACCEPTED", "CLAIMED", "EFFECT_RECORDED", "EFFECT_RESOLVED", "COMPLETED", "CONFLICT"]);
  });

  it("succeeds again on an identical repeated Complete and refuses a different one", async () => {
    const { ref } = await accepted();
    const first = await registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway);
    const again = await registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway);
    expect(Buffer.from(again.snapshot!.digest).equals(Buffer.from(first.snapshot!.digest))).toBe(true);
    // Only headers that are never stored differ: still identical.
    const noisy = { ...okSnapshot, headers: [...okSnapshot.headers, ["Date", "Tue, 01 Dec 2026 00:00:00 GMT"] as [string, string]] };
    await registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: noisy }, gateway);
    await expectRefusal(
      registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: { ...okSnapshot, body: new Uint8Array([1]) } }, gateway),
      "ALREADY_COMPLETED",
    );
    await expectRefusal(registry.complete(t.db, { ref, generation: 1, outcome: "FAILED_FINAL", snapshot: okSnapshot }, gateway), "ALREADY_COMPLETED");
    await expectRefusal(registry.complete(t.db, { ref, generation: 2, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway), "STALE_GENERATION");
  });

  it("rejects before any effect, and refuses REJECTED once an effect is possible", async () => {
    const reserved = await accepted(undefined, false);
    const rejected = await registry.complete(t.db, { ref: reserved.ref, generation: 1, outcome: "REJECTED", snapshot: { ...okSnapshot, statusCode: 400 } }, gateway);
    expect(rejected.state).toBe("REJECTED");
    expect((await registry.reserve(t.db, reserveInput(reserved.key), gateway)).decision).toBe("REPLAY");

    const { ref } = await accepted();
    await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "card-provider" }, gateway);
    await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "CONFIRMED", providerHandle: "" }, gateway);
    await expectRefusal(registry.complete(t.db, { ref, generation: 1, outcome: "REJECTED", snapshot: okSnapshot }, gateway), "EFFECT_POSSIBLE");
    await expectRefusal(registry.release(t.db, { ref, generation: 1 }, gateway), "EFFECT_POSSIBLE");
  });

  it("refuses SUCCEEDED from a reservation that was never claimed", async () => {
    const { ref } = await accepted(undefined, false);
    await expectRefusal(registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway), "INVALID_TRANSITION");
  });
});

describe("effects", () => {
  it("refuses to complete while an effect's latest attempt is unresolved; a later definite attempt of the same key settles it", async () => {
    const { ref } = await accepted();
    const first = await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "card-provider" }, gateway);
    await expectRefusal(registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway), "UNRESOLVED_EFFECTS");
    await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: first.attemptNumber, status: "INDETERMINATE", providerHandle: "" }, gateway);
    await expectRefusal(registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway), "UNRESOLVED_EFFECTS");
    const retry = await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "card-provider" }, gateway);
    expect(retry.attemptNumber).toBe(2);
    expect(retry.downstreamKey).toBe(first.downstreamKey);
    await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: retry.attemptNumber, status: "CONFIRMED", providerHandle: "ch_9" }, gateway);
    expect((await registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway)).state).toBe("SUCCEEDED");
  });

  it("resolves an attempt once: the same answer again is accepted, another one refused", async () => {
    const { ref } = await accepted();
    await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "card-provider" }, gateway);
    await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "CONFIRMED", providerHandle: "ch_1" }, gateway);
    expect((await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "CONFIRMED", providerHandle: "ch_1" }, gateway)).status).toBe("CONFIRMED");
    await expectRefusal(
      registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "NO_EFFECT", providerHandle: "" }, gateway),
      "ATTEMPT_ALREADY_RESOLVED",
    );
    await expectRefusal(
      registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "CONFIRMED", providerHandle: "ch_other" }, gateway),
      "ATTEMPT_ALREADY_RESOLVED",
    );
    await expectRefusal(registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 7, status: "CONFIRMED", providerHandle: "" }, gateway), "ATTEMPT_NOT_FOUND");
    await expectRefusal(registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "PENDING", providerHandle: "" }, gateway), "INVALID_REQUEST");
  });

  it("needs a claimed record and a live lease to register an effect; renewing restores it", async () => {
    const reserved = await accepted(undefined, false);
    await expectRefusal(registry.recordEffectAttempt(t.db, { ref: reserved.ref, generation: 1, effect: "card.charge", provider: "p" }, gateway), "INVALID_TRANSITION");
    const { ref } = await accepted();
    await expireLease(t.pool, ref.operationId);
    await expectRefusal(registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "p" }, gateway), "LEASE_EXPIRED");
    const renewed = await registry.renewLease(t.db, { ref, generation: 1, leaseMs: 60_000 }, gateway);
    expect(renewed.leaseExpiresAt!.getTime()).toBeGreaterThan(renewed.dbNow.getTime() + 59_000);
    expect((await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "p" }, gateway)).attemptNumber).toBe(1);
    await expectRefusal(registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "bad name!", provider: "p" }, gateway), "INVALID_REQUEST");
  });

  it("caps a requested lease at the policy's maximum", async () => {
    const { ref } = await accepted();
    const renewed = await registry.renewLease(t.db, { ref, generation: 1, leaseMs: 24 * 3600_000 }, gateway);
    const granted = renewed.leaseExpiresAt!.getTime() - renewed.dbNow.getTime();
    expect(granted).toBeLessThanOrEqual(300_000);
    expect(granted).toBeGreaterThan(299_000);
  });
});

describe("leases, takeover and UNKNOWN", () => {
  it("lets another caller take over an expired lease when no effect is possible (attempts all NO_EFFECT)", async () => {
    const { key, ref } = await accepted();
    await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "p" }, gateway);
    await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "NO_EFFECT", providerHandle: "" }, gateway);
    await expireLease(t.pool, ref.operationId);
    await expectRefusal(registry.claim(t.db, { ref, mode: "RECOVER", generation: 1, writerEpoch: 0 }, worker), "INVALID_TRANSITION");
    const taken = await registry.claim(t.db, { ref, mode: "TAKEOVER", generation: 1, writerEpoch: 0 }, worker);
    expect(taken.record).toMatchObject({ generation: 2, state: "EXECUTING", recovering: false });
    // The old owner is fenced out of every write.
    await expectRefusal(registry.claim(t.db, { ref, mode: "OWNER", generation: 1, writerEpoch: 0 }, gateway), "STALE_GENERATION");
    await expectRefusal(registry.renewLease(t.db, { ref, generation: 1 }, gateway), "STALE_GENERATION");
    await expectRefusal(registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "p" }, gateway), "STALE_GENERATION");
    await expectRefusal(registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "NO_EFFECT", providerHandle: "" }, gateway), "STALE_GENERATION");
    await expectRefusal(registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway), "STALE_GENERATION");
    await expectRefusal(registry.release(t.db, { ref, generation: 1 }, gateway), "STALE_GENERATION");
    // A retry meanwhile is told to wait for the new owner.
    expect((await registry.reserve(t.db, reserveInput(key), gateway)).decision).toBe("IN_PROGRESS");
    // The new owner's downstream key is the old one.
    const again = await registry.recordEffectAttempt(t.db, { ref, generation: 2, effect: "card.charge", provider: "p" }, worker);
    expect(again.downstreamKey).toBe(taken.attempts[0]!.downstreamKey);
  });

  it("refuses a takeover while the lease is live, and of a generation that already moved", async () => {
    const { ref } = await accepted();
    await expectRefusal(registry.claim(t.db, { ref, mode: "TAKEOVER", generation: 1, writerEpoch: 0 }, worker), "LEASE_HELD");
    await expireLease(t.pool, ref.operationId);
    await registry.claim(t.db, { ref, mode: "TAKEOVER", generation: 1, writerEpoch: 0 }, worker);
    await expireLease(t.pool, ref.operationId);
    await expectRefusal(registry.claim(t.db, { ref, mode: "TAKEOVER", generation: 1, writerEpoch: 0 }, worker), "STALE_GENERATION");
  });

  it("turns an expired lease with a possible effect into UNKNOWN, which is never executed again", async () => {
    const { key, ref } = await accepted();
    await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "p" }, gateway);
    await expireLease(t.pool, ref.operationId);

    const retry = await registry.reserve(t.db, reserveInput(key), gateway);
    expect(retry.decision).toBe("IN_PROGRESS");
    expect(retry.record).toMatchObject({ state: "UNKNOWN", generation: 1 });
    expect(retry.retryAfterMs).toBeGreaterThan(0);
    expect((await registry.reserve(t.db, reserveInput(key), gateway)).decision).toBe("IN_PROGRESS");
    await expectRefusal(registry.claim(t.db, { ref, mode: "TAKEOVER", generation: 1, writerEpoch: 0 }, worker), "INVALID_TRANSITION");
    await expectRefusal(registry.claim(t.db, { ref, mode: "OWNER", generation: 1, writerEpoch: 0 }, gateway), "INVALID_TRANSITION");
    await expectRefusal(registry.renewLease(t.db, { ref, generation: 1 }, gateway), "LEASE_EXPIRED");
    await expectRefusal(registry.release(t.db, { ref, generation: 1 }, gateway), "EFFECT_POSSIBLE");
  });

  it("lets the owner whose lease expired, but was not replaced, still resolve and complete: it is the truth", async () => {
    const { key, ref } = await accepted();
    await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "p" }, gateway);
    await expireLease(t.pool, ref.operationId);
    expect((await registry.reserve(t.db, reserveInput(key), gateway)).record?.state).toBe("UNKNOWN");
    await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "CONFIRMED", providerHandle: "ch_late" }, gateway);
    const done = await registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway);
    expect(done).toMatchObject({ state: "SUCCEEDED", generation: 1 });
    expect((await registry.reserve(t.db, reserveInput(key), gateway)).decision).toBe("REPLAY");
  });

  it("recovers an UNKNOWN record: generation + 1, only registered effects, with their original keys", async () => {
    const { key, ref } = await accepted();
    const original = await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "card-provider" }, gateway);
    await expireLease(t.pool, ref.operationId);

    // RECOVER also works straight from EXECUTING with the ended lease.
    const recovery = await registry.claim(t.db, { ref, mode: "RECOVER", generation: 1, writerEpoch: 0 }, worker);
    expect(recovery.record).toMatchObject({ state: "EXECUTING", generation: 2, recovering: true });
    expect(recovery.attempts.map((a) => [a.effect, a.downstreamKey, a.status])).toEqual([["card.charge", original.downstreamKey, "PENDING"]]);

    await expectRefusal(registry.recordEffectAttempt(t.db, { ref, generation: 2, effect: "email.send", provider: "mailer" }, worker), "NEW_EFFECT_IN_RECOVERY");
    const replay = await registry.recordEffectAttempt(t.db, { ref, generation: 2, effect: "card.charge", provider: "card-provider" }, worker);
    expect(replay.downstreamKey).toBe(original.downstreamKey);
    expect(replay.generation).toBe(2);
    await registry.resolveEffectAttempt(t.db, { ref, generation: 2, attemptNumber: original.attemptNumber, status: "CONFIRMED", providerHandle: "ch_1" }, worker);
    await registry.resolveEffectAttempt(t.db, { ref, generation: 2, attemptNumber: replay.attemptNumber, status: "CONFIRMED", providerHandle: "ch_1" }, worker);
    await expectRefusal(registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway), "STALE_GENERATION");
    const done = await registry.complete(t.db, { ref, generation: 2, outcome: "SUCCEEDED", snapshot: okSnapshot }, worker);
    expect(done).toMatchObject({ state: "SUCCEEDED", recovering: false });
    expect((await registry.reserve(t.db, reserveInput(key), gateway)).decision).toBe("REPLAY");

    const { rows } = await t.pool.query<{ kind: string; generation: number }>("SELECT kind, generation::int FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [
      ref.operationId,
    ]);
    expect(rows.map((r) => `${r.kind}@${r.generation}`)).toEqual([
      "ACCEPTED@1",
      "EFFECT_RECORDED@1",
      "UNKNOWN@1",
      "RECOVERY_CLAIMED@2",
      "EFFECT_RECORDED@2",
      "EFFECT_RESOLVED@2",
      "EFFECT_RESOLVED@2",
      "COMPLETED@2",
    ]);
  });

  it("keeps generations growing and never lets one scope hold two operations", async () => {
    const { key, ref } = await accepted(undefined, false);
    const generations = [1];
    for (let i = 0; i < 3; i++) {
      await expireLease(t.pool, ref.operationId);
      const next = await registry.reserve(t.db, reserveInput(key), gateway);
      expect(next.decision).toBe("ACCEPTED");
      expect(next.record!.operationId).toBe(ref.operationId);
      generations.push(next.record!.generation);
    }
    expect(generations).toEqual([1, 2, 3, 4]);
  });
});

describe("release", () => {
  it("hands a reservation back: the next identical retry takes it over, a different payload still conflicts", async () => {
    const { key, ref } = await accepted();
    await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "p" }, gateway);
    await registry.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "NO_EFFECT", providerHandle: "" }, gateway);
    const released = await registry.release(t.db, { ref, generation: 1 }, gateway);
    expect(released).toMatchObject({ state: "RESERVED", generation: 1, leaseExpiresAt: null });
    expect((await registry.release(t.db, { ref, generation: 1 }, gateway)).state).toBe("RESERVED");
    expect((await registry.reserve(t.db, reserveInput(key, { amount: 99 }), gateway)).decision).toBe("PAYLOAD_CONFLICT");
    const retry = await registry.reserve(t.db, reserveInput(key, undefined, { claim: true }), gateway);
    expect(retry).toMatchObject({ decision: "ACCEPTED", record: { generation: 2, state: "EXECUTING" } });
    await expectRefusal(registry.release(t.db, { ref, generation: 1 }, gateway), "STALE_GENERATION");
  });

  it("refuses anything but a stable answer on a finished record", async () => {
    const { ref } = await accepted();
    await registry.complete(t.db, { ref, generation: 1, outcome: "FAILED_FINAL", snapshot: { ...okSnapshot, statusCode: 402 } }, gateway);
    await expectRefusal(registry.release(t.db, { ref, generation: 1 }, gateway), "INVALID_TRANSITION");
    await expectRefusal(registry.claim(t.db, { ref, mode: "OWNER", generation: 1, writerEpoch: 0 }, gateway), "INVALID_TRANSITION");
    await expectRefusal(registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "p" }, gateway), "INVALID_TRANSITION");
    await expectRefusal(registry.renewLease(t.db, { ref, generation: 1 }, gateway), "INVALID_TRANSITION");
  });
});

describe("refusals change nothing", () => {
  it("leaves the tables as they were after each refused write", async () => {
    const { ref } = await accepted();
    await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "p" }, gateway);
    const before = await countRows(t.pool);
    const {
      rows: [snapshotBefore],
    } = await t.pool.query<Record<string, unknown>>("SELECT state, generation, updated_at FROM idem_record WHERE operation_id = $1", [ref.operationId]);
    await expectRefusal(registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: okSnapshot }, gateway), "UNRESOLVED_EFFECTS");
    await expectRefusal(
      registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: { ...okSnapshot, body: new Uint8Array(2 * 1024 * 1024) } }, gateway),
      "SNAPSHOT_TOO_LARGE",
    );
    await expectRefusal(registry.release(t.db, { ref, generation: 1 }, gateway), "EFFECT_POSSIBLE");
    await expectRefusal(registry.claim(t.db, { ref, mode: "TAKEOVER", generation: 1, writerEpoch: 0 }, worker), "LEASE_HELD");
    await expectRefusal(
      registry.recordEffectAttempt(t.db, { ref: { ...ref, operationId: "not-a-uuid" }, generation: 1, effect: "card.charge", provider: "p" }, gateway),
      "INVALID_REQUEST",
    );
    await expectRefusal(registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "p" }, actor({ operations: ["refunds.create"] })), "NOT_FOUND");
    expect(await countRows(t.pool)).toEqual(before);
    const {
      rows: [snapshotAfter],
    } = await t.pool.query<Record<string, unknown>>("SELECT state, generation, updated_at FROM idem_record WHERE operation_id = $1", [ref.operationId]);
    expect(snapshotAfter).toEqual(snapshotBefore);
  });
});
