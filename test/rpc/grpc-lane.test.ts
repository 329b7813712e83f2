import { create, fromBinary, toBinary, type DescMessage } from "@bufbuild/protobuf";
import { anyUnpack } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport, Http2SessionManager } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ErrorInfoSchema } from "../../src/gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "../../src/gen/google/rpc/status_pb.js";
import { HealthCheckRequestSchema, HealthCheckResponseSchema } from "../../src/gen/grpc/health/v1/health_pb.js";
import { CoordinatorService, LookupRequestSchema, LookupResponseSchema, ReserveRequestSchema, ReserveResponseSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { CoordinatorClient } from "../../src/gateway/index.js";
import { directGrpcTransport } from "../../src/gateway/transport.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { countRows } from "../support/registry-helpers.js";
import { useTestServer } from "../support/server.js";
import { until } from "../support/wait.js";
import { paymentReserve } from "../support/wire-requests.js";

const t = useTestDatabase();
const server = useTestServer(t);
let plain: grpc.Client;
let compressing: grpc.Client;

beforeAll(() => {
  const address = `127.0.0.1:${server.coordinator.rpcPort}`;
  plain = new grpc.Client(address, grpc.credentials.createInsecure());
  compressing = new grpc.Client(address, grpc.credentials.createInsecure(), { "grpc.default_compression_algorithm": 2 /* gzip */ });
});
afterAll(() => {
  plain?.close();
  compressing?.close();
});

const RESERVE = "/idempotency.v1.CoordinatorService/Reserve";
const LOOKUP = "/idempotency.v1.CoordinatorService/Lookup";
const CHECK = "/grpc.health.v1.Health/Check";

interface Answer {
  code: number;
  message?: string;
  reason?: string;
  response?: unknown;
}

/**
 * One unary call through @grpc/grpc-js (another implementation of gRPC, as a
 * service in another language calls). With `origin` the call carries an
 * Origin header, which the lane leaves to the Connect router.
 */
function call<I extends DescMessage, O extends DescMessage>(
  how: { client?: grpc.Client; token?: string; origin?: boolean; deadline?: Date },
  method: string,
  input: I,
  output: O,
  message: Parameters<typeof toBinary<I>>[1] | Uint8Array,
): Promise<Answer> {
  const metadata = new grpc.Metadata();
  if (how.token) metadata.set("authorization", `Bearer ${how.token}`);
  if (how.origin) metadata.set("origin", "https://elsewhere.example");
  const bytes = message instanceof Uint8Array ? message : toBinary(input, message);
  return new Promise((resolve) => {
    (how.client ?? plain).makeUnaryRequest(
      method,
      (b: Uint8Array) => Buffer.from(b),
      (b: Buffer) => fromBinary(output, b),
      bytes,
      metadata,
      how.deadline ? { deadline: how.deadline } : {},
      (error, response) => {
        if (!error) return resolve({ code: 0, response });
        const [details] = error.metadata.get("grpc-status-details-bin") as Buffer[];
        const status = details ? fromBinary(StatusSchema, details) : undefined;
        const info = status?.details[0] ? anyUnpack(status.details[0], ErrorInfoSchema) : undefined;
        resolve({ code: error.code, message: error.details, ...(info ? { reason: info.reason } : {}) });
      },
    );
  });
}

/** The same call on the short path and through the router: both answers, and how many calls the lane took. */
async function bothWays<I extends DescMessage, O extends DescMessage>(
  how: { token?: string; deadline?: Date },
  method: string,
  input: I,
  output: O,
  message: Parameters<typeof toBinary<I>>[1] | Uint8Array,
): Promise<{ lane: Answer; router: Answer; laneCalls: number }> {
  const before = server.coordinator.grpcLaneCalls();
  const lane = await call(how, method, input, output, message);
  const router = await call({ ...how, origin: true }, method, input, output, message);
  return { lane, router, laneCalls: server.coordinator.grpcLaneCalls() - before };
}

describe("the short path of unary gRPC calls", () => {
  it("answers what the Connect router answers: the message, or the code, message and reason of a refusal", async () => {
    const rowsBefore = await countRows(t.pool);
    const unknownField = new Uint8Array([...toBinary(ReserveRequestSchema, paymentReserve({ key: newKey() })), 0xf8, 0x07, 0x01]);
    const cases: Array<[string, () => ReturnType<typeof bothWays>]> = [
      ["a health check without credentials", () => bothWays({}, CHECK, HealthCheckRequestSchema, HealthCheckResponseSchema, create(HealthCheckRequestSchema, {}))],
      ["no token", () => bothWays({}, RESERVE, ReserveRequestSchema, ReserveResponseSchema, paymentReserve({ key: newKey() }))],
      [
        "a tenant the caller is not granted",
        () => bothWays({ token: server.tokens.globex }, RESERVE, ReserveRequestSchema, ReserveResponseSchema, paymentReserve({ key: newKey() })),
      ],
      [
        "bytes that are not the message",
        () => bothWays({ token: server.tokens.gateway }, RESERVE, ReserveRequestSchema, ReserveResponseSchema, new Uint8Array([0x0a, 0x05, 0x01])),
      ],
      ["a field the server does not know", () => bothWays({ token: server.tokens.gateway }, RESERVE, ReserveRequestSchema, ReserveResponseSchema, unknownField)],
      [
        "a deadline beyond the longest the server takes",
        () =>
          bothWays(
            { token: server.tokens.gateway, deadline: new Date(Date.now() + 30 * 24 * 3600_000) },
            RESERVE,
            ReserveRequestSchema,
            ReserveResponseSchema,
            paymentReserve({ key: newKey() }),
          ),
      ],
      [
        "a record that does not exist",
        () =>
          bothWays(
            { token: server.tokens.gateway },
            LOOKUP,
            LookupRequestSchema,
            LookupResponseSchema,
            create(LookupRequestSchema, { by: { case: "ref", value: { tenant: "acme", operationId: "0190f3a2-0000-7000-8000-000000000000" } } }),
          ),
      ],
    ];
    for (const [what, run] of cases) {
      const { lane, router, laneCalls } = await run();
      expect({ what, laneCalls }).toEqual({ what, laneCalls: 1 });
      expect({ what, ...lane }).toEqual({ what, ...router });
    }
    expect(await countRows(t.pool)).toEqual(rowsBefore);
  });

  it("refuses a body of two messages on both paths alike", async () => {
    const frame = (message: Uint8Array) => Buffer.concat([Buffer.from([0, 0, 0, 0, message.byteLength]), message]);
    const one = toBinary(ReserveRequestSchema, paymentReserve({ key: newKey() }));
    const raw = async (origin: boolean) => {
      const session = http2.connect(server.baseUrl);
      try {
        const stream = session.request({
          ":method": "POST",
          ":path": RESERVE,
          "content-type": "application/grpc",
          te: "trailers",
          authorization: `Bearer ${server.tokens.gateway}`,
          ...(origin ? { origin: "https://elsewhere.example" } : {}),
        });
        const status = new Promise<string | undefined>((resolve) => {
          let found: string | undefined;
          stream.on("response", (h) => (found ??= h["grpc-status"] as string | undefined));
          stream.on("trailers", (h: http2.IncomingHttpHeaders) => (found ??= h["grpc-status"] as string | undefined));
          stream.on("close", () => resolve(found));
          stream.resume();
        });
        stream.end(Buffer.concat([frame(one), frame(one)]));
        return await status;
      } finally {
        session.close();
      }
    };
    const rowsBefore = await countRows(t.pool);
    const before = server.coordinator.grpcLaneCalls();
    expect(await raw(false)).toBe(String(Code.Unimplemented));
    expect(server.coordinator.grpcLaneCalls() - before).toBe(1);
    expect(await raw(true)).toBe(String(Code.Unimplemented));
    expect(await countRows(t.pool)).toEqual(rowsBefore);
  });

  it("decides a key once whichever path its calls take: accepted on one, in progress on the other", async () => {
    const request = paymentReserve({ key: newKey() });
    const before = server.coordinator.grpcLaneCalls();
    const first = await call({ token: server.tokens.gateway }, RESERVE, ReserveRequestSchema, ReserveResponseSchema, request);
    const again = await call({ token: server.tokens.gateway, origin: true }, RESERVE, ReserveRequestSchema, ReserveResponseSchema, request);
    const third = await call({ token: server.tokens.gateway }, RESERVE, ReserveRequestSchema, ReserveResponseSchema, request);
    expect(server.coordinator.grpcLaneCalls() - before).toBe(2);
    const decision = (a: Answer) => (a.response as { decision: number; operationId: string }).decision;
    const id = (a: Answer) => (a.response as { operationId: string }).operationId;
    expect([first.code, again.code, third.code]).toEqual([0, 0, 0]);
    expect(decision(first)).not.toBe(decision(again));
    expect(decision(again)).toBe(decision(third));
    expect(id(again)).toBe(id(first));
    expect(id(third)).toBe(id(first));
  });

  it("leaves the router every other call: Connect, gRPC-Web, compressed messages, streams", async () => {
    const before = server.coordinator.grpcLaneCalls();
    const headers = { authorization: `Bearer ${server.tokens.gateway}` };
    const key = newKey();
    const overConnect = await createClient(CoordinatorService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" })).reserve(paymentReserve({ key }), { headers });
    const overGrpcWeb = await createClient(CoordinatorService, createGrpcWebTransport({ baseUrl: server.baseUrl, httpVersion: "1.1" })).reserve(paymentReserve({ key }), {
      headers,
    });
    const compressed = await call({ client: compressing, token: server.tokens.gateway }, RESERVE, ReserveRequestSchema, ReserveResponseSchema, paymentReserve({ key }));
    expect(overGrpcWeb.operationId).toBe(overConnect.operationId);
    expect(compressed.code).toBe(0);
    expect((compressed.response as { operationId: string }).operationId).toBe(overConnect.operationId);
    expect(server.coordinator.grpcLaneCalls()).toBe(before);
  });
});

describe("the gateway SDK's gRPC transport", () => {
  it("carries calls and refusals, with the reason, on the short path", async () => {
    const before = server.coordinator.grpcLaneCalls();
    const client = new CoordinatorClient({ baseUrl: server.baseUrl, token: server.tokens.gateway, batching: false });
    try {
      const input = {
        subject: { tenant: "acme", principal: "alice" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: newKey(),
        parts: { method: "POST", path: "/v1/payments", query: "", mediaType: "application/json", headers: [], body: new TextEncoder().encode("{}") },
        claim: true,
      };
      expect((await client.reserve(input)).decision).toBe("ACCEPTED");
      const refused = await client.reserve({ ...input, subject: { tenant: "globex", principal: "alice" } }).catch((e: unknown) => e);
      expect(refused).toMatchObject({ code: Code.PermissionDenied, reason: "PERMISSION_DENIED" });
      expect(server.coordinator.grpcLaneCalls() - before).toBe(2);
    } finally {
      client.close();
    }
  });

  it("fails a call it could not send as UNAVAILABLE (retried), and a call past its deadline or cancelled with their codes", async () => {
    const nowhere = new Http2SessionManager("http://127.0.0.1:9");
    const refused = await createClient(CoordinatorService, directGrpcTransport({ baseUrl: "http://127.0.0.1:9", sessionManager: nowhere }))
      .lookup({}, { timeoutMs: 2000 })
      .catch((e: unknown) => e);
    expect(ConnectError.from(refused).code).toBe(Code.Unavailable);
    nowhere.abort();

    // A server that takes every call and never answers.
    const silent = http2.createServer();
    const streams: http2.ServerHttp2Stream[] = [];
    silent.on("stream", (stream) => {
      streams.push(stream);
      stream.on("error", () => undefined); // the client's reset
    });
    await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
    const baseUrl = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
    const sessionManager = new Http2SessionManager(baseUrl);
    try {
      const coordinator = createClient(CoordinatorService, directGrpcTransport({ baseUrl, sessionManager }));
      const late = await coordinator.lookup({}, { timeoutMs: 100 }).catch((e: unknown) => e);
      expect(ConnectError.from(late).code).toBe(Code.DeadlineExceeded);
      const controller = new AbortController();
      const cancelled = coordinator.lookup({}, { signal: controller.signal }).catch((e: unknown) => e);
      await until(() => streams.length === 2, "the second call to reach the server");
      controller.abort();
      expect(ConnectError.from(await cancelled).code).toBe(Code.Canceled);
      // The server is told, as gRPC maps it: a deadline resets its stream with INTERNAL_ERROR, a cancel with CANCEL.
      await until(() => streams.every((stream) => stream.closed), "both streams to close");
      expect(streams.map((stream) => stream.rstCode)).toEqual([http2.constants.NGHTTP2_INTERNAL_ERROR, http2.constants.NGHTTP2_CANCEL]);
    } finally {
      sessionManager.abort();
      await new Promise((resolve) => silent.close(resolve));
    }
  });
});
