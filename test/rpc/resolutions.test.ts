import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { Decision, OperationRefSchema, ReserveRequestSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { EffectStatus, HttpRequestPartsSchema, Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { wireReason } from "../support/refusals.js";
import { gatewayClient, useTestServer } from "../support/server.js";

/**
 * Complete with resolutions: the attempts it names are resolved as
 * ResolveEffectAttempt would resolve them, in the transaction that finishes
 * the operation, and the finish is judged on what they leave. A refused
 * Complete resolves nothing.
 */
const t = useTestDatabase();
const server = useTestServer(t);

/** A claimed operation with one PENDING attempt of card.charge. */
async function withPendingCharge() {
  const { client, call } = gatewayClient(server);
  const reserved = await client.reserve(
    create(ReserveRequestSchema, {
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: newKey(),
      claim: true,
      request: {
        case: "parts",
        value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode("{}") }),
      },
    }),
    call,
  );
  expect(reserved.decision).toBe(Decision.ACCEPTED);
  const ref = create(OperationRefSchema, { tenant: "acme", operationId: reserved.operationId });
  const registered = await client.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "cards" }, call);
  expect(registered.attempt!.status).toBe(EffectStatus.PENDING);
  const lookup = () => client.lookup({ by: { case: "ref", value: ref }, subject: { tenant: "acme", principal: "alice" } }, call);
  const events = async () =>
    (await t.pool.query<{ kind: string }>("SELECT kind FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [ref.operationId])).rows.map((r) => r.kind);
  return { client, call, ref, lookup, events };
}

const SUCCEEDED = { outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201, body: new TextEncoder().encode('{"id":"ch_1"}') } };

describe("Complete with resolutions", () => {
  it("resolves the attempt and finishes the operation in one call, logged as the two calls would be", async () => {
    const { client, call, ref, lookup, events } = await withPendingCharge();
    const done = await client.complete({ ref, generation: 1n, ...SUCCEEDED, resolutions: [{ attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "ch_1" }] }, call);
    expect(done.state).toBe(RecordState.SUCCEEDED);
    const { record } = await lookup();
    expect(record!.effectAttempts).toMatchObject([{ attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "ch_1" }]);
    expect(await events()).toEqual(["ACCEPTED", "EFFECT_RECORDED", "EFFECT_RESOLVED", "COMPLETED"]);
  });

  it("is needed: without it the same Complete is refused UNRESOLVED_EFFECTS", async () => {
    const { client, call, ref } = await withPendingCharge();
    expect(await wireReason(client.complete({ ref, generation: 1n, ...SUCCEEDED }, call))).toBe("UNRESOLVED_EFFECTS");
  });

  it("lets an operation whose only attempt had no effect be REJECTED", async () => {
    const { client, call, ref, lookup } = await withPendingCharge();
    const rejected = { outcome: Outcome.REJECTED, snapshot: { statusCode: 402 }, resolutions: [{ attemptNumber: 1, status: EffectStatus.NO_EFFECT, providerHandle: "" }] };
    expect((await client.complete({ ref, generation: 1n, ...rejected }, call)).state).toBe(RecordState.REJECTED);
    expect((await lookup()).record!.effectAttempts[0]!.status).toBe(EffectStatus.NO_EFFECT);
  });

  it.each([
    ["INDETERMINATE", [{ attemptNumber: 1, status: EffectStatus.INDETERMINATE, providerHandle: "" }], "INVALID_REQUEST"],
    [
      "the same attempt twice",
      [
        { attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "" },
        { attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "" },
      ],
      "INVALID_REQUEST",
    ],
    ["an attempt that does not exist", [{ attemptNumber: 7, status: EffectStatus.CONFIRMED, providerHandle: "" }], "ATTEMPT_NOT_FOUND"],
  ])("refuses %s and resolves nothing", async (_, resolutions, reason) => {
    const { client, call, ref, lookup, events } = await withPendingCharge();
    expect(await wireReason(client.complete({ ref, generation: 1n, ...SUCCEEDED, resolutions }, call))).toBe(reason);
    const { record } = await lookup();
    expect(record!.state).toBe(RecordState.EXECUTING);
    expect(record!.effectAttempts[0]!.status).toBe(EffectStatus.PENDING);
    expect(await events()).toEqual(["ACCEPTED", "EFFECT_RECORDED"]);
  });

  it("refuses a stale generation and resolves nothing", async () => {
    const { client, call, ref, lookup } = await withPendingCharge();
    const stale = client.complete({ ref, generation: 2n, ...SUCCEEDED, resolutions: [{ attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "" }] }, call);
    expect(await wireReason(stale)).toBe("STALE_GENERATION");
    expect((await lookup()).record!.effectAttempts[0]!.status).toBe(EffectStatus.PENDING);
  });

  it("answers an identical repeat as done, and refuses a repeat that resolves differently", async () => {
    const { client, call, ref, events } = await withPendingCharge();
    const request = { ref, generation: 1n, ...SUCCEEDED, resolutions: [{ attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "ch_1" }] };
    const first = await client.complete(request, call);
    const again = await client.complete(request, call);
    expect(again.snapshotDigest).toEqual(first.snapshotDigest);
    const other = client.complete({ ...request, resolutions: [{ attemptNumber: 1, status: EffectStatus.NO_EFFECT, providerHandle: "" }] }, call);
    expect(await wireReason(other)).toBe("ATTEMPT_ALREADY_RESOLVED");
    expect(await events()).toEqual(["ACCEPTED", "EFFECT_RECORDED", "EFFECT_RESOLVED", "COMPLETED"]);
  });
});
