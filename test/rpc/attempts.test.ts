import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { ClaimMode, Decision, OperationRefSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { EffectStatus, Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { expireLease } from "../support/registry-helpers.js";
import { wireReason } from "../support/refusals.js";
import { gatewayClient, useTestServer } from "../support/server.js";
import { paymentReserve } from "../support/wire-requests.js";

/**
 * A later attempt of an effect never takes back what an earlier one may have
 * done: attempt 1 of `card.charge` is PENDING, INDETERMINATE or CONFIRMED,
 * attempt 2 of the same effect is resolved NO_EFFECT, and the operation must
 * still count as possibly effected in every rule that depends on it.
 */
const t = useTestDatabase();
const server = useTestServer(t);

const FIRST_STATUSES = [EffectStatus.PENDING, EffectStatus.INDETERMINATE, EffectStatus.CONFIRMED] as const;

/** A claimed operation whose first attempt ended as `first` and whose second attempt of the same effect was resolved NO_EFFECT. */
async function twoAttempts(first: EffectStatus, key = newKey()) {
  const { client, call } = gatewayClient(server);
  const reserved = await client.reserve(reserveRequest(key), call);
  expect(reserved.decision).toBe(Decision.ACCEPTED);
  const ref = create(OperationRefSchema, { tenant: "acme", operationId: reserved.operationId });
  const one = await client.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "cards" }, call);
  if (first !== EffectStatus.PENDING) {
    await client.resolveEffectAttempt({ ref, generation: 1n, attemptNumber: one.attempt!.attemptNumber, status: first }, call);
  }
  const two = await client.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "cards" }, call);
  expect(two.attempt!.attemptNumber).toBe(2);
  expect(two.attempt!.downstreamKey).toBe(one.attempt!.downstreamKey);
  await client.resolveEffectAttempt({ ref, generation: 1n, attemptNumber: 2, status: EffectStatus.NO_EFFECT }, call);
  return { client, call, ref, key };
}

const reserveRequest = (key: string) => paymentReserve({ key });

describe.each(FIRST_STATUSES.map((status) => [EffectStatus[status], status] as const))("attempt 1 %s, attempt 2 of the same effect NO_EFFECT", (_name, first) => {
  it("refuses Release with EFFECT_POSSIBLE", async () => {
    const { client, call, ref } = await twoAttempts(first);
    expect(await wireReason(client.release({ ref, generation: 1n }, call))).toBe("EFFECT_POSSIBLE");
  });

  it("refuses Complete(REJECTED) with EFFECT_POSSIBLE", async () => {
    const { client, call, ref } = await twoAttempts(first);
    const rejected = client.complete({ ref, generation: 1n, outcome: Outcome.REJECTED, snapshot: { statusCode: 400 } }, call);
    expect(await wireReason(rejected)).toBe("EFFECT_POSSIBLE");
  });

  it("becomes UNKNOWN when the lease ends: a retry is never ACCEPTED again", async () => {
    const { client, call, ref, key } = await twoAttempts(first);
    await expireLease(t.pool, ref.operationId);
    const retry = await client.reserve(reserveRequest(key), call);
    expect(retry.decision).toBe(Decision.IN_PROGRESS);
    expect(retry.state).toBe(RecordState.UNKNOWN);
    const { rows } = await t.pool.query("SELECT state, generation FROM idem_record WHERE operation_id = $1", [ref.operationId]);
    expect(rows[0]).toEqual({ state: "UNKNOWN", generation: "1" });
  });

  it("refuses Claim(TAKEOVER) after the lease ended", async () => {
    const { client, ref } = await twoAttempts(first);
    await expireLease(t.pool, ref.operationId);
    const worker = { headers: { authorization: `Bearer ${server.tokens.worker}` } };
    expect(await wireReason(client.claim({ ref, generation: 1n, mode: ClaimMode.TAKEOVER }, worker))).toBe("INVALID_TRANSITION");
    const { rows } = await t.pool.query<{ generation: string }>("SELECT generation FROM idem_record WHERE operation_id = $1", [ref.operationId]);
    expect(rows[0]?.generation).toBe("1");
  });
});

describe("Abandon", () => {
  it("hands a possibly effected record to recovery at once, fenced by its generation, and repeats as a no-op", async () => {
    const { client, call, ref } = await twoAttempts(EffectStatus.CONFIRMED);
    expect(await wireReason(client.abandon({ ref, generation: 2n }, call))).toBe("STALE_GENERATION");
    const abandoned = await client.abandon({ ref, generation: 1n }, call);
    expect(abandoned).toMatchObject({ state: RecordState.UNKNOWN, generation: 1n });
    expect((await client.abandon({ ref, generation: 1n }, call)).state).toBe(RecordState.UNKNOWN);
    const worker = { headers: { authorization: `Bearer ${server.tokens.worker}` } };
    const listed = await client.listRecoverable({ tenant: "acme", pageSize: 500 }, worker);
    expect(listed.records.map((r) => r.record?.operationId)).toContain(ref.operationId);
    // The owner that abandoned it may still complete: it is the truth.
    const done = await client.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201 } }, call);
    expect(done.state).toBe(RecordState.SUCCEEDED);
    expect(await wireReason(client.abandon({ ref, generation: 1n }, call))).toBe("INVALID_TRANSITION");
  });

  it("releases a record where nothing can have happened: the next identical retry takes it over", async () => {
    const { client, call } = gatewayClient(server);
    const key = newKey();
    const reserved = await client.reserve(reserveRequest(key), call);
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: reserved.operationId });
    expect(await client.abandon({ ref, generation: 1n }, call)).toMatchObject({ state: RecordState.RESERVED, generation: 1n });
    const retry = await client.reserve(reserveRequest(key), call);
    expect(retry).toMatchObject({ decision: Decision.ACCEPTED, generation: 2n });
  });
});
