import { create } from "@bufbuild/protobuf";
import { durationMs, type Duration } from "@bufbuild/protobuf/wkt";
import { createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AdminService, OperationMode } from "../../src/gen/idempotency/v1/admin_pb.js";
import { CoordinatorService, Decision, OperationRefSchema, type ReserveRequest, type ReserveResponse } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { Outcome } from "../../src/gen/idempotency/v1/types_pb.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { newKey, testDocument } from "../support/fixtures.js";
import { startTestServer, type TestServer } from "../support/server.js";
import { until } from "../support/wait.js";
import { paymentReserve } from "../support/wire-requests.js";

/**
 * ReserveResponse.cacheable_for over the wire: set on the REPLAY of a
 * finished record of an enforced operation, at most the coordinator's
 * IDEM_ANSWER_CACHE_MAX_AGE_MS and never past the record's retention; unset
 * on every other answer. The unary RPC and a call of a Batch say the same.
 */

let t: TestDatabase;
let server: TestServer;
let coordinator: Client<typeof CoordinatorService>;
let admin: Client<typeof AdminService>;
const MAX_AGE_MS = 20_000;

beforeAll(async () => {
  t = await createTestDatabase();
  // A short policy refresh, so that a mode change applies within the test.
  server = await startTestServer(t, { operations: [testDocument()], config: { answerCacheMaxAgeMs: MAX_AGE_MS, policyRefreshMs: 100 } });
  const transport = createGrpcTransport({ baseUrl: server.baseUrl });
  coordinator = createClient(CoordinatorService, transport);
  admin = createClient(AdminService, transport);
});
afterAll(async () => {
  await server?.stop();
  await t?.drop();
});

const as = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });
const gateway = () => as(server.tokens.gateway);
const msOf = (d: Duration | undefined) => (d ? durationMs(d) : undefined);

const reserveRequest = (key: string, amount = 10): ReserveRequest => paymentReserve({ key, amount });

/** A finished record of a new key, with `outcome` and its snapshot. */
async function finished(outcome: Outcome = Outcome.SUCCEEDED, statusCode = 201): Promise<{ key: string; operationId: string }> {
  const key = newKey();
  const accepted = await coordinator.reserve(reserveRequest(key), gateway());
  expect(accepted.decision).toBe(Decision.ACCEPTED);
  const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
  await coordinator.complete({ ref, generation: 1n, outcome, snapshot: { statusCode, mediaType: "application/json", body: new TextEncoder().encode('{"id":"p"}') } }, gateway());
  return { key, operationId: accepted.operationId };
}

async function setMode(mode: OperationMode): Promise<void> {
  await admin.setOperationMode({ operation: "payments.create", apiRevision: 1, mode }, as(server.tokens.allTenantsOperator));
}

describe("cacheable_for", () => {
  it.each([
    ["SUCCEEDED", Outcome.SUCCEEDED, 201],
    ["FAILED_FINAL", Outcome.FAILED_FINAL, 502],
    ["REJECTED", Outcome.REJECTED, 400],
  ] as const)("is the operator's max-age on the replay of a %s record kept longer", async (_name, outcome, statusCode) => {
    const { key } = await finished(outcome, statusCode);
    const replay = await coordinator.reserve(reserveRequest(key), gateway());
    expect(replay.decision).toBe(Decision.REPLAY);
    expect(replay.snapshot?.statusCode).toBe(statusCode);
    expect(msOf(replay.cacheableFor)).toBe(MAX_AGE_MS);
  });

  it("is unset on every answer that is not a replay", async () => {
    const key = newKey();
    const accepted = await coordinator.reserve(reserveRequest(key), gateway());
    const inProgress = await coordinator.reserve(reserveRequest(key), gateway());
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    await coordinator.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201 } }, gateway());
    const conflict = await coordinator.reserve(reserveRequest(key, 11), gateway());
    const answers: Array<[Decision, ReserveResponse]> = [
      [Decision.ACCEPTED, accepted],
      [Decision.IN_PROGRESS, inProgress],
      [Decision.PAYLOAD_CONFLICT, conflict],
    ];
    for (const [decision, answer] of answers) {
      expect(answer.decision).toBe(decision);
      expect(answer.cacheableFor, Decision[decision]).toBeUndefined();
    }
  });

  it("never reaches past the record's retention, and is unset once it ended", async () => {
    const { key, operationId } = await finished();
    await t.pool.query("UPDATE idem_record SET retain_until = now() + interval '5 seconds' WHERE operation_id = $1", [operationId]);
    const ending = msOf((await coordinator.reserve(reserveRequest(key), gateway())).cacheableFor)!;
    expect(ending).toBeGreaterThan(0);
    expect(ending).toBeLessThanOrEqual(5000);

    // Past its retention and not swept yet: still replayed, but for this answer only.
    await t.pool.query("UPDATE idem_record SET retain_until = now() - interval '1 second' WHERE operation_id = $1", [operationId]);
    const overdue = await coordinator.reserve(reserveRequest(key), gateway());
    expect(overdue.decision).toBe(Decision.REPLAY);
    expect(overdue.cacheableFor).toBeUndefined();

    await admin.runRetentionSweep({}, as(server.tokens.allTenantsOperator));
    const expired = await coordinator.reserve(reserveRequest(key), gateway());
    expect(expired.decision).toBe(Decision.EXPIRED);
    expect(expired.cacheableFor).toBeUndefined();
  });

  it("is carried by a Batch's reserve call as by the unary RPC", async () => {
    const { key } = await finished();
    const { results } = await coordinator.batch({ calls: [{ call: { case: "reserve", value: reserveRequest(key) } }] }, gateway());
    expect(results[0]?.result.case).toBe("reserve");
    const replay = results[0]!.result.value as ReserveResponse;
    expect(replay.decision).toBe(Decision.REPLAY);
    expect(msOf(replay.cacheableFor)).toBe(MAX_AGE_MS);
  });

  it("is unset while the operation is shadowed or draining, and back once it enforces again", async () => {
    const { key } = await finished();
    try {
      await setMode(OperationMode.SHADOW);
      await until(async () => !(await coordinator.reserve(reserveRequest(key), gateway())).enforced, "the coordinator to apply SHADOW");
      const shadowed = await coordinator.reserve(reserveRequest(key), gateway());
      expect(shadowed).toMatchObject({ decision: Decision.REPLAY, enforced: false });
      expect(shadowed.cacheableFor).toBeUndefined();

      await setMode(OperationMode.DRAINING);
      // Draining refuses new keys: it applies once a new key is refused.
      await until(
        () =>
          coordinator.reserve(reserveRequest(newKey()), gateway()).then(
            () => false,
            () => true,
          ),
        "the coordinator to apply DRAINING",
      );
      const draining = await coordinator.reserve(reserveRequest(key), gateway());
      expect(draining).toMatchObject({ decision: Decision.REPLAY, enforced: true });
      expect(draining.cacheableFor).toBeUndefined();
    } finally {
      await setMode(OperationMode.ENFORCE);
    }
    await until(async () => (await coordinator.reserve(reserveRequest(key), gateway())).cacheableFor !== undefined, "the coordinator to enforce again");
    expect(msOf((await coordinator.reserve(reserveRequest(key), gateway())).cacheableFor)).toBe(MAX_AGE_MS);
  });
});
