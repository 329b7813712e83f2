import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { Decision, OperationRefSchema, ReserveRequestSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { EffectStatus, HttpRequestPartsSchema, Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { wireReason } from "../support/refusals.js";
import { gatewayClient, useTestServer } from "../support/server.js";

/**
 * Effects declared with Reserve: registered with the acceptance, in its
 * transaction, exactly as RecordEffectAttempt would register them; nothing
 * for any other decision, and nothing stored from a refused declaration.
 */
const t = useTestDatabase();
const server = useTestServer(t);

const subject = { tenant: "acme", principal: "alice" };
const CHARGE = { effect: "card.charge", provider: "cards" };

function reserveRequest(key: string, effects: Array<{ effect: string; provider: string }>, claim = true) {
  return create(ReserveRequestSchema, {
    subject,
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: key,
    claim,
    effects,
    request: {
      case: "parts",
      value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode("{}") }),
    },
  });
}

const events = async (operationId: string) =>
  (await t.pool.query<{ kind: string }>("SELECT kind FROM idem_event WHERE operation_id = $1 ORDER BY event_id", [operationId])).rows.map((r) => r.kind);

describe("effects declared with Reserve", () => {
  it("registers one PENDING attempt per declared effect with the acceptance, with the downstream key RecordEffectAttempt would give", async () => {
    const { client, call } = gatewayClient(server);
    const accepted = await client.reserve(reserveRequest(newKey(), [CHARGE, { effect: "receipt.send", provider: "mailer" }]), call);
    expect(accepted.decision).toBe(Decision.ACCEPTED);
    expect(accepted.effectAttempts).toMatchObject([
      { attemptNumber: 1, effect: "card.charge", provider: "cards", status: EffectStatus.PENDING },
      { attemptNumber: 2, effect: "receipt.send", provider: "mailer", status: EffectStatus.PENDING },
    ]);
    expect(await events(accepted.operationId)).toEqual(["ACCEPTED", "EFFECT_RECORDED", "EFFECT_RECORDED"]);
    // A later registration of the same effect carries the same downstream key.
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    const again = await client.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "cards" }, call);
    expect(again.attempt!.attemptNumber).toBe(3);
    expect(again.attempt!.downstreamKey).toBe(accepted.effectAttempts[0]!.downstreamKey);
  });

  it("makes an effect possible until it is resolved: the operation completes once the declared attempt is", async () => {
    const { client, call } = gatewayClient(server);
    const accepted = await client.reserve(reserveRequest(newKey(), [CHARGE]), call);
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    expect(await wireReason(client.release({ ref, generation: 1n }, call))).toBe("EFFECT_POSSIBLE");
    // The handler never made the call: NO_EFFECT with the Complete, and REJECTED is allowed.
    const rejected = await client.complete(
      { ref, generation: 1n, outcome: Outcome.REJECTED, snapshot: { statusCode: 400 }, resolutions: [{ attemptNumber: 1, status: EffectStatus.NO_EFFECT }] },
      call,
    );
    expect(rejected.state).toBe(RecordState.REJECTED);
  });

  it("registers nothing for a decision other than ACCEPTED: a replay, an owner at work", async () => {
    const { client, call } = gatewayClient(server);
    const key = newKey();
    const accepted = await client.reserve(reserveRequest(key, [CHARGE]), call);
    const busy = await client.reserve(reserveRequest(key, [CHARGE]), call);
    expect(busy.decision).toBe(Decision.IN_PROGRESS);
    expect(busy.effectAttempts).toEqual([]);
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    await client.complete(
      { ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201 }, resolutions: [{ attemptNumber: 1, status: EffectStatus.CONFIRMED }] },
      call,
    );
    const replay = await client.reserve(reserveRequest(key, [CHARGE]), call);
    expect(replay.decision).toBe(Decision.REPLAY);
    expect(replay.effectAttempts).toEqual([]);
    const { rows } = await t.pool.query("SELECT attempt_number FROM idem_effect_attempt WHERE operation_id = $1", [accepted.operationId]);
    expect(rows).toHaveLength(1);
  });

  it.each([
    ["without claim", [CHARGE], false],
    ["twice the same effect", [CHARGE, CHARGE], true],
    ["an invalid effect name", [{ effect: "Card Charge", provider: "cards" }], true],
  ] as const)("refuses a declaration %s with INVALID_REQUEST and stores nothing", async (_, effects, claim) => {
    const { client, call } = gatewayClient(server);
    const key = newKey();
    expect(await wireReason(client.reserve(reserveRequest(key, [...effects], claim), call))).toBe("INVALID_REQUEST");
    const lookup = client.lookup({ by: { case: "scope", value: { subject, operation: "payments.create", apiRevision: 1, idempotencyKey: key } } }, call);
    expect(await wireReason(lookup)).toBe("NOT_FOUND");
  });
});
