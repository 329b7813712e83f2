import { create, fromBinary, toBinary, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { anyUnpack } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { trailerParse } from "@connectrpc/connect/protocol-grpc-web";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ErrorInfoSchema } from "../../src/gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "../../src/gen/google/rpc/status_pb.js";
import { HealthCheckRequestSchema, HealthCheckResponseSchema, HealthCheckResponse_ServingStatus } from "../../src/gen/grpc/health/v1/health_pb.js";
import {
  ClaimMode,
  ClaimRequestSchema,
  ClaimResponseSchema,
  CompleteRequestSchema,
  CompleteResponseSchema,
  CoordinatorService,
  Decision,
  OperationRefSchema,
  RecordEffectAttemptRequestSchema,
  RecordEffectAttemptResponseSchema,
  type ReserveRequest,
  ReserveRequestSchema,
  ReserveResponseSchema,
  ResolveEffectAttemptRequestSchema,
  ResolveEffectAttemptResponseSchema,
} from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { EffectStatus, HttpRequestPartsSchema, Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { wireReasonOf } from "../support/refusals.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { countRows } from "../support/registry-helpers.js";
import { useTestServer } from "../support/server.js";

const t = useTestDatabase();
const server = useTestServer(t);
let grpcClient: grpc.Client;
let connectH2: Client<typeof CoordinatorService>;
let grpcWebH1: Client<typeof CoordinatorService>;

beforeAll(() => {
  grpcClient = new grpc.Client(`127.0.0.1:${server.coordinator.rpcPort}`, grpc.credentials.createInsecure());
  connectH2 = createClient(CoordinatorService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" }));
  grpcWebH1 = createClient(CoordinatorService, createGrpcWebTransport({ baseUrl: server.baseUrl, httpVersion: "1.1" }));
});
afterAll(() => {
  grpcClient?.close();
});

const bearer = (token: string) => ({ authorization: `Bearer ${token}` });
const body = (json: unknown) => new TextEncoder().encode(JSON.stringify(json));

function reserveRequest(key: string, json: unknown, overrides: MessageInitShape<typeof ReserveRequestSchema> = {}): ReserveRequest {
  const init: MessageInitShape<typeof ReserveRequestSchema> = {
    subject: { tenant: "acme", principal: "alice" },
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: key,
    request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: body(json) }) },
  };
  return create(ReserveRequestSchema, { ...init, ...overrides } as MessageInitShape<typeof ReserveRequestSchema>);
}

/** One unary call through @grpc/grpc-js, with protobuf-es doing the (de)serialization. */
function grpcCall<I extends DescMessage, O extends DescMessage>(
  method: string,
  input: I,
  output: O,
  message: MessageShape<I> | Uint8Array,
  token?: string,
): Promise<{ response?: MessageShape<O>; error?: grpc.ServiceError; reason?: string }> {
  const metadata = new grpc.Metadata();
  if (token) metadata.set("authorization", `Bearer ${token}`);
  const bytes = message instanceof Uint8Array ? message : toBinary(input, message);
  return new Promise((resolve) => {
    grpcClient.makeUnaryRequest(
      method,
      (b: Uint8Array) => Buffer.from(b),
      (b: Buffer) => fromBinary(output, b),
      bytes,
      metadata,
      (error, response) => {
        if (error) {
          const [details] = error.metadata.get("grpc-status-details-bin") as Buffer[];
          const status = details ? fromBinary(StatusSchema, details) : undefined;
          const info = status?.details[0] ? anyUnpack(status.details[0], ErrorInfoSchema) : undefined;
          resolve({ error, reason: info?.reason });
        } else {
          resolve({ response: response as MessageShape<O> });
        }
      },
    );
  });
}

const RESERVE = "/idempotency.v1.CoordinatorService/Reserve";

/** The members of Connect JSON answers the tests read: a ReserveResponse's, or a Connect error's with its details' debug form. */
interface ConnectJsonBody {
  [member: string]: unknown;
  decision?: string;
  snapshot?: { body: string };
  code?: string;
  message?: string;
  details?: Array<{ type: string; value: string; debug?: unknown }>;
}

/** POSTs Connect JSON over HTTP/1.1, as curl would. */
async function connectJson(method: string, json: unknown, token?: string): Promise<{ status: number; body: ConnectJsonBody }> {
  const response = await fetch(`${server.baseUrl}/idempotency.v1.CoordinatorService/${method}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(token ? bearer(token) : {}) },
    body: JSON.stringify(json),
  });
  return { status: response.status, body: (await response.json()) as ConnectJsonBody };
}

describe("one lifecycle across every protocol", () => {
  it("reserves over Connect/HTTP2, retries over gRPC, conflicts over Connect JSON/HTTP1.1, completes over gRPC, replays over gRPC-Web", async () => {
    const key = newKey();
    const payment = { amount: 10, currency: "EUR" };

    const accepted = await connectH2.reserve(reserveRequest(key, payment, { claim: true }), { headers: bearer(server.tokens.gateway) });
    expect(accepted.decision).toBe(Decision.ACCEPTED);
    expect(accepted.state).toBe(RecordState.EXECUTING);
    expect(accepted.generation).toBe(1n);
    expect(accepted.contractVersion).toBe("http.idempotency.v1");
    const ref = { tenant: "acme", operationId: accepted.operationId };

    const retry = await grpcCall(RESERVE, ReserveRequestSchema, ReserveResponseSchema, reserveRequest(key, payment), server.tokens.gateway);
    expect(retry.response?.decision).toBe(Decision.IN_PROGRESS);
    expect(retry.response?.operationId).toBe(accepted.operationId);
    expect(retry.response?.generation).toBe(0n);
    const retryAfterMs = Number(retry.response?.retryAfter?.seconds ?? 0n) * 1000 + (retry.response?.retryAfter?.nanos ?? 0) / 1e6;
    expect(retryAfterMs).toBeGreaterThan(0);

    const conflict = await connectJson(
      "Reserve",
      {
        subject: { tenant: "acme", principal: "alice" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: key,
        parts: { method: "POST", path: "/v1/payments", mediaType: "application/json", body: Buffer.from(JSON.stringify({ amount: 100, currency: "EUR" })).toString("base64") },
      },
      server.tokens.gateway,
    );
    expect(conflict.status).toBe(200);
    expect(conflict.body).toEqual({ decision: "DECISION_PAYLOAD_CONFLICT", enforced: true, schemaRevision: 1, contractVersion: "http.idempotency.v1" });

    const attempt = await grpcCall(
      "/idempotency.v1.CoordinatorService/RecordEffectAttempt",
      RecordEffectAttemptRequestSchema,
      RecordEffectAttemptResponseSchema,
      create(RecordEffectAttemptRequestSchema, { ref, generation: 1n, effect: "card.charge", provider: "card-provider" }),
      server.tokens.gateway,
    );
    expect(attempt.response?.attempt?.downstreamKey).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const resolved = await grpcCall(
      "/idempotency.v1.CoordinatorService/ResolveEffectAttempt",
      ResolveEffectAttemptRequestSchema,
      ResolveEffectAttemptResponseSchema,
      create(ResolveEffectAttemptRequestSchema, { ref, generation: 1n, attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "ch_1" }),
      server.tokens.gateway,
    );
    expect(resolved.response?.attempt?.status).toBe(EffectStatus.CONFIRMED);
    const responseBody = body({ id: "p_1", amount: 10 });
    const completed = await grpcCall(
      "/idempotency.v1.CoordinatorService/Complete",
      CompleteRequestSchema,
      CompleteResponseSchema,
      create(CompleteRequestSchema, {
        ref,
        generation: 1n,
        outcome: Outcome.SUCCEEDED,
        snapshot: {
          statusCode: 201,
          mediaType: "application/json",
          location: "/v1/payments/p_1",
          headers: [
            { name: "Content-Type", value: "application/json" },
            { name: "Set-Cookie", value: "s=1" },
            { name: "Date", value: "today" },
          ],
          body: responseBody,
        },
      }),
      server.tokens.gateway,
    );
    expect(completed.response?.state).toBe(RecordState.SUCCEEDED);
    expect(completed.response?.snapshotDigest).toHaveLength(32);

    const replays = await Promise.all([
      grpcWebH1.reserve(reserveRequest(key, payment), { headers: bearer(server.tokens.gateway) }),
      connectH2.reserve(reserveRequest(key, payment), { headers: bearer(server.tokens.gateway) }),
    ]);
    for (const replay of replays) {
      expect(replay.decision).toBe(Decision.REPLAY);
      expect(Buffer.from(replay.snapshot!.body).equals(Buffer.from(responseBody))).toBe(true);
      expect(Buffer.from(replay.snapshot!.digest).equals(Buffer.from(completed.response!.snapshotDigest))).toBe(true);
      expect(replay.snapshot!.headers.map((h) => h.name)).toEqual(["content-type"]);
    }
    const jsonReplay = await connectJson(
      "Reserve",
      {
        subject: { tenant: "acme", principal: "alice" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: key,
        parts: { method: "POST", path: "/v1/payments", mediaType: "application/json", body: Buffer.from(JSON.stringify(payment)).toString("base64") },
      },
      server.tokens.gateway,
    );
    expect(jsonReplay.body.decision).toBe("DECISION_REPLAY");
    expect(Buffer.from(jsonReplay.body.snapshot!.body, "base64").equals(Buffer.from(responseBody))).toBe(true);
  });

  it("answers 100 identical concurrent reservations and one different over the wire with exactly one ACCEPTED", async () => {
    const key = newKey();
    const calls = [
      ...Array.from({ length: 100 }, () =>
        connectH2.reserve(reserveRequest(key, { amount: 5 }, { subject: { tenant: "acme", principal: "wire-racer" } }), { headers: bearer(server.tokens.gateway) }),
      ),
      connectH2.reserve(reserveRequest(key, { amount: 6 }, { subject: { tenant: "acme", principal: "wire-racer" } }), { headers: bearer(server.tokens.gateway) }),
    ];
    const decisions = (await Promise.all(calls)).map((r) => r.decision);
    expect(decisions.filter((d) => d === Decision.ACCEPTED)).toHaveLength(1);
    expect(decisions.filter((d) => d === Decision.IN_PROGRESS)).toHaveLength(99);
    expect(decisions.filter((d) => d === Decision.PAYLOAD_CONFLICT)).toHaveLength(1);
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record WHERE principal = 'wire-racer'");
    expect(rows[0]?.n).toBe(1);
  });
});

describe("health", () => {
  it("answers SERVING over gRPC without credentials, and readiness on the admin port", async () => {
    const health = await grpcCall("/grpc.health.v1.Health/Check", HealthCheckRequestSchema, HealthCheckResponseSchema, create(HealthCheckRequestSchema, {}));
    expect(health.response?.status).toBe(HealthCheckResponse_ServingStatus.SERVING);
    const service = await grpcCall(
      "/grpc.health.v1.Health/Check",
      HealthCheckRequestSchema,
      HealthCheckResponseSchema,
      create(HealthCheckRequestSchema, { service: "idempotency.v1.CoordinatorService" }),
    );
    expect(service.response?.status).toBe(HealthCheckResponse_ServingStatus.SERVING);
    const unknown = await grpcCall(
      "/grpc.health.v1.Health/Check",
      HealthCheckRequestSchema,
      HealthCheckResponseSchema,
      create(HealthCheckRequestSchema, { service: "nope.Service" }),
    );
    expect(unknown.error?.code).toBe(grpc.status.NOT_FOUND);
    expect((await fetch(`${server.adminUrl}/healthz`)).status).toBe(200);
    const ready = await fetch(`${server.adminUrl}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: "ready", serving: true, database: true });
  });
});

describe("callers", () => {
  it("refuses a missing or unknown token with UNAUTHENTICATED", async () => {
    const missing = await grpcCall(RESERVE, ReserveRequestSchema, ReserveResponseSchema, reserveRequest(newKey(), {}));
    expect(missing.error?.code).toBe(grpc.status.UNAUTHENTICATED);
    expect(missing.reason).toBe("UNAUTHENTICATED");
    const wrong = await connectJson("Reserve", {}, "not-a-configured-token-at-all");
    expect(wrong.status).toBe(401);
    expect(wrong.body.details?.[0]?.debug).toEqual({ reason: "UNAUTHENTICATED", domain: "idempotency.v1" });
  });

  it("takes the Bearer scheme in any case, and tells an unknown token from a malformed header without echoing either", async () => {
    const lookup = {
      by: { case: "ref" as const, value: create(OperationRefSchema, { tenant: "acme", operationId: "01a229d0-0f4c-7516-846e-0457ee592196" }) },
      subject: { tenant: "acme", principal: "alice" },
    };
    const refusal = (authorization: string) =>
      connectH2.lookup(lookup, { headers: { authorization } }).then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
    // RFC 7235: the scheme is case-insensitive. The call is authenticated, and answered as the caller's (no such operation).
    for (const scheme of ["bearer", "BEARER", "bEaReR"]) {
      const answered = await refusal(`${scheme} ${server.tokens.gateway}`);
      expect([answered?.code, wireReasonOf(answered)], scheme).toEqual([Code.NotFound, "NOT_FOUND"]);
    }
    // Well formed, of any length, but no caller's token.
    for (const token of ["s3cret", "not-a-configured-token-at-all", `${server.tokens.gateway}x`]) {
      const unknown = await refusal(`Bearer ${token}`);
      expect(unknown?.code).toBe(Code.Unauthenticated);
      expect(wireReasonOf(unknown)).toBe("UNAUTHENTICATED");
      expect(unknown?.rawMessage).toMatch(/^the bearer token is not one of this coordinator's callers' tokens: /);
      expect(unknown?.rawMessage).toMatch(/IDEM_CALLERS/);
      expect(unknown?.rawMessage).not.toContain(token);
    }
    for (const header of ["Basic dXNlcjpwYXNz", "Bearer", `Bearer ${server.tokens.gateway} extra`, `Token ${server.tokens.gateway}`]) {
      const malformed = await refusal(header);
      expect(malformed?.code, header).toBe(Code.Unauthenticated);
      expect(malformed?.rawMessage, header).toBe("the Authorization header must be 'Bearer <token>'");
    }
  });

  it("refuses a tenant, an operation or a role the caller is not granted", async () => {
    const before = await countRows(t.pool);
    const otherTenant = await grpcCall(
      RESERVE,
      ReserveRequestSchema,
      ReserveResponseSchema,
      reserveRequest(newKey(), {}, { subject: { tenant: "acme", principal: "alice" } }),
      server.tokens.globex,
    );
    expect(otherTenant.error?.code).toBe(grpc.status.PERMISSION_DENIED);
    expect(otherTenant.reason).toBe("PERMISSION_DENIED");
    const otherOperation = await grpcCall(
      RESERVE,
      ReserveRequestSchema,
      ReserveResponseSchema,
      reserveRequest(newKey(), {}, { operation: "refunds.create" }),
      server.tokens.gateway,
    );
    expect(otherOperation.reason).toBe("PERMISSION_DENIED");
    const operatorWrites = await grpcCall(RESERVE, ReserveRequestSchema, ReserveResponseSchema, reserveRequest(newKey(), {}), server.tokens.operator);
    expect(operatorWrites.reason).toBe("PERMISSION_DENIED");
    expect(await countRows(t.pool)).toEqual(before);
  });

  it("lets only workers recover, and hides another principal's operation from Lookup", async () => {
    const accepted = await connectH2.reserve(reserveRequest(newKey(), { amount: 1 }), { headers: bearer(server.tokens.gateway) });
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    const recover = await grpcCall(
      "/idempotency.v1.CoordinatorService/Claim",
      ClaimRequestSchema,
      ClaimResponseSchema,
      create(ClaimRequestSchema, { ref, mode: ClaimMode.RECOVER, generation: 1n }),
      server.tokens.gateway,
    );
    expect(recover.reason).toBe("PERMISSION_DENIED");

    const own = await connectH2.lookup({ by: { case: "ref", value: ref }, subject: { tenant: "acme", principal: "alice" } }, { headers: bearer(server.tokens.gateway) });
    expect(own.record?.operationId).toBe(ref.operationId);
    const lookups = [
      connectH2.lookup({ by: { case: "ref", value: ref }, subject: { tenant: "acme", principal: "mallory" } }, { headers: bearer(server.tokens.gateway) }),
      connectH2.lookup(
        {
          by: { case: "ref", value: create(OperationRefSchema, { tenant: "acme", operationId: "01a229d0-0f4c-7516-846e-0457ee592196" }) },
          subject: { tenant: "acme", principal: "alice" },
        },
        { headers: bearer(server.tokens.gateway) },
      ),
    ];
    for (const error of await Promise.all(
      lookups.map((lookup) =>
        lookup.then(
          () => undefined,
          (e: unknown) => ConnectError.from(e),
        ),
      ),
    )) {
      expect(error?.code).toBe(Code.NotFound);
      expect(wireReasonOf(error)).toBe("NOT_FOUND");
      // The same answer whether the record exists or not: no existence oracle.
      expect(error?.rawMessage).toBe("no such operation for this subject");
    }
    const asOperator = await connectH2.lookup({ by: { case: "ref", value: ref } }, { headers: bearer(server.tokens.operator) });
    expect(asOperator.record?.subject?.principal).toBe("alice");
  });
});

describe("recovery workers", () => {
  it("list records whose lease ended, with the claim mode to use, and only workers may", async () => {
    const accepted = await connectH2.reserve(reserveRequest(newKey(), { amount: 2 }, { claim: true, subject: { tenant: "recovery", principal: "alice" } }), {
      headers: bearer(server.tokens.worker),
    });
    const ref = create(OperationRefSchema, { tenant: "recovery", operationId: accepted.operationId });
    await connectH2.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "p" }, { headers: bearer(server.tokens.worker) });
    await t.pool.query("UPDATE idem_record SET lease_expires_at = now() - interval '1 second' WHERE operation_id = $1", [accepted.operationId]);

    const listed = await connectH2.listRecoverable({ tenant: "recovery" }, { headers: bearer(server.tokens.worker) });
    expect(listed.records.map((r) => [r.record?.operationId, r.claimMode])).toEqual([[accepted.operationId, ClaimMode.RECOVER]]);
    expect(listed.records[0]?.record?.effectAttempts.map((a) => a.effect)).toEqual(["card.charge"]);
    const claimed = await connectH2.claim({ ref, mode: ClaimMode.RECOVER, generation: 1n }, { headers: bearer(server.tokens.worker) });
    expect(claimed).toMatchObject({ generation: 2n, recovering: true });

    const byGateway = await connectH2.listRecoverable({}, { headers: bearer(server.tokens.gateway) }).then(() => undefined, wireReasonOf);
    expect(byGateway).toBe("PERMISSION_DENIED");
    const badToken = await connectH2.listRecoverable({ pageToken: "nope" }, { headers: bearer(server.tokens.worker) }).then(() => undefined, wireReasonOf);
    expect(badToken).toBe("INVALID_REQUEST");
  });
});

describe("bad input over the wire", () => {
  it("refuses each with a clear error and a stable reason, storing nothing", async () => {
    const before = await countRows(t.pool);
    const cases: Array<[ReserveRequest, string, string?]> = [
      [reserveRequest("", {}), "INVALID_KEY"],
      [reserveRequest("short-key", {}), "INVALID_KEY"],
      [reserveRequest("x".repeat(300), {}), "INVALID_KEY"],
      [reserveRequest("aaaaaaaaaaaaaaaa", {}), "INVALID_KEY"],
      [reserveRequest("alice.smith@example.com", {}), "INVALID_KEY"],
      [reserveRequest("abcdefgh\u0001ijklmnop", {}), "INVALID_KEY"],
      [reserveRequest(newKey(), {}, { operation: "ledger.post" }), "UNKNOWN_OPERATION", server.tokens.worker],
      [reserveRequest(newKey(), { pad: "x".repeat(1024 * 1024) }), "INVALID_PAYLOAD"],
      [reserveRequest(newKey(), {}, { request: { case: undefined } }), "INVALID_REQUEST"],
      [reserveRequest(newKey(), {}, { subject: undefined }), "INVALID_REQUEST"],
    ];
    for (const [request, reason, token = server.tokens.gateway] of cases) {
      const result = await grpcCall(RESERVE, ReserveRequestSchema, ReserveResponseSchema, request, token);
      expect(result.reason, request.idempotencyKey).toBe(reason);
      expect(result.error?.details.length).toBeGreaterThan(10);
    }
    expect(await countRows(t.pool)).toEqual(before);
  });

  it("refuses unknown fields, in binary and in JSON", async () => {
    const before = await countRows(t.pool);
    const valid = toBinary(ReserveRequestSchema, reserveRequest(newKey(), {}));
    // Field 99, wire type 0 (varint), value 1: a field this server's proto does not have.
    const withUnknown = Buffer.concat([Buffer.from(valid), Buffer.from([0x98, 0x06, 0x01])]);
    const binary = await grpcCall(RESERVE, ReserveRequestSchema, ReserveResponseSchema, withUnknown, server.tokens.gateway);
    expect(binary.error?.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(binary.reason).toBe("UNKNOWN_FIELD");
    const json = await connectJson("Reserve", { subject: { tenant: "acme", principal: "alice", admin: true } }, server.tokens.gateway);
    expect(json.status).toBe(400);
    expect(json.body.message).toMatch(/"admin" is unknown/);
    expect(await countRows(t.pool)).toEqual(before);
  });

  it("holds names and pages to their limits, refuses oversized headers, and keeps serving", async () => {
    const before = await countRows(t.pool);
    const tooLong: Array<[ReserveRequest, RegExp]> = [
      [reserveRequest(newKey(), {}, { subject: { tenant: "t".repeat(129), principal: "alice" } }), /subject.tenant is longer than 128/],
      [reserveRequest(newKey(), {}, { subject: { tenant: "acme", principal: "p".repeat(257) } }), /subject.principal is longer than 256/],
      [reserveRequest(newKey(), {}, { operation: `payments.${"x".repeat(130)}` }), /at most 128 characters/],
    ];
    for (const [request, message] of tooLong) {
      const result = await grpcCall(RESERVE, ReserveRequestSchema, ReserveResponseSchema, request, server.tokens.gateway);
      expect(result.reason).toBe("INVALID_REQUEST");
      expect(result.error?.details).toMatch(message);
    }
    const page = await connectH2.listRecoverable({ pageSize: 501 }, { headers: bearer(server.tokens.worker) }).then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect([wireReasonOf(page), page?.rawMessage]).toEqual(["INVALID_REQUEST", "page_size must be from 1 to 500"]);

    // Headers (gRPC metadata) beyond what the server reads are refused before any handler runs.
    const padded = await fetch(`${server.baseUrl}${RESERVE}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...bearer(server.tokens.gateway), "x-pad": "x".repeat(128 * 1024) },
      body: "{}",
    });
    expect(padded.status).toBe(431);
    expect(await countRows(t.pool)).toEqual(before);
    expect((await connectH2.reserve(reserveRequest(newKey(), {}), { headers: bearer(server.tokens.gateway) })).decision).toBe(Decision.ACCEPTED);
  });

  it("refuses bytes that are not the request message with INVALID_ARGUMENT over every protocol, with or without a token", async () => {
    const before = await countRows(t.pool);
    // Field 1 (the subject) says 5 bytes follow; the one that does is no field tag.
    const notAMessage = Buffer.from([0x0a, 0x05, 0x01]);
    const said = /^the request body is not a valid idempotency\.v1\.ReserveRequest message in the protobuf binary encoding \(.+\): send that message/;

    for (const token of [undefined, server.tokens.gateway]) {
      const connect = await fetch(`${server.baseUrl}${RESERVE}`, {
        method: "POST",
        headers: { "content-type": "application/proto", ...(token ? bearer(token) : {}) },
        body: notAMessage,
      });
      expect(connect.status).toBe(400);
      const refusal = (await connect.json()) as ConnectJsonBody;
      expect(refusal.code).toBe("invalid_argument");
      expect(refusal.message).toMatch(said);
      expect(refusal.details?.[0]?.debug).toEqual({ reason: "INVALID_REQUEST", domain: "idempotency.v1" });

      const overGrpc = await grpcCall(RESERVE, ReserveRequestSchema, ReserveResponseSchema, notAMessage, token);
      expect(overGrpc.error?.code).toBe(grpc.status.INVALID_ARGUMENT);
      expect(overGrpc.reason).toBe("INVALID_REQUEST");
      expect(overGrpc.error?.details).toMatch(/is not a valid idempotency\.v1\.ReserveRequest message/);

      const grpcWeb = await fetch(`${server.baseUrl}${RESERVE}`, {
        method: "POST",
        headers: { "content-type": "application/grpc-web+proto", ...(token ? bearer(token) : {}) },
        body: Buffer.concat([Buffer.from([0, 0, 0, 0, notAMessage.length]), notAMessage]),
      });
      const frames = Buffer.from(await grpcWeb.arrayBuffer());
      // The only frame is the trailer (flag 0x80).
      expect(frames[0]).toBe(0x80);
      const trailer = trailerParse(frames.subarray(5));
      expect(trailer.get("grpc-status")).toBe(String(grpc.status.INVALID_ARGUMENT));
      expect(decodeURIComponent(trailer.get("grpc-message") ?? "")).toMatch(said);
    }

    // A streaming RPC's message is refused alike (it is parsed as its handler reads it).
    const stream = await new Promise<grpc.ServiceError | undefined>((resolve) => {
      const metadata = new grpc.Metadata();
      metadata.set("authorization", `Bearer ${server.tokens.operator}`);
      const call = grpcClient.makeServerStreamRequest(
        "/idempotency.v1.AdminService/StreamEvents",
        (b: Uint8Array) => Buffer.from(b),
        (b: Buffer) => b,
        notAMessage,
        metadata,
      );
      call.on("data", () => undefined);
      call.on("error", (error: grpc.ServiceError) => resolve(error));
      call.on("end", () => resolve(undefined));
    });
    expect(stream?.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(stream?.details).toMatch(/is not a valid idempotency\.v1\.StreamEventsRequest message/);
    expect(await countRows(t.pool)).toEqual(before);
  });

  it("refuses a request larger than the server accepts", async () => {
    const huge = reserveRequest(newKey(), { pad: "x".repeat(5 * 1024 * 1024) });
    const result = await grpcCall(RESERVE, ReserveRequestSchema, ReserveResponseSchema, huge, server.tokens.gateway);
    expect(result.error?.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
  });
});

describe("the registry's connections", () => {
  it("keeps serving after the database kills the server's idle connections", async () => {
    await connectH2.reserve(reserveRequest(newKey(), {}), { headers: bearer(server.tokens.gateway) });
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name = $1", [
      server.applicationName,
    ]);
    expect(rows[0]?.n).toBeGreaterThan(0);
    const after = await connectH2.reserve(reserveRequest(newKey(), {}), { headers: bearer(server.tokens.gateway) });
    expect(after.decision).toBe(Decision.ACCEPTED);
    expect((await fetch(`${server.adminUrl}/readyz`)).status).toBe(200);
  });
});

describe("refusals before any RPC runs", () => {
  it("answers a content type no protocol reads with 415 and a body naming the ones to send", async () => {
    const response = await fetch(`${server.baseUrl}${RESERVE}`, { method: "POST", headers: { "content-type": "text/plain", ...bearer(server.tokens.gateway) }, body: "{}" });
    expect(response.status).toBe(415);
    expect(response.headers.get("content-type")).toBe("application/json");
    const body = (await response.json()) as ConnectJsonBody;
    expect(body.code).toBe("invalid_argument");
    expect(body.message).toMatch(/^Content-Type 'text\/plain' is not one this RPC reads: send application\/json or application\/proto \(Connect\), application\/grpc \(gRPC\)/);
  });

  it("answers an unknown path with UNIMPLEMENTED in the protocol's shape: a JSON error, or a grpc-status", async () => {
    for (const [method, path] of [
      ["POST", "/idempotency.v1.CoordinatorService/Reserv"],
      ["GET", "/"],
    ] as const) {
      const response = await fetch(`${server.baseUrl}${path}`, { method, ...(method === "POST" ? { headers: { "content-type": "application/json" }, body: "{}" } : {}) });
      expect(response.status).toBe(404);
      const body = (await response.json()) as ConnectJsonBody;
      expect(body.code).toBe("unimplemented");
      expect(body.message).toContain(`no RPC at ${path}: this port serves idempotency.v1.CoordinatorService, idempotency.v1.AdminService, grpc.health.v1.Health`);
    }

    const overGrpc = await grpcCall("/idempotency.v1.CoordinatorService/Reserv", ReserveRequestSchema, ReserveResponseSchema, reserveRequest(newKey(), {}), server.tokens.gateway);
    expect(overGrpc.error?.code).toBe(grpc.status.UNIMPLEMENTED);
    expect(overGrpc.error?.details).toMatch(/^no RPC at/);

    const grpcWeb = await fetch(`${server.baseUrl}/idempotency.v1.CoordinatorService/Reserv`, {
      method: "POST",
      headers: { "content-type": "application/grpc-web+proto" },
      body: new Uint8Array(5),
    });
    expect(grpcWeb.status).toBe(200);
    expect(grpcWeb.headers.get("grpc-status")).toBe(String(grpc.status.UNIMPLEMENTED));
    expect(decodeURIComponent(grpcWeb.headers.get("grpc-message") ?? "")).toMatch(/^no RPC at \/idempotency\.v1\.CoordinatorService\/Reserv: /);
  });

  it("answers a method the RPC is not served to with 405, Allow, and what to send; a preflight without CORS says how to allow it", async () => {
    const preflight = await fetch(`${server.baseUrl}${RESERVE}`, {
      method: "OPTIONS",
      headers: { origin: "https://console.example.com", "access-control-request-method": "POST", "access-control-request-headers": "authorization, content-type" },
    });
    expect(preflight.status).toBe(405);
    expect(preflight.headers.get("allow")).toBe("POST");
    expect(preflight.headers.get("access-control-allow-origin")).toBeNull();
    const refusal = (await preflight.json()) as ConnectJsonBody;
    expect(refusal.code).toBe("unimplemented");
    expect(refusal.message).toMatch(/only pages of the origins listed in IDEM_CORS_ORIGINS may call the coordinator from a browser \(none is configured\)/);

    const put = await fetch(`${server.baseUrl}${RESERVE}`, { method: "PUT", headers: { "content-type": "application/json", ...bearer(server.tokens.gateway) }, body: "{}" });
    expect(put.status).toBe(405);
    expect(((await put.json()) as ConnectJsonBody).message).toBe("idempotency.v1.CoordinatorService/Reserve is not answered to PUT: send it as POST");
  });
});
