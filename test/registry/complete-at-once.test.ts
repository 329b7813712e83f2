import { describe, expect, it } from "vitest";
import type { Snapshot } from "../../src/contract/snapshot.js";
import type { Db } from "../../src/registry/db.js";
import type { Registry } from "../../src/registry/registry.js";
import type { OperationRef, StoredRecord } from "../../src/registry/types.js";
import { actor, newKey, reserveInput, testRegistry } from "../support/fixtures.js";
import { roundTripCounting, useTestDatabase } from "../support/database.js";
import { expectRefusal } from "../support/registry-helpers.js";

/**
 * Complete in one round trip (a record this process handed to its owner)
 * against Complete in two (a record another coordinator reserved): the same
 * answers, refusals and writes in every situation the rules tell apart.
 */
const t = useTestDatabase();
const gateway = actor({ caller: "gateway" });
const other = actor({ caller: "gateway", operations: ["orders.create"] });

const snapshot = (body: string): Snapshot => ({
  statusCode: 201,
  mediaType: "application/json",
  location: "",
  businessVersion: "",
  headers: [],
  body: new TextEncoder().encode(body),
});

interface Path {
  name: string;
  /** The registry that reserves, and the one that completes. */
  reserving: Registry;
  completing: Registry;
  /** Round trips of a Complete that finishes the record. */
  finishing: number;
}

const reserving = testRegistry();
const PATHS: Path[] = [
  { name: "in one round trip (the registry that reserved)", reserving, completing: reserving, finishing: 1 },
  { name: "in two (another registry)", reserving: testRegistry(), completing: testRegistry(), finishing: 2 },
];

const events = async (operationId: string) =>
  (await t.pool.query<{ kind: string }>("SELECT kind FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [operationId])).rows.map((r) => r.kind);

const activeCount = async (principal: string) =>
  (await t.pool.query<{ active: number }>("SELECT active FROM idem_quota_gate WHERE tenant_id = 'acme' AND principal = $1", [principal])).rows[0]?.active;

describe.each(PATHS)("Complete $name", (path) => {
  const accepted = async (claim = true): Promise<{ ref: OperationRef; principal: string }> => {
    const principal = `at-once-${newKey().slice(0, 8)}`;
    const result = await path.reserving.reserve(t.db, reserveInput(newKey(), { amount: 10 }, { claim, subject: { tenant: "acme", principal } }), gateway);
    expect(result.decision).toBe("ACCEPTED");
    return { ref: { tenant: "acme", operationId: result.record!.operationId }, principal };
  };
  const complete = (db: Db, ref: OperationRef, input: { generation?: number; outcome?: "SUCCEEDED" | "FAILED_FINAL" | "REJECTED"; body?: string } = {}) =>
    path.completing.complete(db, { ref, generation: input.generation ?? 1, outcome: input.outcome ?? "SUCCEEDED", snapshot: snapshot(input.body ?? '{"ok":true}') }, gateway);

  it("finishes an executing record: its terminal state, one COMPLETED event, its quota count released", async () => {
    const { ref, principal } = await accepted();
    expect(await activeCount(principal)).toBe(1);
    const c = roundTripCounting(t);
    const done: StoredRecord = await complete(c.db, ref);
    expect(c.counts().roundTrips).toBe(path.finishing);
    expect(done).toMatchObject({ state: "SUCCEEDED", generation: 1, leaseExpiresAt: null });
    expect(new TextDecoder().decode(done.snapshot!.body)).toBe('{"ok":true}');
    expect(await events(ref.operationId)).toEqual(["ACCEPTED", "COMPLETED"]);
    expect(await activeCount(principal)).toBe(0);
  });

  it("answers an identical repeat with the record as it is, and refuses another snapshot (ALREADY_COMPLETED), writing nothing", async () => {
    const { ref } = await accepted();
    const first = await complete(t.db, ref);
    const again = await complete(t.db, ref);
    expect(again).toMatchObject({ state: "SUCCEEDED", updatedAt: first.updatedAt });
    await expectRefusal(complete(t.db, ref, { body: '{"ok":false}' }), "ALREADY_COMPLETED");
    await expectRefusal(complete(t.db, ref, { outcome: "FAILED_FINAL" }), "ALREADY_COMPLETED");
    expect(await events(ref.operationId)).toEqual(["ACCEPTED", "COMPLETED"]);
  });

  it("refuses a generation that is not the record's (STALE_GENERATION), a record never claimed (INVALID_TRANSITION), and lets REJECTED finish it", async () => {
    const { ref } = await accepted();
    await expectRefusal(complete(t.db, ref, { generation: 2 }), "STALE_GENERATION");
    const reserved = await accepted(false);
    await expectRefusal(complete(t.db, reserved.ref), "INVALID_TRANSITION");
    expect(await complete(t.db, reserved.ref, { outcome: "REJECTED" })).toMatchObject({ state: "REJECTED" });
    expect(await events(ref.operationId)).toEqual(["ACCEPTED"]);
    expect(await events(reserved.ref.operationId)).toEqual(["ACCEPTED", "COMPLETED"]);
  });

  it("refuses while an attempt is unresolved (UNRESOLVED_EFFECTS), and REJECTED once an effect is possible (EFFECT_POSSIBLE)", async () => {
    const { ref } = await accepted();
    await path.reserving.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "cards" }, gateway);
    await expectRefusal(complete(t.db, ref), "UNRESOLVED_EFFECTS");
    await path.reserving.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "CONFIRMED", providerHandle: "" }, gateway);
    await expectRefusal(complete(t.db, ref, { outcome: "REJECTED" }), "EFFECT_POSSIBLE");
    expect(await complete(t.db, ref)).toMatchObject({ state: "SUCCEEDED" });
    expect((await events(ref.operationId)).filter((k) => k === "COMPLETED")).toHaveLength(1);
  });

  it("finishes a record its owner handed to recovery (UNKNOWN, which the one-round-trip statement leaves to the rules)", async () => {
    const { ref } = await accepted();
    await path.reserving.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "cards" }, gateway);
    await path.reserving.resolveEffectAttempt(t.db, { ref, generation: 1, attemptNumber: 1, status: "CONFIRMED", providerHandle: "" }, gateway);
    await path.reserving.abandon(t.db, { ref, generation: 1 }, gateway);
    const c = roundTripCounting(t);
    expect(await complete(c.db, ref)).toMatchObject({ state: "SUCCEEDED", generation: 1 });
    // In one round trip nothing matched, and the rules let it through: the two-round-trip path finished it.
    expect(c.counts().roundTrips).toBe(path.finishing === 1 ? 3 : 2);
    expect(await events(ref.operationId)).toContain("COMPLETED");
  });

  it("answers NOT_FOUND for a record of an operation the caller may not operate, changing nothing", async () => {
    const { ref } = await accepted();
    await expectRefusal(path.completing.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot: snapshot("{}") }, other), "NOT_FOUND");
    expect(await events(ref.operationId)).toEqual(["ACCEPTED"]);
  });
});
