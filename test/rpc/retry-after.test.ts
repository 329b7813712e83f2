import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { Decision, OperationRefSchema, ReserveRequestSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { EffectStatus, HttpRequestPartsSchema, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey, testDocument } from "../support/fixtures.js";
import { gatewayClient, useTestServer } from "../support/server.js";

/**
 * Retry-After says when an answer is actually expected: soon for an owner
 * that has just started (not the rest of its 30 s lease), and at the
 * recoverer's cadence for a record awaiting recovery (not a lease length).
 */
const t = useTestDatabase();
const RECOVERER_INTERVAL_MS = 1500;
const server = useTestServer(t, {
  operations: [testDocument({ lease: { default: "30s", max: "5m" } })],
  config: { recovererIntervalMs: RECOVERER_INTERVAL_MS },
});

function reserveRequest(key: string, claim = false) {
  return create(ReserveRequestSchema, {
    subject: { tenant: "acme", principal: "alice" },
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: key,
    claim,
    request: {
      case: "parts",
      value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode('{"amount":10}') }),
    },
  });
}

const ms = (d: { seconds: bigint; nanos: number } | undefined) => (d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : undefined);

describe("Retry-After of IN_PROGRESS", () => {
  it("is a short backoff for an owner that just started, not the rest of its lease", async () => {
    const { client, call } = gatewayClient(server);
    const key = newKey();
    expect((await client.reserve(reserveRequest(key, true), call)).decision).toBe(Decision.ACCEPTED);
    const busy = await client.reserve(reserveRequest(key), call);
    expect(busy.decision).toBe(Decision.IN_PROGRESS);
    const hint = ms(busy.retryAfter)!;
    expect(hint).toBeGreaterThanOrEqual(250);
    expect(hint).toBeLessThanOrEqual(2000);
  });

  it("grows with how long the owner has been at it, bounded by 2 s", async () => {
    const { client, call } = gatewayClient(server);
    const key = newKey();
    const accepted = await client.reserve(reserveRequest(key, true), call);
    await t.pool.query("UPDATE idem_record SET updated_at = now() - interval '10 seconds' WHERE operation_id = $1", [accepted.operationId]);
    expect(ms((await client.reserve(reserveRequest(key), call)).retryAfter)).toBe(2000);
  });

  it("follows the recoverer's cadence for a record awaiting recovery", async () => {
    const { client, call } = gatewayClient(server);
    const key = newKey();
    const accepted = await client.reserve(reserveRequest(key, true), call);
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    await client.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "cards" }, call);
    await client.resolveEffectAttempt({ ref, generation: 1n, attemptNumber: 1, status: EffectStatus.INDETERMINATE }, call);
    await client.abandon({ ref, generation: 1n }, call);
    const waiting = await client.reserve(reserveRequest(key), call);
    expect(waiting).toMatchObject({ decision: Decision.IN_PROGRESS, state: RecordState.UNKNOWN });
    expect(ms(waiting.retryAfter)).toBe(RECOVERER_INTERVAL_MS);
  });
});
