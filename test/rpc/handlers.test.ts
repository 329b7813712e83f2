import { randomBytes } from "node:crypto";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";
import { timestampDate, type Duration, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, createRouterTransport, type Client, type Transport } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { CallerGrant, Role } from "../../src/server/callers.js";
import { FINGERPRINT_SCHEME, fingerprint } from "../../src/contract/fingerprint.js";
import { IdempotencyError } from "../../src/contract/errors.js";
import { parseKeyring } from "../../src/crypto/sealing.js";
import { AdminService, OperationMode, StreamEventsRequestSchema, StreamEventsResponseSchema, type StreamEventsResponse } from "../../src/gen/idempotency/v1/admin_pb.js";
import {
  ClaimMode,
  CoordinatorService,
  Decision,
  OperationRefSchema,
  ReserveRequestSchema,
  ReserveResponseSchema,
  type OperationRef,
  type ReserveRequest,
} from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { EffectStatus, HttpRequestPartsSchema, Outcome, RecordState, ResponseSnapshotSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { PolicyCache } from "../../src/policy/cache.js";
import type { Db } from "../../src/registry/db.js";
import { PolicyStore } from "../../src/registry/policy-store.js";
import { Registry } from "../../src/registry/registry.js";
import { Callers, tokenHash } from "../../src/server/callers.js";
import { ACCESS_RULES } from "../../src/server/authorization.js";
import { policyToProto } from "../../src/server/policy-convert.js";
import { JSON_OPTIONS, refusalInterceptors, serviceRoutes } from "../../src/server/routes.js";
import { wireRefusal, type WireRefusal } from "../support/refusals.js";
import { silentLogger, useTestDatabase } from "../support/database.js";
import { jsonParts, newKey, testDocument, testPolicy } from "../support/fixtures.js";
import { countRows } from "../support/registry-helpers.js";
import { until } from "../support/wait.js";

/**
 * The handlers of CoordinatorService and AdminService, with the interceptors
 * the server puts around them, called through connect-es's in-memory router
 * transport over a real registry: how each RPC maps its request to the
 * registry and the registry's answer to its response, and how every refusal
 * reaches the client (gRPC code, ErrorInfo reason, domain and metadata),
 * without a socket. The wire tests (wire.test.ts) show the protocols and
 * the listener; these show the mapping, RPC by RPC.
 */

const t = useTestDatabase();

const DOMAIN = "idempotency.v1";
const MISSING_ID = "01a229d0-0f4c-7516-846e-0457ee592196";

/** One token per caller; each test picks the caller it acts as. */
const TOKENS = {
  /** gateway role, tenant acme, operation payments.create */
  gateway: `gw_${randomBytes(16).toString("hex")}`,
  /** worker role, every tenant and operation */
  worker: `wk_${randomBytes(16).toString("hex")}`,
  /** operator role, tenant acme, every operation */
  operator: `op_${randomBytes(16).toString("hex")}`,
  /** operator role, every tenant and operation */
  allTenantsOperator: `oa_${randomBytes(16).toString("hex")}`,
  /** gateway role, tenant globex only */
  globex: `gx_${randomBytes(16).toString("hex")}`,
  /** gateway role, tenant acme, operation refunds.create only */
  refunds: `rf_${randomBytes(16).toString("hex")}`,
};

const GRANTS: CallerGrant[] = [
  { name: "payments-gateway", tokenSha256: tokenHash(TOKENS.gateway), tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] },
  { name: "recovery-worker", tokenSha256: tokenHash(TOKENS.worker), tenants: ["*"], operations: ["*"], roles: ["worker"] },
  { name: "operator", tokenSha256: tokenHash(TOKENS.operator), tenants: ["acme"], operations: ["*"], roles: ["operator"] },
  { name: "all-tenants-operator", tokenSha256: tokenHash(TOKENS.allTenantsOperator), tenants: ["*"], operations: ["*"], roles: ["operator"] },
  { name: "globex-gateway", tokenSha256: tokenHash(TOKENS.globex), tenants: ["globex"], operations: ["payments.create"], roles: ["gateway"] },
  { name: "refunds-gateway", tokenSha256: tokenHash(TOKENS.refunds), tenants: ["acme"], operations: ["refunds.create"], roles: ["gateway"] },
];

const as = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });

/**
 * The two services and the interceptors that decide refusals, exactly as the
 * server mounts them (src/server/routes.ts); the server's outer interceptors
 * (in-flight count, tracing, metrics, access log) only observe an RPC.
 */
function serverTransport(deps: { registry: Registry; db: Db; policies: PolicyCache; callers: Callers }): Transport {
  return createRouterTransport(serviceRoutes({ ...deps, store: new PolicyStore(deps.db), policyRefreshMs: 60_000 }), {
    router: { interceptors: refusalInterceptors(silentLogger, deps.callers), jsonOptions: JSON_OPTIONS },
  });
}

let policies: PolicyCache;
let coordinator: Client<typeof CoordinatorService>;
let admin: Client<typeof AdminService>;

beforeAll(async () => {
  for (const document of [
    testDocument(),
    // A tight operation: one unfinished record per principal, small snapshots.
    testDocument({ operation: "quota.create", maxActivePerPrincipal: 1, snapshot: { maxBodyBytes: 16 } }),
    // Modes and epochs are changed on operations of their own, so that no other test sees them.
    testDocument({ operation: "payouts.create" }),
    testDocument({ operation: "drain.create" }),
  ]) {
    await new PolicyStore(t.db).publish(document, "test");
  }
  policies = new PolicyCache({ load: () => new PolicyStore(t.db).load(), refreshMs: 60_000, logger: silentLogger });
  await policies.start();
  // Bodies are sealed where they are stored, as on every production coordinator: answers must carry them opened.
  const keyring = parseKeyring({ active: "k1", keys: { k1: randomBytes(32).toString("base64") } });
  const transport = serverTransport({ registry: new Registry({ policies, keyring }), db: t.db, policies, callers: new Callers(GRANTS, false) });
  coordinator = createClient(CoordinatorService, transport);
  admin = createClient(AdminService, transport);
});
afterAll(() => {
  policies?.stop();
});

// The clients exist once beforeAll ran; tables of RPCs are built before that.
const coordinatorClient = (): unknown => coordinator;
const adminClient = (): unknown => admin;

const encode = (text: string) => new TextEncoder().encode(text);

function reserveRequest(key: string, overrides: MessageInitShape<typeof ReserveRequestSchema> = {}): ReserveRequest {
  return create(ReserveRequestSchema, {
    subject: { tenant: "acme", principal: "alice" },
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: key,
    request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: encode('{"amount":10}') }) },
    ...overrides,
  } as MessageInitShape<typeof ReserveRequestSchema>);
}

/** A record accepted for the gateway (claimed unless asked otherwise), and the ref its writes name. */
async function accepted(options: { claim?: boolean; token?: string; overrides?: MessageInitShape<typeof ReserveRequestSchema> } = {}) {
  const key = newKey();
  const reserved = await coordinator.reserve(reserveRequest(key, { claim: options.claim ?? true, ...options.overrides }), as(options.token ?? TOKENS.gateway));
  expect(reserved.decision).toBe(Decision.ACCEPTED);
  const tenant = options.overrides?.subject?.tenant ?? "acme";
  return { key, reserved, ref: create(OperationRefSchema, { tenant, operationId: reserved.operationId }) };
}

interface Row {
  state: string;
  generation: string;
  recovering: boolean;
  lease_expires_at: Date | null;
  lease_ms: number | null;
  completed_at: Date | null;
  snapshot_body: Buffer | null;
  snapshot_digest: Buffer | null;
}

/** The record as stored; lease_ms is the lease granted by its last change (its end less the change's time). */
async function stored(operationId: string): Promise<Row> {
  const { rows } = await t.pool.query(
    `SELECT state, generation::text, recovering, lease_expires_at, completed_at, snapshot_body, snapshot_digest,
            round(extract(epoch FROM lease_expires_at - updated_at) * 1000)::int AS lease_ms
       FROM idem_record WHERE operation_id = $1`,
    [operationId],
  );
  expect(rows).toHaveLength(1);
  return rows[0] as Row;
}

const dateOf = (timestamp: Timestamp | undefined) => (timestamp ? timestampDate(timestamp) : undefined);
const msOf = (duration: Duration | undefined) => (duration ? Number(duration.seconds) * 1000 + duration.nanos / 1e6 : undefined);

/** What the client sees of a refused call, with the code by name (as the tables here write it). */
type Refusal = Omit<WireRefusal, "code"> & { code: string };

async function refusalOf(call: Promise<unknown>): Promise<Refusal | undefined> {
  const refusal = await wireRefusal(call);
  return refusal && { ...refusal, code: Code[refusal.code] };
}

/** Asserts that `call` is refused with `code`, `reason` in the coordinator's domain and exactly `metadata`, with a message; returns the refusal. */
async function expectRefused(call: Promise<unknown>, code: Code, reason: string, metadata: Record<string, string> = {}): Promise<Refusal> {
  const refusal = await refusalOf(call);
  expect(refusal, `expected ${reason}`).toBeDefined();
  const { message, ...seen } = refusal!;
  expect(seen).toStrictEqual({ code: Code[code], reason, domain: DOMAIN, metadata });
  expect(message.length).toBeGreaterThan(0);
  return refusal!;
}

/** Reads a server stream to its end. */
async function drain<T>(stream: AsyncIterable<T>): Promise<T[]> {
  const messages: T[] = [];
  for await (const message of stream) messages.push(message);
  return messages;
}

describe("a lifecycle through the handlers", () => {
  it("maps every write RPC's response from the record as stored, and replays and looks up the result", async () => {
    const key = newKey();
    const reserved = await coordinator.reserve(reserveRequest(key), as(TOKENS.gateway));
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: reserved.operationId });
    let row = await stored(reserved.operationId);
    expect(reserved).toMatchObject({
      decision: Decision.ACCEPTED,
      state: RecordState.RESERVED,
      generation: 1n,
      enforced: true,
      schemaRevision: 1,
      contractVersion: "http.idempotency.v1",
    });
    expect(reserved.operationId).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(dateOf(reserved.leaseExpiresAt)).toEqual(row.lease_expires_at);
    expect(reserved.retryAfter).toBeUndefined();
    expect(reserved.snapshot).toBeUndefined();

    // Durations map to milliseconds, nanos included.
    const claimed = await coordinator.claim({ ref, mode: ClaimMode.OWNER, generation: 1n, lease: { seconds: 4n, nanos: 500_000_000 } }, as(TOKENS.gateway));
    row = await stored(reserved.operationId);
    expect(row.lease_ms).toBe(4500);
    expect(claimed).toMatchObject({ generation: 1n, state: RecordState.EXECUTING, recovering: false, effectAttempts: [] });
    expect(dateOf(claimed.leaseExpiresAt)).toEqual(row.lease_expires_at);

    const renewed = await coordinator.renewLease({ ref, generation: 1n, lease: { seconds: 7n } }, as(TOKENS.gateway));
    row = await stored(reserved.operationId);
    expect(row.lease_ms).toBe(7000);
    expect(dateOf(renewed.leaseExpiresAt)).toEqual(row.lease_expires_at);

    const recorded = await coordinator.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "cards" }, as(TOKENS.gateway));
    const { rows: attemptRows } = await t.pool.query<{ downstream_key: string; created_at: Date }>(
      "SELECT downstream_key, created_at FROM idem_effect_attempt WHERE operation_id = $1",
      [ref.operationId],
    );
    expect(recorded.attempt).toMatchObject({
      attemptNumber: 1,
      effect: "card.charge",
      provider: "cards",
      downstreamKey: attemptRows[0]?.downstream_key,
      status: EffectStatus.PENDING,
      providerHandle: "",
      generation: 1n,
    });
    expect(dateOf(recorded.attempt?.createdAt)).toEqual(attemptRows[0]?.created_at);
    expect(recorded.attempt?.resolvedAt).toBeUndefined();

    const resolved = await coordinator.resolveEffectAttempt({ ref, generation: 1n, attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "ch_1" }, as(TOKENS.gateway));
    expect(resolved.attempt).toMatchObject({ attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "ch_1", downstreamKey: recorded.attempt?.downstreamKey });
    expect(resolved.attempt?.resolvedAt).toBeDefined();

    const body = encode('{"id":"p_1","amount":10}');
    const completed = await coordinator.complete(
      {
        ref,
        generation: 1n,
        outcome: Outcome.SUCCEEDED,
        snapshot: {
          statusCode: 201,
          mediaType: "application/json",
          location: "/v1/payments/p_1",
          headers: [
            { name: "Content-Type", value: "application/json" },
            { name: "Set-Cookie", value: "session=secret" },
          ],
          body,
        },
      },
      as(TOKENS.gateway),
    );
    row = await stored(reserved.operationId);
    expect(completed.state).toBe(RecordState.SUCCEEDED);
    expect(Buffer.from(completed.snapshotDigest).equals(row.snapshot_digest!)).toBe(true);
    expect(dateOf(completed.completedAt)).toEqual(row.completed_at);
    // Stored sealed: the plaintext is not what the table holds.
    expect(row.snapshot_body!.includes(Buffer.from(body))).toBe(false);

    const replay = await coordinator.reserve(reserveRequest(key), as(TOKENS.gateway));
    expect(replay).toMatchObject({ decision: Decision.REPLAY, operationId: ref.operationId, state: RecordState.SUCCEEDED, generation: 0n, enforced: true });
    expect(replay.retryAfter).toBeUndefined();
    expect(replay.leaseExpiresAt).toBeUndefined();
    expect(replay.snapshot).toMatchObject({
      statusCode: 201,
      mediaType: "application/json",
      location: "/v1/payments/p_1",
      headers: [{ name: "content-type", value: "application/json" }],
      body,
      digest: completed.snapshotDigest,
    });

    const byRef = await coordinator.lookup({ by: { case: "ref", value: ref }, subject: { tenant: "acme", principal: "alice" } }, as(TOKENS.gateway));
    expect(byRef.record).toMatchObject({
      operationId: ref.operationId,
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 1,
      schemaRevision: 1,
      state: RecordState.SUCCEEDED,
      generation: 1n,
      recovering: false,
      snapshot: { statusCode: 201, body, digest: completed.snapshotDigest },
      effectAttempts: [{ attemptNumber: 1, effect: "card.charge", status: EffectStatus.CONFIRMED, providerHandle: "ch_1", generation: 1n }],
      contractVersion: "http.idempotency.v1",
    });
    expect(byRef.record?.leaseExpiresAt).toBeUndefined();
    expect(dateOf(byRef.record?.completedAt)).toEqual(row.completed_at);
    const byScope = await coordinator.lookup(
      { by: { case: "scope", value: { subject: { tenant: "acme", principal: "alice" }, operation: "payments.create", apiRevision: 1, idempotencyKey: key } } },
      as(TOKENS.gateway),
    );
    expect(byScope.record).toEqual(byRef.record);
  });

  it("answers a retry IN_PROGRESS without the owner's fencing token, with a Retry-After within the owner's hint", async () => {
    const { key, ref } = await accepted();
    const retry = await coordinator.reserve(reserveRequest(key), as(TOKENS.gateway));
    const row = await stored(ref.operationId);
    expect(retry).toMatchObject({ decision: Decision.IN_PROGRESS, operationId: ref.operationId, state: RecordState.EXECUTING, generation: 0n });
    expect(dateOf(retry.leaseExpiresAt)).toEqual(row.lease_expires_at);
    // From 250 ms to 2 s for an owner at work, in whole milliseconds.
    const retryAfter = msOf(retry.retryAfter)!;
    expect(retryAfter).toBeGreaterThanOrEqual(250);
    expect(retryAfter).toBeLessThanOrEqual(2000);
    expect(retry.retryAfter!.nanos % 1_000_000).toBe(0);
    expect(retry.snapshot).toBeUndefined();
  });

  it("answers PAYLOAD_CONFLICT with nothing of the first request: no id, state, lease or Retry-After", async () => {
    const { key } = await accepted();
    const conflict = await coordinator.reserve(
      reserveRequest(key, { request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", body: encode('{"amount":11}') }) } }),
      as(TOKENS.gateway),
    );
    expect(conflict).toStrictEqual(
      create(ReserveResponseSchema, { decision: Decision.PAYLOAD_CONFLICT, enforced: true, schemaRevision: 1, contractVersion: "http.idempotency.v1" }),
    );
  });

  it("judges a precomputed fingerprint as the parts it was computed from", async () => {
    const { key, ref } = await accepted();
    const precomputed = (body: unknown) =>
      coordinator.reserve(
        reserveRequest(key, {
          request: { case: "fingerprint", value: { scheme: FINGERPRINT_SCHEME, schemaRevision: 1, digest: fingerprint(jsonParts(body), testPolicy().fingerprint) } },
        }),
        as(TOKENS.gateway),
      );
    expect(await precomputed({ amount: 10 })).toMatchObject({ decision: Decision.IN_PROGRESS, operationId: ref.operationId });
    expect((await precomputed({ amount: 11 })).decision).toBe(Decision.PAYLOAD_CONFLICT);
  });

  it("releases a reservation at the same generation, and the next retry takes it over at the next", async () => {
    const { key, ref } = await accepted();
    const released = await coordinator.release({ ref, generation: 1n }, as(TOKENS.gateway));
    expect(released).toMatchObject({ state: RecordState.RESERVED, generation: 1n });
    expect((await stored(ref.operationId)).lease_expires_at).toBeNull();
    // Repeating it changes nothing.
    expect(await coordinator.release({ ref, generation: 1n }, as(TOKENS.gateway))).toMatchObject({ state: RecordState.RESERVED, generation: 1n });
    const retry = await coordinator.reserve(reserveRequest(key, { claim: true }), as(TOKENS.gateway));
    expect(retry).toMatchObject({ decision: Decision.ACCEPTED, operationId: ref.operationId, state: RecordState.EXECUTING, generation: 2n });
  });

  it("hands a possibly effected record to recovery: Abandon makes it UNKNOWN, a worker lists it for RECOVER and claims it with its attempts", async () => {
    const { ref } = await accepted();
    const first = await coordinator.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "cards" }, as(TOKENS.gateway));
    expect(await coordinator.abandon({ ref, generation: 1n }, as(TOKENS.gateway))).toMatchObject({ state: RecordState.UNKNOWN, generation: 1n });

    // Beside it, a record whose lease ended with nothing possible: the next owner takes it over instead.
    const idle = await accepted();
    await t.pool.query("UPDATE idem_record SET lease_expires_at = now() - interval '1 second' WHERE operation_id = $1", [idle.ref.operationId]);
    const listed = await coordinator.listRecoverable({ tenant: "acme", pageSize: 500 }, as(TOKENS.worker));
    const modes = new Map(listed.records.map((r) => [r.record?.operationId, r.claimMode]));
    expect(modes.get(ref.operationId)).toBe(ClaimMode.RECOVER);
    expect(modes.get(idle.ref.operationId)).toBe(ClaimMode.TAKEOVER);
    expect(listed.records.find((r) => r.record?.operationId === ref.operationId)?.record).toMatchObject({
      state: RecordState.UNKNOWN,
      effectAttempts: [{ attemptNumber: 1, effect: "card.charge", status: EffectStatus.PENDING }],
    });

    const recovering = await coordinator.claim({ ref, mode: ClaimMode.RECOVER, generation: 1n }, as(TOKENS.worker));
    expect(recovering).toMatchObject({
      generation: 2n,
      state: RecordState.EXECUTING,
      recovering: true,
      effectAttempts: [{ attemptNumber: 1, effect: "card.charge", provider: "cards", downstreamKey: first.attempt?.downstreamKey, status: EffectStatus.PENDING, generation: 1n }],
    });
    await expectRefused(coordinator.recordEffectAttempt({ ref, generation: 2n, effect: "email.send" }, as(TOKENS.worker)), Code.FailedPrecondition, "NEW_EFFECT_IN_RECOVERY");
    const replayed = await coordinator.recordEffectAttempt({ ref, generation: 2n, effect: "card.charge", provider: "cards" }, as(TOKENS.worker));
    expect(replayed.attempt).toMatchObject({ attemptNumber: 2, downstreamKey: first.attempt?.downstreamKey, generation: 2n });
    // The owner that abandoned it is fenced out.
    await expectRefused(coordinator.abandon({ ref, generation: 1n }, as(TOKENS.gateway)), Code.FailedPrecondition, "STALE_GENERATION", { current_generation: "2" });
  });

  it("pages recoverable records with a token that resumes after the last one", async () => {
    const tenant = `pages${randomBytes(3).toString("hex")}`;
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const { ref } = await accepted({ token: TOKENS.worker, overrides: { subject: { tenant, principal: "alice" } } });
      await t.pool.query("UPDATE idem_record SET lease_expires_at = now() - interval '1 second' WHERE operation_id = $1", [ref.operationId]);
      ids.push(ref.operationId);
    }
    const seen: string[] = [];
    let pageToken = "";
    let pages = 0;
    do {
      const page = await coordinator.listRecoverable({ tenant, pageSize: 2, pageToken }, as(TOKENS.worker));
      seen.push(...page.records.map((r) => r.record!.operationId));
      pageToken = page.nextPageToken;
      pages++;
    } while (pageToken !== "" && pages < 5);
    expect(seen.sort()).toEqual([...ids].sort());
    expect(pages).toBe(2);
  });
});

describe("refusals of the lifecycle", () => {
  it("carry their gRPC code, reason and facts, and leave the record as it was", async () => {
    const { ref } = await accepted();
    const before = await stored(ref.operationId);
    const lease = before.lease_expires_at!.toISOString();
    await expectRefused(coordinator.claim({ ref, mode: ClaimMode.OWNER, generation: 2n }, as(TOKENS.gateway)), Code.FailedPrecondition, "STALE_GENERATION", {
      current_generation: "1",
    });
    await expectRefused(coordinator.claim({ ref, mode: ClaimMode.TAKEOVER, generation: 1n }, as(TOKENS.gateway)), Code.FailedPrecondition, "LEASE_HELD", {
      lease_expires_at: lease,
    });
    await expectRefused(coordinator.claim({ ref, mode: ClaimMode.RECOVER, generation: 1n }, as(TOKENS.worker)), Code.FailedPrecondition, "LEASE_HELD", { lease_expires_at: lease });
    await expectRefused(
      coordinator.resolveEffectAttempt({ ref, generation: 1n, attemptNumber: 9, status: EffectStatus.CONFIRMED }, as(TOKENS.gateway)),
      Code.NotFound,
      "ATTEMPT_NOT_FOUND",
    );
    expect(await stored(ref.operationId)).toEqual(before);

    await coordinator.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge" }, as(TOKENS.gateway));
    const snapshot = { statusCode: 201, body: encode("{}") };
    await expectRefused(coordinator.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot }, as(TOKENS.gateway)), Code.FailedPrecondition, "UNRESOLVED_EFFECTS");
    await coordinator.resolveEffectAttempt({ ref, generation: 1n, attemptNumber: 1, status: EffectStatus.CONFIRMED }, as(TOKENS.gateway));
    await expectRefused(
      coordinator.resolveEffectAttempt({ ref, generation: 1n, attemptNumber: 1, status: EffectStatus.NO_EFFECT }, as(TOKENS.gateway)),
      Code.FailedPrecondition,
      "ATTEMPT_ALREADY_RESOLVED",
      { status: "CONFIRMED" },
    );
    await expectRefused(coordinator.release({ ref, generation: 1n }, as(TOKENS.gateway)), Code.FailedPrecondition, "EFFECT_POSSIBLE");
    await expectRefused(coordinator.complete({ ref, generation: 1n, outcome: Outcome.REJECTED, snapshot }, as(TOKENS.gateway)), Code.FailedPrecondition, "EFFECT_POSSIBLE");
    expect((await stored(ref.operationId)).state).toBe("EXECUTING");

    await coordinator.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot }, as(TOKENS.gateway));
    await expectRefused(coordinator.complete({ ref, generation: 1n, outcome: Outcome.FAILED_FINAL, snapshot }, as(TOKENS.gateway)), Code.FailedPrecondition, "ALREADY_COMPLETED", {
      state: "SUCCEEDED",
    });
    await expectRefused(coordinator.renewLease({ ref, generation: 1n }, as(TOKENS.gateway)), Code.FailedPrecondition, "INVALID_TRANSITION", { state: "SUCCEEDED" });
    await expectRefused(coordinator.abandon({ ref, generation: 1n }, as(TOKENS.gateway)), Code.FailedPrecondition, "INVALID_TRANSITION", { state: "SUCCEEDED" });
  });

  it("refuse an UNKNOWN record's lease and new attempts with LEASE_EXPIRED, and OWNER or TAKEOVER with INVALID_TRANSITION", async () => {
    const { ref } = await accepted();
    await coordinator.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge" }, as(TOKENS.gateway));
    await coordinator.abandon({ ref, generation: 1n }, as(TOKENS.gateway));
    const before = await stored(ref.operationId);
    await expectRefused(coordinator.renewLease({ ref, generation: 1n }, as(TOKENS.gateway)), Code.FailedPrecondition, "LEASE_EXPIRED", { state: "UNKNOWN" });
    await expectRefused(coordinator.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge" }, as(TOKENS.gateway)), Code.FailedPrecondition, "LEASE_EXPIRED", {
      state: "UNKNOWN",
    });
    await expectRefused(coordinator.claim({ ref, mode: ClaimMode.OWNER, generation: 1n }, as(TOKENS.gateway)), Code.FailedPrecondition, "INVALID_TRANSITION", { state: "UNKNOWN" });
    await expectRefused(coordinator.claim({ ref, mode: ClaimMode.TAKEOVER, generation: 1n }, as(TOKENS.worker)), Code.FailedPrecondition, "INVALID_TRANSITION", {
      state: "UNKNOWN",
    });
    expect(await stored(ref.operationId)).toEqual(before);
  });

  it("refuse a snapshot beyond the policy's bounds with SNAPSHOT_TOO_LARGE, completing nothing", async () => {
    const { ref } = await accepted({ token: TOKENS.worker, overrides: { operation: "quota.create", subject: { tenant: "acme", principal: "snapshots" } } });
    const snapshot = { statusCode: 201, body: encode('{"id":"seventeen b"}') };
    await expectRefused(coordinator.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot }, as(TOKENS.worker)), Code.ResourceExhausted, "SNAPSHOT_TOO_LARGE", {
      field: "snapshot.body",
      limit: "16",
    });
    expect((await stored(ref.operationId)).state).toBe("EXECUTING");
  });
});

describe("Reserve's refusals", () => {
  const parts = (init: MessageInitShape<typeof HttpRequestPartsSchema>) => ({ case: "parts" as const, value: create(HttpRequestPartsSchema, init) });
  const precomputed = (scheme: string, schemaRevision: number, digest: Uint8Array) => ({ case: "fingerprint" as const, value: { scheme, schemaRevision, digest } });
  const cases: Array<[name: string, overrides: MessageInitShape<typeof ReserveRequestSchema>, token: string, code: Code, reason: string, metadata?: Record<string, string>]> = [
    ["a key without entropy", { idempotencyKey: "aaaaaaaaaaaaaaaaaaaaaaaa" }, TOKENS.gateway, Code.InvalidArgument, "INVALID_KEY", { min_entropy_bits: "96" }],
    ["an operation without a policy", { operation: "ledger.post" }, TOKENS.worker, Code.InvalidArgument, "UNKNOWN_OPERATION"],
    ["a request without parts or fingerprint", { request: { case: undefined } }, TOKENS.gateway, Code.InvalidArgument, "INVALID_REQUEST"],
    ["a request without a subject", { subject: undefined }, TOKENS.gateway, Code.InvalidArgument, "INVALID_REQUEST"],
    ["a writer epoch beyond what the registry holds exactly", { writerEpoch: 2n ** 60n }, TOKENS.gateway, Code.InvalidArgument, "INVALID_REQUEST"],
    ["a negative lease", { lease: { seconds: -1n } }, TOKENS.gateway, Code.InvalidArgument, "INVALID_REQUEST"],
    ["a lease longer than a year", { lease: { seconds: 86_400n * 366n } }, TOKENS.gateway, Code.InvalidArgument, "INVALID_REQUEST"],
    ["a malformed HTTP method", { request: parts({ method: "PO ST", path: "/v1/payments" }) }, TOKENS.gateway, Code.InvalidArgument, "INVALID_PAYLOAD"],
    ["a fingerprint of another scheme", { request: precomputed("sha1", 1, new Uint8Array(32)) }, TOKENS.gateway, Code.InvalidArgument, "UNSUPPORTED_FINGERPRINT_SCHEME"],
    [
      "a fingerprint of another schema revision",
      { request: precomputed(FINGERPRINT_SCHEME, 2, new Uint8Array(32)) },
      TOKENS.gateway,
      Code.InvalidArgument,
      "SCHEMA_REVISION_MISMATCH",
      { schema_revision: "1" },
    ],
    ["a fingerprint digest that is not 32 bytes", { request: precomputed(FINGERPRINT_SCHEME, 1, new Uint8Array(31)) }, TOKENS.gateway, Code.InvalidArgument, "INVALID_REQUEST"],
    ["another tenant than the caller's", { subject: { tenant: "globex", principal: "alice" } }, TOKENS.gateway, Code.PermissionDenied, "PERMISSION_DENIED"],
    ["an operation the caller is not granted", { operation: "refunds.create" }, TOKENS.gateway, Code.PermissionDenied, "PERMISSION_DENIED"],
    ["an operator, who may not reserve", {}, TOKENS.operator, Code.PermissionDenied, "PERMISSION_DENIED"],
  ];

  it.each(cases)("refuses %s, storing nothing", async (_name, overrides, token, code, reason, metadata) => {
    const before = await countRows(t.pool);
    await expectRefused(coordinator.reserve(reserveRequest(newKey(), overrides), as(token)), code, reason, metadata);
    expect(await countRows(t.pool)).toEqual(before);
  });

  it("refuses one more new key past the principal's quota with QUOTA_EXCEEDED, storing nothing", async () => {
    const subject = { tenant: "acme", principal: `quota-${randomBytes(4).toString("hex")}` };
    await accepted({ token: TOKENS.worker, overrides: { operation: "quota.create", subject } });
    const before = await countRows(t.pool);
    await expectRefused(coordinator.reserve(reserveRequest(newKey(), { operation: "quota.create", subject }), as(TOKENS.worker)), Code.ResourceExhausted, "QUOTA_EXCEEDED", {
      limit: "1",
    });
    expect(await countRows(t.pool)).toEqual(before);
  });

  it("refuses a writer older than the operation's epoch with STALE_WRITER_EPOCH, naming the epoch", async () => {
    const raised = await admin.raiseWriterEpoch({ operation: "payouts.create", apiRevision: 1, writerEpoch: 5n }, as(TOKENS.allTenantsOperator));
    expect(raised.control?.writerEpoch).toBe(5n);
    await expectRefused(
      coordinator.reserve(reserveRequest(newKey(), { operation: "payouts.create", writerEpoch: 4n }), as(TOKENS.worker)),
      Code.FailedPrecondition,
      "STALE_WRITER_EPOCH",
      { writer_epoch: "5" },
    );
    expect((await coordinator.reserve(reserveRequest(newKey(), { operation: "payouts.create", writerEpoch: 5n }), as(TOKENS.worker))).decision).toBe(Decision.ACCEPTED);
  });

  it("refuses new operations while draining with OPERATION_DRAINING (UNAVAILABLE), and answers those already accepted", async () => {
    const { key, ref } = await accepted({ token: TOKENS.worker, overrides: { operation: "drain.create" } });
    await admin.setOperationMode({ operation: "drain.create", apiRevision: 1, mode: OperationMode.DRAINING }, as(TOKENS.allTenantsOperator));
    await expectRefused(coordinator.reserve(reserveRequest(newKey(), { operation: "drain.create" }), as(TOKENS.worker)), Code.Unavailable, "OPERATION_DRAINING");
    const retry = await coordinator.reserve(reserveRequest(key, { operation: "drain.create" }), as(TOKENS.worker));
    expect(retry).toMatchObject({ decision: Decision.IN_PROGRESS, operationId: ref.operationId });
  });

  it("says enforced=false in shadow mode", async () => {
    const control = await admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.SHADOW }, as(TOKENS.allTenantsOperator));
    expect(control.control).toMatchObject({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.SHADOW, updatedBy: "all-tenants-operator" });
    try {
      const reserved = await coordinator.reserve(reserveRequest(newKey(), { operation: "payouts.create", writerEpoch: 5n }), as(TOKENS.worker));
      expect(reserved).toMatchObject({ decision: Decision.ACCEPTED, enforced: false });
    } finally {
      await admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.ENFORCE }, as(TOKENS.allTenantsOperator));
    }
  });
});

describe("request validation of the other coordinator RPCs", () => {
  const ref = () => create(OperationRefSchema, { tenant: "acme", operationId: MISSING_ID });
  const cases: Array<[name: string, call: () => Promise<unknown>]> = [
    ["Claim without a mode", () => coordinator.claim({ ref: ref(), generation: 1n }, as(TOKENS.gateway))],
    ["Claim without a ref", () => coordinator.claim({ mode: ClaimMode.OWNER, generation: 1n }, as(TOKENS.gateway))],
    ["Claim with a generation beyond what the registry holds exactly", () => coordinator.claim({ ref: ref(), mode: ClaimMode.OWNER, generation: 2n ** 60n }, as(TOKENS.gateway))],
    [
      "Claim with an operation id Reserve never returns",
      () => coordinator.claim({ ref: { tenant: "acme", operationId: "nope" }, mode: ClaimMode.OWNER, generation: 1n }, as(TOKENS.gateway)),
    ],
    ["RenewLease with a negative lease", () => coordinator.renewLease({ ref: ref(), generation: 1n, lease: { seconds: 0n, nanos: -1 } }, as(TOKENS.gateway))],
    ["RecordEffectAttempt with a malformed effect name", () => coordinator.recordEffectAttempt({ ref: ref(), generation: 1n, effect: "card charge" }, as(TOKENS.gateway))],
    ["ResolveEffectAttempt without a status", () => coordinator.resolveEffectAttempt({ ref: ref(), generation: 1n, attemptNumber: 1 }, as(TOKENS.gateway))],
    [
      "ResolveEffectAttempt back to PENDING",
      () => coordinator.resolveEffectAttempt({ ref: ref(), generation: 1n, attemptNumber: 1, status: EffectStatus.PENDING }, as(TOKENS.gateway)),
    ],
    ["Complete without an outcome", () => coordinator.complete({ ref: ref(), generation: 1n, snapshot: { statusCode: 200 } }, as(TOKENS.gateway))],
    ["Complete without a snapshot", () => coordinator.complete({ ref: ref(), generation: 1n, outcome: Outcome.SUCCEEDED }, as(TOKENS.gateway))],
    ["Release without a ref", () => coordinator.release({ generation: 1n }, as(TOKENS.gateway))],
    ["Abandon without a ref", () => coordinator.abandon({ generation: 1n }, as(TOKENS.gateway))],
    ["Lookup by neither ref nor scope", () => coordinator.lookup({}, as(TOKENS.gateway))],
    ["Lookup by ref without a subject, by a gateway", () => coordinator.lookup({ by: { case: "ref", value: ref() } }, as(TOKENS.gateway))],
    [
      "Lookup by ref with a subject of another tenant",
      () => coordinator.lookup({ by: { case: "ref", value: ref() }, subject: { tenant: "globex", principal: "alice" } }, as(TOKENS.gateway)),
    ],
    [
      "Lookup by scope without a subject",
      () => coordinator.lookup({ by: { case: "scope", value: { operation: "payments.create", apiRevision: 1, idempotencyKey: newKey() } } }, as(TOKENS.gateway)),
    ],
    ["ListRecoverable with a page token it never returned", () => coordinator.listRecoverable({ pageToken: "bm9wZQ" }, as(TOKENS.worker))],
    ["ListRecoverable with a page of 501", () => coordinator.listRecoverable({ pageSize: 501 }, as(TOKENS.worker))],
  ];

  it.each(cases)("refuses %s with INVALID_REQUEST", async (_name, call) => {
    await expectRefused(call(), Code.InvalidArgument, "INVALID_REQUEST");
  });
});

describe("callers", () => {
  const rpcs = [
    ...CoordinatorService.methods.map((method) => ({ service: coordinatorClient, method })),
    ...AdminService.methods.map((method) => ({ service: adminClient, method })),
  ];
  /** Calls any RPC by its descriptor, reading a server stream to its end. */
  function call(entry: (typeof rpcs)[number], message: unknown, options: { headers?: Record<string, string> }): Promise<unknown> {
    const fn = (entry.service() as Record<string, (m: unknown, o: unknown) => unknown>)[entry.method.localName]!;
    const result = fn.call(entry.service(), message, options);
    return entry.method.methodKind === "server_streaming" ? drain(result as AsyncIterable<unknown>) : (result as Promise<unknown>);
  }

  it.each(rpcs.map((entry) => [entry.method.parent.name, entry.method.name, entry] as const))(
    "%s.%s refuses a call without a token, with a malformed header or with an unknown token as UNAUTHENTICATED",
    async (_service, _method, entry) => {
      const before = await countRows(t.pool);
      const attempts: Array<Record<string, string>> = [{}, { authorization: "Basic dXNlcjpwYXNz" }, { authorization: `Bearer ${"x".repeat(40)}` }];
      for (const headers of attempts) {
        await expectRefused(call(entry, {}, { headers }), Code.Unauthenticated, "UNAUTHENTICATED");
      }
      expect(await countRows(t.pool)).toEqual(before);
    },
  );

  /**
   * Which roles each RPC serves, and what an allowed caller gets for an
   * almost empty request ("answered" when it has nothing to refuse): the
   * role is checked before anything of the request is read.
   */
  const ROLES: Record<string, { roles: Role[]; request?: object; allowed: "answered" | "INVALID_REQUEST" | "INVALID_POLICY" }> = {
    Reserve: { roles: ["gateway", "worker"], allowed: "INVALID_REQUEST" },
    Claim: { roles: ["gateway", "worker"], request: { mode: ClaimMode.OWNER }, allowed: "INVALID_REQUEST" },
    RenewLease: { roles: ["gateway", "worker"], allowed: "INVALID_REQUEST" },
    RecordEffectAttempt: { roles: ["gateway", "worker"], allowed: "INVALID_REQUEST" },
    ResolveEffectAttempt: { roles: ["gateway", "worker"], allowed: "INVALID_REQUEST" },
    Complete: { roles: ["gateway", "worker"], allowed: "INVALID_REQUEST" },
    Release: { roles: ["gateway", "worker"], allowed: "INVALID_REQUEST" },
    Abandon: { roles: ["gateway", "worker"], allowed: "INVALID_REQUEST" },
    Lookup: { roles: ["gateway", "worker", "operator"], allowed: "INVALID_REQUEST" },
    ListRecoverable: { roles: ["worker"], allowed: "answered" },
    // No role of its own: each of its calls needs its RPC's (an empty batch has none to refuse).
    Batch: { roles: ["gateway", "worker", "operator"], allowed: "answered" },
    PublishPolicy: { roles: ["operator"], allowed: "INVALID_POLICY" },
    GetPolicy: { roles: ["operator"], allowed: "INVALID_REQUEST" },
    ListPolicies: { roles: ["operator"], allowed: "answered" },
    SetOperationMode: { roles: ["operator"], allowed: "INVALID_REQUEST" },
    RaiseWriterEpoch: { roles: ["operator"], allowed: "INVALID_REQUEST" },
    ListOperationControls: { roles: ["operator"], allowed: "answered" },
    ListRecords: { roles: ["operator"], allowed: "answered" },
    Reconcile: { roles: ["operator"], allowed: "INVALID_REQUEST" },
    StreamEvents: { roles: ["operator"], allowed: "answered" },
    RunRetentionSweep: { roles: ["operator"], allowed: "answered" },
    GetRecordCensus: { roles: ["operator"], allowed: "answered" },
    ListNewestRecords: { roles: ["operator"], allowed: "answered" },
    FindRecords: { roles: ["operator"], allowed: "INVALID_REQUEST" },
    ListUnknownRecords: { roles: ["operator"], allowed: "answered" },
    GetRecordHistory: { roles: ["operator"], allowed: "INVALID_REQUEST" },
    ListRecentEvents: { roles: ["operator"], allowed: "INVALID_REQUEST" },
    GetEventSeries: { roles: ["operator"], allowed: "answered" },
  };
  /** One caller per role. The role is checked before any grant of a tenant or operation, so the gateway's narrower grants change nothing here. */
  const BY_ROLE: Record<Role, string> = { gateway: TOKENS.gateway, worker: TOKENS.worker, operator: TOKENS.allTenantsOperator };

  it("knows the role of every RPC of both services", () => {
    expect(Object.keys(ROLES).sort()).toEqual(rpcs.map((entry) => entry.method.name).sort());
  });

  it.each(rpcs.flatMap((entry) => (["gateway", "worker", "operator"] as const).map((role) => [entry.method.name, role, entry] as const)))(
    "%s called with the %s role: served only for its roles, refused PERMISSION_DENIED otherwise",
    async (name, role, entry) => {
      const rule = ROLES[name]!;
      const refusal = await refusalOf(call(entry, rule.request ?? {}, as(BY_ROLE[role])));
      if (!rule.roles.includes(role)) {
        expect(refusal).toMatchObject({ code: "PermissionDenied", reason: "PERMISSION_DENIED", domain: DOMAIN });
        expect(refusal?.message).toMatch(new RegExp(`needs the ${rule.roles.join(" or ")} role`));
      } else if (rule.allowed === "answered") {
        expect(refusal).toBeUndefined();
      } else {
        expect(refusal).toMatchObject({ code: "InvalidArgument", reason: rule.allowed, domain: DOMAIN });
      }
    },
  );

  it("authorizes every RPC of both services by the one table of roles, with the roles above", () => {
    for (const { method } of rpcs) expect(ACCESS_RULES.get(method)?.roles, method.name).toEqual(ROLES[method.name]!.roles);
    expect(ACCESS_RULES.size).toBe(rpcs.length);
    // A request's content is read before the handler only for a unary RPC (Claim's mode).
    const byContent = [...ACCESS_RULES].filter(([, rule]) => rule.requestNeeds).map(([method]) => [method.name, method.methodKind]);
    expect(byContent).toEqual([["Claim", "unary"]]);
  });

  it("authorizes each call of a Batch as its own RPC", async () => {
    const { ref } = await accepted();
    const lookup = { by: { case: "ref" as const, value: ref }, subject: { tenant: "acme", principal: "alice" } };
    const { results } = await coordinator.batch(
      { calls: [{ call: { case: "reserve", value: reserveRequest(newKey()) } }, { call: { case: "lookup", value: lookup } }] },
      as(TOKENS.allTenantsOperator),
    );
    expect(results.map((r) => r.result.case)).toEqual(["error", "lookup"]);
    const refused = results[0]!.result.value as { code: number; message: string };
    expect(refused.code).toBe(Code.PermissionDenied);
    expect(refused.message).toMatch(/needs the gateway or worker role/);
  });

  it("lets only workers claim with RECOVER", async () => {
    const { ref } = await accepted();
    await expectRefused(coordinator.claim({ ref, mode: ClaimMode.RECOVER, generation: 1n }, as(TOKENS.gateway)), Code.PermissionDenied, "PERMISSION_DENIED");
  });

  it("refuses an operator granted some tenants what affects every tenant", async () => {
    const before = await countRows(t.pool);
    const actions: Array<() => Promise<unknown>> = [
      () => admin.publishPolicy({ policy: policyToProto(testDocument({ operation: "payouts.create", schemaRevision: 2 })) }, as(TOKENS.operator)),
      () => admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.DRAINING }, as(TOKENS.operator)),
      () => admin.raiseWriterEpoch({ operation: "payouts.create", apiRevision: 1, writerEpoch: 99n }, as(TOKENS.operator)),
      () => admin.runRetentionSweep({}, as(TOKENS.operator)),
    ];
    for (const action of actions) {
      const refusal = await expectRefused(action(), Code.PermissionDenied, "PERMISSION_DENIED");
      expect(refusal.message).toMatch(/affects every tenant/);
    }
    expect(await countRows(t.pool)).toEqual(before);
  });
});

describe("no existence oracle", () => {
  /** Every RPC that names a record by ref, as `token`. */
  const byRef = (token: string, ref: OperationRef): Array<[string, () => Promise<unknown>]> => [
    ["Claim", () => coordinator.claim({ ref, mode: ClaimMode.OWNER, generation: 1n }, as(token))],
    ["RenewLease", () => coordinator.renewLease({ ref, generation: 1n }, as(token))],
    ["RecordEffectAttempt", () => coordinator.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge" }, as(token))],
    ["ResolveEffectAttempt", () => coordinator.resolveEffectAttempt({ ref, generation: 1n, attemptNumber: 1, status: EffectStatus.CONFIRMED }, as(token))],
    ["Complete", () => coordinator.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201 } }, as(token))],
    ["Release", () => coordinator.release({ ref, generation: 1n }, as(token))],
    ["Abandon", () => coordinator.abandon({ ref, generation: 1n }, as(token))],
    ["Lookup", () => coordinator.lookup({ by: { case: "ref", value: ref }, subject: { tenant: ref.tenant, principal: "alice" } }, as(token))],
  ];

  /** Each RPC's refusal for the existing record and for a missing one, which must be the same in every part. */
  async function compared(token: string, existing: OperationRef, missing: OperationRef) {
    const pairs: Array<[string, Refusal | undefined, Refusal | undefined]> = [];
    const absent = byRef(token, missing);
    for (const [i, [rpc, call]] of byRef(token, existing).entries()) pairs.push([rpc, await refusalOf(call()), await refusalOf(absent[i]![1]())]);
    return pairs;
  }

  it("answers a caller not granted the record's operation NOT_FOUND, exactly as for a missing record", async () => {
    const { ref } = await accepted();
    const before = await stored(ref.operationId);
    for (const [rpc, found, absent] of await compared(TOKENS.refunds, ref, { ...ref, operationId: MISSING_ID })) {
      expect(found, rpc).toMatchObject({ code: "NotFound", reason: "NOT_FOUND", domain: DOMAIN, metadata: {} });
      expect(found, rpc).toStrictEqual(absent);
    }
    expect(await stored(ref.operationId)).toEqual(before);
  });

  it("answers a caller of another tenant PERMISSION_DENIED under the record's tenant and NOT_FOUND under its own, whether the record exists or not", async () => {
    const { ref } = await accepted();
    const before = await stored(ref.operationId);
    for (const [rpc, found, absent] of await compared(TOKENS.globex, ref, { ...ref, operationId: MISSING_ID })) {
      expect(found, rpc).toMatchObject({ code: "PermissionDenied", reason: "PERMISSION_DENIED" });
      expect(found, rpc).toStrictEqual(absent);
    }
    const underOwnTenant = { tenant: "globex", operationId: ref.operationId } as OperationRef;
    for (const [rpc, found, absent] of await compared(TOKENS.globex, underOwnTenant, { ...underOwnTenant, operationId: MISSING_ID })) {
      expect(found, rpc).toMatchObject({ code: "NotFound", reason: "NOT_FOUND" });
      expect(found, rpc).toStrictEqual(absent);
    }
    expect(await stored(ref.operationId)).toEqual(before);
  });

  it("answers a Lookup by scope of another principal's key NOT_FOUND, exactly as for an unused key", async () => {
    const { key } = await accepted();
    const lookup = (principal: string, idempotencyKey: string) =>
      refusalOf(
        coordinator.lookup(
          { by: { case: "scope", value: { subject: { tenant: "acme", principal }, operation: "payments.create", apiRevision: 1, idempotencyKey } } },
          as(TOKENS.gateway),
        ),
      );
    const other = await lookup("mallory", key);
    expect(other).toMatchObject({ code: "NotFound", reason: "NOT_FOUND", domain: DOMAIN });
    expect(other).toStrictEqual(await lookup("mallory", newKey()));
    expect(await lookup("alice", key)).toBeUndefined();
  });
});

describe("unknown fields", () => {
  const unknown = () => [{ no: 99, wireType: WireType.Varint, data: new Uint8Array([1]) }];

  it("are refused at the top of a request with UNKNOWN_FIELD, storing nothing", async () => {
    const before = await countRows(t.pool);
    const request = reserveRequest(newKey());
    request.$unknown = unknown();
    const refusal = await expectRefused(coordinator.reserve(request, as(TOKENS.gateway)), Code.InvalidArgument, "UNKNOWN_FIELD");
    expect(refusal.message).not.toMatch(/\(in /);
    expect(await countRows(t.pool)).toEqual(before);
  });

  it("are refused inside nested messages, naming where", async () => {
    const before = await countRows(t.pool);
    const inSubject = reserveRequest(newKey());
    inSubject.subject!.$unknown = unknown();
    expect((await expectRefused(coordinator.reserve(inSubject, as(TOKENS.gateway)), Code.InvalidArgument, "UNKNOWN_FIELD")).message).toMatch(/\(in subject\)/);

    const inHeader = reserveRequest(newKey(), {
      request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", headers: [{ name: "x-a", value: "1" }] }) },
    });
    (inHeader.request.value as { headers: Array<{ $unknown?: unknown }> }).headers[0]!.$unknown = unknown();
    expect((await expectRefused(coordinator.reserve(inHeader, as(TOKENS.gateway)), Code.InvalidArgument, "UNKNOWN_FIELD")).message).toMatch(/\(in request\.value\.headers\[0\]\)/);
    expect(await countRows(t.pool)).toEqual(before);

    const { ref } = await accepted();
    const complete = { ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: create(ResponseSnapshotSchema, { statusCode: 201 }) };
    complete.snapshot.$unknown = unknown();
    expect((await expectRefused(coordinator.complete(complete, as(TOKENS.gateway)), Code.InvalidArgument, "UNKNOWN_FIELD")).message).toMatch(/\(in snapshot\)/);
    expect((await stored(ref.operationId)).state).toBe("EXECUTING");

    const policy = policyToProto(testDocument({ operation: "unknown.fields" }));
    policy.$unknown = unknown();
    await expectRefused(admin.publishPolicy({ policy }, as(TOKENS.allTenantsOperator)), Code.InvalidArgument, "UNKNOWN_FIELD");
    expect((await admin.listPolicies({ operation: "unknown.fields" }, as(TOKENS.allTenantsOperator))).policies).toEqual([]);
  });

  it("are refused in the request of a streaming RPC too: a filter this server does not know is never served unfiltered", async () => {
    const request = create(StreamEventsRequestSchema, { tenant: "acme" });
    request.$unknown = unknown();
    await expectRefused(drain(admin.streamEvents(request, as(TOKENS.operator))), Code.InvalidArgument, "UNKNOWN_FIELD");
  });
});

describe("AdminService", () => {
  it("publishes a policy once: created, then the same rules again are not, and changed rules under the revision are refused", async () => {
    const document = testDocument({ operation: "invoices.create" });
    const first = await admin.publishPolicy({ policy: policyToProto(document) }, as(TOKENS.allTenantsOperator));
    expect(first).toMatchObject({ created: true, published: { publishedBy: "all-tenants-operator", policy: { operation: "invoices.create", apiRevision: 1, schemaRevision: 1 } } });
    const again = await admin.publishPolicy({ policy: policyToProto(document) }, as(TOKENS.allTenantsOperator));
    expect(again.created).toBe(false);
    expect(again.published?.digest).toEqual(first.published?.digest);
    await expectRefused(
      admin.publishPolicy({ policy: policyToProto(testDocument({ operation: "invoices.create", maxActivePerPrincipal: 7 })) }, as(TOKENS.allTenantsOperator)),
      Code.FailedPrecondition,
      "POLICY_REVISION_EXISTS",
    );
    await expectRefused(admin.publishPolicy({}, as(TOKENS.allTenantsOperator)), Code.InvalidArgument, "INVALID_POLICY", { path: "policy" });

    const got = await admin.getPolicy({ operation: "invoices.create", apiRevision: 1 }, as(TOKENS.operator));
    expect(got.published).toEqual(first.published);
    await expectRefused(admin.getPolicy({ operation: "invoices.create", apiRevision: 1, schemaRevision: 2 }, as(TOKENS.operator)), Code.NotFound, "NOT_FOUND");
    await expectRefused(admin.getPolicy({ operation: "invoices.create", apiRevision: 2 }, as(TOKENS.operator)), Code.NotFound, "NOT_FOUND");
    const listed = await admin.listPolicies({}, as(TOKENS.operator));
    expect(listed.policies.map((p) => p.policy?.operation)).toContain("invoices.create");

    // Published through this coordinator: served at once.
    const reserved = await coordinator.reserve(reserveRequest(newKey(), { operation: "invoices.create" }), as(TOKENS.worker));
    expect(reserved.decision).toBe(Decision.ACCEPTED);
  });

  it("maps operation controls and refuses a mode without a value, an operation without a policy, and a lower epoch", async () => {
    await expectRefused(admin.setOperationMode({ operation: "payouts.create", apiRevision: 1 }, as(TOKENS.allTenantsOperator)), Code.InvalidArgument, "INVALID_REQUEST");
    await expectRefused(
      admin.setOperationMode({ operation: "nothing.here", apiRevision: 1, mode: OperationMode.DRAINING }, as(TOKENS.allTenantsOperator)),
      Code.NotFound,
      "NOT_FOUND",
    );
    await expectRefused(
      admin.raiseWriterEpoch({ operation: "payouts.create", apiRevision: 1, writerEpoch: 2n ** 60n }, as(TOKENS.allTenantsOperator)),
      Code.InvalidArgument,
      "INVALID_REQUEST",
    );
    const raised = await admin.raiseWriterEpoch({ operation: "payouts.create", apiRevision: 1, writerEpoch: 6n }, as(TOKENS.allTenantsOperator));
    expect(raised.control).toMatchObject({ operation: "payouts.create", apiRevision: 1, writerEpoch: 6n, updatedBy: "all-tenants-operator" });
    expect(raised.control?.updatedAt).toBeDefined();
    // The current epoch again changes nothing; a lower one is refused, naming the current.
    const again = await admin.raiseWriterEpoch({ operation: "payouts.create", apiRevision: 1, writerEpoch: 6n }, as(TOKENS.allTenantsOperator));
    expect(again.control).toEqual(raised.control);
    await expectRefused(
      admin.raiseWriterEpoch({ operation: "payouts.create", apiRevision: 1, writerEpoch: 5n }, as(TOKENS.allTenantsOperator)),
      Code.FailedPrecondition,
      "WRITER_EPOCH_NOT_NEWER",
      { writer_epoch: "6" },
    );
    const controls = await admin.listOperationControls({}, as(TOKENS.operator));
    expect(controls.controls.find((c) => c.operation === "payouts.create")).toMatchObject({ writerEpoch: 6n, mode: OperationMode.ENFORCE });
  });

  it("lists records with their bodies opened, within the caller's tenants, and refuses malformed listings", async () => {
    const { ref } = await accepted();
    const body = encode('{"id":"listed"}');
    await coordinator.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201, body } }, as(TOKENS.gateway));
    const listed = await admin.listRecords({ states: [RecordState.SUCCEEDED], pageSize: 500 }, as(TOKENS.operator));
    const record = listed.records.find((r) => r.operationId === ref.operationId);
    expect(record).toMatchObject({ state: RecordState.SUCCEEDED, subject: { tenant: "acme", principal: "alice" }, snapshot: { statusCode: 201, body } });
    expect(new Set(listed.records.map((r) => r.state))).toEqual(new Set([RecordState.SUCCEEDED]));

    await expectRefused(admin.listRecords({ pageSize: 501 }, as(TOKENS.operator)), Code.InvalidArgument, "INVALID_REQUEST");
    await expectRefused(admin.listRecords({ states: [RecordState.UNSPECIFIED] }, as(TOKENS.operator)), Code.InvalidArgument, "INVALID_REQUEST");
    await expectRefused(admin.listRecords({ pageToken: "bm9wZQ" }, as(TOKENS.operator)), Code.InvalidArgument, "INVALID_REQUEST");
    await expectRefused(admin.listRecords({ tenant: "globex" }, as(TOKENS.operator)), Code.PermissionDenied, "PERMISSION_DENIED");
  });

  it("reconciles an UNKNOWN record at the next generation, answering the record with its attempts and its opened snapshot", async () => {
    const { ref } = await accepted();
    await coordinator.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "cards" }, as(TOKENS.gateway));
    await coordinator.abandon({ ref, generation: 1n }, as(TOKENS.gateway));
    const snapshot = { statusCode: 201, mediaType: "application/json", body: encode('{"id":"p_9"}') };
    await expectRefused(
      admin.reconcile({ ref, outcome: Outcome.REJECTED, snapshot, evidence: "declined", operator: "dana" }, as(TOKENS.operator)),
      Code.InvalidArgument,
      "INVALID_REQUEST",
    );
    const reconciled = await admin.reconcile({ ref, outcome: Outcome.SUCCEEDED, snapshot, evidence: "charge ch_9 captured", operator: "dana" }, as(TOKENS.operator));
    expect(reconciled.record).toMatchObject({
      operationId: ref.operationId,
      state: RecordState.SUCCEEDED,
      generation: 2n,
      snapshot: { statusCode: 201, mediaType: "application/json", body: snapshot.body },
      effectAttempts: [{ attemptNumber: 1, effect: "card.charge", status: EffectStatus.PENDING }],
    });
    await expectRefused(
      admin.reconcile({ ref, outcome: Outcome.SUCCEEDED, snapshot, evidence: "again", operator: "dana" }, as(TOKENS.operator)),
      Code.FailedPrecondition,
      "INVALID_TRANSITION",
      { state: "SUCCEEDED" },
    );
  });

  it("streams events from a cursor, and maps a refusal raised inside the stream", async () => {
    const { ref } = await accepted();
    // An event is streamed once every transaction older than its own has ended, in the whole
    // cluster (so that a cursor never skips one): another test's open transaction may hold it back.
    let events: StreamEventsResponse[] = [];
    await until(async () => {
      events = await drain(admin.streamEvents({ tenant: "acme" }, as(TOKENS.operator)));
      return events.some((e) => e.operationId === ref.operationId && e.kind === "ACCEPTED");
    }, "the acceptance to be streamed");
    const accepting = events.find((e) => e.operationId === ref.operationId && e.kind === "ACCEPTED");
    expect(accepting).toMatchObject({ tenant: "acme", operation: "payments.create", apiRevision: 1, generation: 1n, state: "EXECUTING", caller: "payments-gateway" });
    expect(accepting?.cursor).not.toBe("");
    // Resuming after the last event: nothing new yet.
    expect(await drain(admin.streamEvents({ tenant: "acme", after: events.at(-1)!.cursor }, as(TOKENS.operator)))).toEqual([]);

    await expectRefused(drain(admin.streamEvents({ after: "bm9wZQ" }, as(TOKENS.operator))), Code.InvalidArgument, "INVALID_REQUEST");
    await expectRefused(drain(admin.streamEvents({ tenant: "globex" }, as(TOKENS.operator))), Code.PermissionDenied, "PERMISSION_DENIED");
    await expectRefused(drain(admin.streamEvents({}, as(TOKENS.gateway))), Code.PermissionDenied, "PERMISSION_DENIED");
  });

  it("runs the retention sweep for an operator granted every tenant, within its batch bounds", async () => {
    await expectRefused(admin.runRetentionSweep({ batchSize: 10_001 }, as(TOKENS.allTenantsOperator)), Code.InvalidArgument, "INVALID_REQUEST");
    const { ref } = await accepted();
    await coordinator.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201 } }, as(TOKENS.gateway));
    await t.pool.query("UPDATE idem_record SET retain_until = now() - interval '1 second' WHERE operation_id = $1", [ref.operationId]);
    const swept = await admin.runRetentionSweep({ batchSize: 100 }, as(TOKENS.allTenantsOperator));
    expect(swept.tombstoned).toBeGreaterThanOrEqual(1n);
    expect(swept.batches).toBeGreaterThanOrEqual(1);
    const { rows } = await t.pool.query<{ tombstoned_at: Date | null }>("SELECT tombstoned_at FROM idem_record WHERE operation_id = $1", [ref.operationId]);
    expect(rows[0]?.tombstoned_at).not.toBeNull();
  });
});

describe("error mapping", () => {
  /** The server's interceptors around handlers that fail in each way a handler can. */
  function failingTransport(): Transport {
    return createRouterTransport(
      (router) => {
        router.service(CoordinatorService, {
          reserve() {
            throw new Error("connection to 10.0.0.7 refused: password authentication failed for user idem");
          },
          claim() {
            throw new ConnectError("deadline exceeded upstream", Code.DeadlineExceeded);
          },
          release() {
            throw new IdempotencyError("REGISTRY_BUSY", "the record kept changing; retry with backoff", {}, { cause: new Error("lock timeout on 10.0.0.7") });
          },
        });
        router.service(AdminService, {
          async *streamEvents() {
            yield create(StreamEventsResponseSchema, { kind: "ACCEPTED" });
            throw new Error("the cursor's transaction vanished on 10.0.0.7");
          },
        });
      },
      { router: { interceptors: refusalInterceptors(silentLogger, new Callers(GRANTS, false)) } },
    );
  }
  let failing: Client<typeof CoordinatorService>;
  let failingAdmin: Client<typeof AdminService>;
  beforeAll(() => {
    const transport = failingTransport();
    failing = createClient(CoordinatorService, transport);
    failingAdmin = createClient(AdminService, transport);
  });

  it("turns an unexpected failure into INTERNAL without sending its cause", async () => {
    const refusal = await expectRefused(failing.reserve({}, as(TOKENS.gateway)), Code.Internal, "INTERNAL");
    expect(refusal.message).not.toMatch(/10\.0\.0\.7|password/);
  });

  it("passes the framework's own errors through as they are", async () => {
    expect(await refusalOf(failing.claim({}, as(TOKENS.gateway)))).toStrictEqual({
      code: "DeadlineExceeded",
      reason: undefined,
      domain: undefined,
      metadata: {},
      message: "deadline exceeded upstream",
    });
    expect((await refusalOf(failing.lookup({}, as(TOKENS.gateway))))?.code).toBe("Unimplemented");
  });

  it("keeps a refusal's reason and message, and never its cause", async () => {
    const refusal = await expectRefused(failing.release({}, as(TOKENS.gateway)), Code.Unavailable, "REGISTRY_BUSY");
    expect(refusal.message).toBe("the record kept changing; retry with backoff");
  });

  it("maps a failure inside a stream after its first message", async () => {
    const received: string[] = [];
    const refusal = await refusalOf(
      (async () => {
        for await (const event of failingAdmin.streamEvents({}, as(TOKENS.allTenantsOperator))) received.push(event.kind);
      })(),
    );
    expect(received).toEqual(["ACCEPTED"]);
    expect(refusal).toMatchObject({ code: "Internal", reason: "INTERNAL", domain: DOMAIN });
    expect(refusal?.message).not.toMatch(/10\.0\.0\.7|vanished/);
  });
});
