import { create } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { Decision, ReserveRequestSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema, Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey, testDocument } from "../support/fixtures.js";
import { wireReason } from "../support/refusals.js";
import { gatewayClient, reservesWaiting, type TestServer, useTestServer } from "../support/server.js";
import { until } from "../support/wait.js";

/**
 * Reserve's wait_for_owner: a duplicate of a request still running waits for
 * its owner and is answered with what the owner left (a REPLAY, or the record
 * itself when the owner let go), on the coordinator the owner finished on or
 * on another one; after its bound it is IN_PROGRESS as before.
 */
const t = useTestDatabase();
const operations = [testDocument({ lease: { default: "30s", max: "5m" } })];
const server = useTestServer(t, { operations });
// A replica of the same deployment: the same key ring opens the bodies the first one sealed.
const replica = useTestServer(t, () => ({ operations, config: { snapshotKeys: server.snapshotKeys } }));

function reserveRequest(key: string, options: { claim?: boolean; waitMs?: number; waitForOwner?: { seconds: bigint; nanos: number } } = {}) {
  return create(ReserveRequestSchema, {
    subject: { tenant: "acme", principal: "alice" },
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: key,
    claim: options.claim ?? true,
    request: {
      case: "parts",
      value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode('{"amount":10}') }),
    },
    ...(options.waitMs !== undefined ? { waitForOwner: durationFromMs(options.waitMs) } : {}),
    ...(options.waitForOwner ? { waitForOwner: options.waitForOwner } : {}),
  });
}

/** A promise's state without waiting for it. */
function settledYet(promise: Promise<unknown>): Promise<boolean> {
  const marker = Symbol();
  return Promise.race([
    promise.then(
      () => true,
      () => true,
    ),
    new Promise((resolve) => setTimeout(() => resolve(marker), 0)),
  ]).then((v) => v === true);
}

/** Until `coordinator` has `n` Reserves waiting. */
const untilWaiting = (coordinator: TestServer, n: number) => until(async () => (await reservesWaiting(coordinator)) === n, `${n} Reserves waiting for an owner`);

async function owned(key: string) {
  const { client, call } = gatewayClient(server);
  const accepted = await client.reserve(reserveRequest(key), call);
  expect(accepted.decision).toBe(Decision.ACCEPTED);
  return { client, call, ref: { tenant: "acme", operationId: accepted.operationId } };
}

describe("Reserve with wait_for_owner", () => {
  it("waits while the owner runs and answers the owner's REPLAY once it completes", async () => {
    const key = newKey();
    const { client, call, ref } = await owned(key);
    const duplicate = client.reserve(reserveRequest(key, { waitMs: 20_000 }), call);
    await untilWaiting(server, 1);
    expect(await settledYet(duplicate), "the duplicate to be waiting, not answered IN_PROGRESS").toBe(false);

    const done = await client.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201, body: new TextEncoder().encode('{"id":1}') } }, call);
    const answer = await duplicate;
    expect(answer.decision).toBe(Decision.REPLAY);
    expect(answer.operationId).toBe(ref.operationId);
    expect(answer.snapshot?.statusCode).toBe(201);
    expect(answer.snapshot?.digest).toEqual(done.snapshotDigest);
  });

  it("sees an owner that completes on another coordinator of the same registry", async () => {
    const key = newKey();
    const { client, call, ref } = await owned(key);
    const other = gatewayClient(replica);
    const duplicate = other.client.reserve(reserveRequest(key, { waitMs: 20_000 }), other.call);
    await untilWaiting(replica, 1);
    expect(await settledYet(duplicate)).toBe(false);

    await client.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201 } }, call);
    expect((await duplicate).decision).toBe(Decision.REPLAY);
  });

  it("takes the record over when the owner releases it while the duplicate waits", async () => {
    const key = newKey();
    const { client, call, ref } = await owned(key);
    const duplicate = client.reserve(reserveRequest(key, { waitMs: 20_000 }), call);
    await untilWaiting(server, 1);
    await client.release({ ref, generation: 1n }, call);
    const answer = await duplicate;
    expect(answer).toMatchObject({ decision: Decision.ACCEPTED, operationId: ref.operationId, generation: 2n, state: RecordState.EXECUTING });
  });

  it("answers IN_PROGRESS, with its Retry-After, when the owner is still at it after the wait", async () => {
    const key = newKey();
    const { client, call } = await owned(key);
    const startedAt = performance.now();
    const answer = await client.reserve(reserveRequest(key, { waitMs: 400 }), call);
    expect(performance.now() - startedAt, "the duplicate to have waited its bound").toBeGreaterThanOrEqual(400);
    expect(answer.decision).toBe(Decision.IN_PROGRESS);
    expect(answer.retryAfter).toBeDefined();
  });

  it("answers before the call's deadline, however long the wait asked for", async () => {
    const key = newKey();
    const { client, call } = await owned(key);
    const startedAt = performance.now();
    const answer = await client.reserve(reserveRequest(key, { waitMs: 30_000 }), { ...call, timeoutMs: 1500 });
    // It waited most of the deadline (1500 ms, less the fifth kept for the answer), and answered within it.
    expect(performance.now() - startedAt).toBeGreaterThanOrEqual(1200);
    expect(answer.decision).toBe(Decision.IN_PROGRESS);
  });

  it("answers at once when nothing is in flight: a new key is ACCEPTED without waiting", async () => {
    const { client, call } = gatewayClient(server);
    const answer = client.reserve(reserveRequest(newKey(), { waitMs: 30_000 }), { ...call, timeoutMs: 5000 });
    expect((await answer).decision).toBe(Decision.ACCEPTED);
  });

  it("refuses a negative wait with INVALID_REQUEST and stores nothing", async () => {
    const { client, call } = gatewayClient(server);
    const key = newKey();
    const refused = client.reserve(reserveRequest(key, { waitForOwner: { seconds: -1n, nanos: 0 } }), call);
    expect(await wireReason(refused)).toBe("INVALID_REQUEST");
    const lookup = client.lookup(
      { by: { case: "scope", value: { subject: { tenant: "acme", principal: "alice" }, operation: "payments.create", apiRevision: 1, idempotencyKey: key } } },
      call,
    );
    expect(await wireReason(lookup)).toBe("NOT_FOUND");
  });
});
