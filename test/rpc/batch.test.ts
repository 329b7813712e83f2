import { create, createRegistry, toJson, type Message, type MessageInitShape } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";
import { anyUnpack } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { beforeAll, describe, expect, it } from "vitest";
import { MAX_BATCH_CALLS } from "../../src/contract/batch.js";
import type { FaultHooks, HookPoint } from "../../src/fault-hooks.js";
import { ErrorInfoSchema, file_google_rpc_error_details } from "../../src/gen/google/rpc/error_details_pb.js";
import type { Status } from "../../src/gen/google/rpc/status_pb.js";
import {
  type BatchCall,
  BatchCallSchema,
  BatchRequestSchema,
  type BatchResult,
  ClaimMode,
  CoordinatorService,
  Decision,
  type OperationRef,
  OperationRefSchema,
  ReserveRequestSchema,
  type ReserveRequest,
  file_idempotency_v1_coordinator,
} from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { EffectStatus, HttpRequestPartsSchema, Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { countRows } from "../support/registry-helpers.js";
import { useTestServer } from "../support/server.js";
import { until } from "../support/wait.js";

/**
 * The Batch RPC over the wire (gRPC over HTTP/2, as the gateway SDK speaks
 * it), against a real coordinator: every call of a batch is answered exactly
 * as its unary RPC answers the same request, whatever its neighbours do.
 */

/** Holds Complete after its commit while `completeHeld` is set: a call that is still running. */
let completeHeld: Promise<void> | undefined;
const hooks: FaultHooks = { reached: (point: HookPoint) => (point === "registry.complete.after-commit" ? completeHeld : undefined) };

const t = useTestDatabase();
const server = useTestServer(t, { hooks });
let client: Client<typeof CoordinatorService>;

beforeAll(() => {
  client = createClient(CoordinatorService, createGrpcTransport({ baseUrl: server.baseUrl }));
});

const as = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });
const gateway = () => as(server.tokens.gateway);
const encode = (json: unknown) => new TextEncoder().encode(JSON.stringify(json));

function reserveRequest(key: string, json: unknown = { amount: 10 }, overrides: MessageInitShape<typeof ReserveRequestSchema> = {}): ReserveRequest {
  return create(ReserveRequestSchema, {
    subject: { tenant: "acme", principal: "alice" },
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: key,
    request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: encode(json) }) },
    ...overrides,
  } as MessageInitShape<typeof ReserveRequestSchema>);
}

/** An operation accepted and claimed by the gateway at generation 1. */
async function executing(): Promise<{ key: string; ref: OperationRef }> {
  const key = newKey();
  const reserved = await client.reserve(reserveRequest(key, { amount: 10 }, { claim: true }), gateway());
  expect(reserved.decision).toBe(Decision.ACCEPTED);
  return { key, ref: create(OperationRefSchema, { tenant: "acme", operationId: reserved.operationId }) };
}

const snapshot = { statusCode: 201, mediaType: "application/json", body: encode({ id: "p_1" }) };

/** What a client sees of a call: the response, or the code, message and every detail of its refusal. */
type Answer = { response: unknown } | { code: Code; message: string; details: unknown[] };

const messages = createRegistry(file_idempotency_v1_coordinator);

/** A response as its JSON form, byte fields included, whatever buffer type decoding gave them. */
function responseOf(message: Message): unknown {
  return { [message.$typeName]: toJson(messages.getMessage(message.$typeName)!, message) };
}

/** The answer of a unary RPC. */
async function unaryAnswer(call: Promise<Message>): Promise<Answer> {
  try {
    return { response: responseOf(await call) };
  } catch (thrown) {
    const error = ConnectError.from(thrown);
    return { code: error.code, message: error.rawMessage, details: error.findDetails(ErrorInfoSchema) };
  }
}

/** The answer of one call of a batch, in the same terms. */
function batchAnswer(result: BatchResult["result"]): Answer {
  if (result.case === "error") return { code: result.value.code as Code, message: result.value.message, details: errorInfos(result.value) };
  return { response: result.case === undefined ? undefined : responseOf(result.value) };
}

const errorInfos = (status: Status) => status.details.map((any) => anyUnpack(any, ErrorInfoSchema)).filter((info) => info !== undefined);

/** The unary answer of `call` through the RPC of its kind. */
function unary(call: BatchCall["call"], token = server.tokens.gateway): Promise<Answer> {
  const options = as(token);
  switch (call.case) {
    case "reserve":
      return unaryAnswer(client.reserve(call.value, options));
    case "claim":
      return unaryAnswer(client.claim(call.value, options));
    case "renewLease":
      return unaryAnswer(client.renewLease(call.value, options));
    case "recordEffectAttempt":
      return unaryAnswer(client.recordEffectAttempt(call.value, options));
    case "resolveEffectAttempt":
      return unaryAnswer(client.resolveEffectAttempt(call.value, options));
    case "complete":
      return unaryAnswer(client.complete(call.value, options));
    case "release":
      return unaryAnswer(client.release(call.value, options));
    case "abandon":
      return unaryAnswer(client.abandon(call.value, options));
    case "lookup":
      return unaryAnswer(client.lookup(call.value, options));
    default:
      throw new Error("a call without a kind has no unary RPC");
  }
}

const batchCall = (call: MessageInitShape<typeof BatchCallSchema>["call"]): BatchCall => create(BatchCallSchema, { call });

/** The RPC timer and refusal counters of /metrics, as text lines. */
async function metricLines(): Promise<string[]> {
  return (await (await fetch(`${server.adminUrl}/metrics`)).text()).split("\n");
}

function counted(lines: string[], prefix: string, labels: string[]): number {
  const line = lines.find((l) => l.startsWith(prefix) && labels.every((label) => l.includes(label)));
  return line ? Number(line.slice(line.lastIndexOf(" ") + 1)) : 0;
}

describe("a batch of calls", () => {
  it("answers each call exactly as its unary RPC answers the same request, refusals next to successes", async () => {
    const done = await executing();
    await client.complete({ ref: done.ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot }, gateway());
    const running = await executing();
    const calls = [
      // REPLAY of a finished operation.
      batchCall({ case: "reserve", value: reserveRequest(done.key) }),
      // Another payload under the same key.
      batchCall({ case: "reserve", value: reserveRequest(done.key, { amount: 11 }) }),
      // An older owner's write after a takeover: STALE_GENERATION.
      batchCall({ case: "complete", value: { ref: running.ref, generation: 2n, outcome: Outcome.SUCCEEDED, snapshot } }),
      // The identical Complete again succeeds again.
      batchCall({ case: "complete", value: { ref: done.ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot } }),
      // An operation that does not exist: NOT_FOUND.
      batchCall({
        case: "lookup",
        value: { by: { case: "ref", value: { tenant: "acme", operationId: "01a229d0-0f4c-7516-846e-0457ee592196" } }, subject: { tenant: "acme", principal: "alice" } },
      }),
      batchCall({ case: "lookup", value: { by: { case: "ref", value: done.ref }, subject: { tenant: "acme", principal: "alice" } } }),
      // A tenant this gateway is not granted: PERMISSION_DENIED.
      batchCall({ case: "reserve", value: reserveRequest(newKey(), { amount: 10 }, { subject: { tenant: "globex", principal: "alice" } }) }),
      // A role this gateway does not have: PERMISSION_DENIED.
      batchCall({ case: "claim", value: { ref: running.ref, mode: ClaimMode.RECOVER, generation: 1n } }),
      // A malformed key: INVALID_KEY, with the metadata of the key rules.
      batchCall({ case: "reserve", value: reserveRequest("too-short") }),
      batchCall({ case: "renewLease", value: { ref: running.ref, generation: 1n } }),
      batchCall({ case: "resolveEffectAttempt", value: { ref: running.ref, generation: 1n, attemptNumber: 9, status: EffectStatus.CONFIRMED } }),
      batchCall({ case: "release", value: { ref: done.ref, generation: 1n } }),
      batchCall({ case: "abandon", value: { ref: running.ref, generation: 3n } }),
    ];
    const initially = await countRows(t.pool);
    const unaryAnswers = [];
    for (const call of calls) unaryAnswers.push(await unary(call.call));
    const afterUnary = await countRows(t.pool);

    const { results } = await client.batch({ calls }, gateway());

    expect(results).toHaveLength(calls.length);
    const answers = results.map((r) => batchAnswer(r.result));
    // RenewLease answers a new expiry each time: compared on its kind below.
    expect(answers.filter((_, i) => i !== 9)).toStrictEqual(unaryAnswers.filter((_, i) => i !== 9));
    expect(results[9]!.result.case).toBe("renewLease");
    // Each answer is the one its request calls for, not merely the same as another wrong one.
    expect(results.map((r) => (r.result.case === "error" ? errorInfos(r.result.value)[0]?.reason : r.result.case))).toEqual([
      "reserve",
      "reserve",
      "STALE_GENERATION",
      "complete",
      "NOT_FOUND",
      "lookup",
      "PERMISSION_DENIED",
      "PERMISSION_DENIED",
      "INVALID_KEY",
      "renewLease",
      "ATTEMPT_NOT_FOUND",
      "INVALID_TRANSITION",
      "STALE_GENERATION",
    ]);
    expect(results[0]!.result).toMatchObject({ case: "reserve", value: { decision: Decision.REPLAY } });
    expect(results[1]!.result).toMatchObject({ case: "reserve", value: { decision: Decision.PAYLOAD_CONFLICT, operationId: "" } });
    // The batch wrote what the unary calls wrote (events of the decisions and the renewal), no record.
    const afterBatch = await countRows(t.pool);
    const written = (from: typeof initially, to: typeof initially) => ({
      records: to.records - from.records,
      attempts: to.attempts - from.attempts,
      events: to.events - from.events,
    });
    expect(written(afterUnary, afterBatch)).toEqual(written(initially, afterUnary));
    expect(written(afterUnary, afterBatch).records).toBe(0);
  });

  it("makes the decisions of new operations as the unary RPCs would, and writes them", async () => {
    const [first, second] = [newKey(), newKey()];
    const { results } = await client.batch(
      { calls: [batchCall({ case: "reserve", value: reserveRequest(first, { amount: 1 }, { claim: true }) }), batchCall({ case: "reserve", value: reserveRequest(second) })] },
      gateway(),
    );
    expect(results.map((r) => r.result.case === "reserve" && [r.result.value.decision, r.result.value.state, r.result.value.generation])).toEqual([
      [Decision.ACCEPTED, RecordState.EXECUTING, 1n],
      [Decision.ACCEPTED, RecordState.RESERVED, 1n],
    ]);
    const operationId = results[0]!.result.case === "reserve" ? results[0]!.result.value.operationId : "";
    // The records are there: the same requests now find them.
    expect((await client.reserve(reserveRequest(first, { amount: 1 }), gateway())).decision).toBe(Decision.IN_PROGRESS);
    expect((await client.reserve(reserveRequest(first, { amount: 2 }), gateway())).decision).toBe(Decision.PAYLOAD_CONFLICT);
    const completed = await client.batch(
      { calls: [batchCall({ case: "complete", value: { ref: { tenant: "acme", operationId }, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot } })] },
      gateway(),
    );
    expect(completed.results[0]!.result).toMatchObject({ case: "complete", value: { state: RecordState.SUCCEEDED } });
    expect((await client.reserve(reserveRequest(first, { amount: 1 }), gateway())).decision).toBe(Decision.REPLAY);
  });

  it("decides two identical calls of one batch independently: one owner, one IN_PROGRESS", async () => {
    const key = newKey();
    const call = batchCall({ case: "reserve", value: reserveRequest(key, { amount: 5 }, { claim: true }) });
    const { results } = await client.batch({ calls: [call, call] }, gateway());
    const decisions = results.map((r) => (r.result.case === "reserve" ? r.result.value.decision : undefined));
    expect(decisions.sort()).toEqual([Decision.ACCEPTED, Decision.IN_PROGRESS]);
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record WHERE operation_id = ANY($1::uuid[])", [
      results.map((r) => (r.result.case === "reserve" ? r.result.value.operationId : "")),
    ]);
    expect(rows[0]!.n).toBe(1);
  });

  it("refuses a call's unknown fields in that call only, as its unary RPC does", async () => {
    const withUnknown = reserveRequest(newKey());
    withUnknown.subject!.$unknown = [{ no: 99, wireType: WireType.Varint, data: new Uint8Array([1]) }];
    const unknownKind = create(BatchCallSchema);
    unknownKind.$unknown = [{ no: 42, wireType: WireType.LengthDelimited, data: new Uint8Array([0]) }];
    const expected = await unary({ case: "reserve", value: withUnknown });
    const { results } = await client.batch(
      { calls: [batchCall({ case: "reserve", value: withUnknown }), unknownKind, create(BatchCallSchema), batchCall({ case: "reserve", value: reserveRequest(newKey()) })] },
      gateway(),
    );
    expect(expected).toMatchObject({ code: Code.InvalidArgument, details: [{ reason: "UNKNOWN_FIELD" }] });
    expect(batchAnswer(results[0]!.result)).toStrictEqual(expected);
    expect(batchAnswer(results[1]!.result)).toMatchObject({ code: Code.InvalidArgument, details: [{ reason: "UNKNOWN_FIELD", domain: "idempotency.v1" }] });
    expect(batchAnswer(results[2]!.result)).toMatchObject({ code: Code.InvalidArgument, details: [{ reason: "INVALID_REQUEST", domain: "idempotency.v1" }] });
    expect(results[3]!.result).toMatchObject({ case: "reserve", value: { decision: Decision.ACCEPTED } });
  });

  it("counts each call under its own RPC in the metrics, and the batch once", async () => {
    const running = await executing();
    const before = await metricLines();
    await client.batch(
      {
        calls: [
          batchCall({ case: "reserve", value: reserveRequest(newKey()) }),
          batchCall({ case: "reserve", value: reserveRequest(newKey()) }),
          batchCall({ case: "complete", value: { ref: running.ref, generation: 2n, outcome: Outcome.SUCCEEDED, snapshot } }),
        ],
      },
      gateway(),
    );
    const after = await metricLines();
    const delta = (prefix: string, ...labels: string[]) => counted(after, prefix, labels) - counted(before, prefix, labels);
    expect(delta("idem_rpc_duration_seconds_count", 'method="Batch"', 'code="ok"')).toBe(1);
    expect(delta("idem_rpc_duration_seconds_count", 'method="Reserve"', 'code="ok"')).toBe(2);
    expect(delta("idem_rpc_duration_seconds_count", 'method="Complete"', 'code="FailedPrecondition"')).toBe(1);
    expect(delta("idem_refusals_total", 'method="Complete"', 'reason="STALE_GENERATION"')).toBe(1);
  });

  it("answers an empty batch with no results", async () => {
    expect((await client.batch({ calls: [] }, gateway())).results).toEqual([]);
  });
});

describe("a batch refused as a whole", () => {
  it(`refuses more than ${MAX_BATCH_CALLS} calls with INVALID_REQUEST, deciding none of them`, async () => {
    const before = await countRows(t.pool);
    const calls = Array.from({ length: MAX_BATCH_CALLS + 1 }, () => batchCall({ case: "reserve", value: reserveRequest(newKey()) }));
    const error = await client.batch({ calls }, gateway()).then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect(error?.code).toBe(Code.InvalidArgument);
    expect(error?.findDetails(ErrorInfoSchema)[0]).toMatchObject({ reason: "INVALID_REQUEST", domain: "idempotency.v1", metadata: { max_calls: String(MAX_BATCH_CALLS) } });
    expect(await countRows(t.pool)).toEqual(before);
    // The bound itself is accepted, and each call decided (calls refused before the registry, so that a busy test machine cannot time them out).
    const cheap = Array.from({ length: MAX_BATCH_CALLS }, () => batchCall({ case: "reserve", value: reserveRequest("too-short") }));
    const { results } = await client.batch({ calls: cheap }, gateway());
    expect(results.map((r) => (r.result.case === "error" ? errorInfos(r.result.value)[0]?.reason : r.result.case))).toEqual(Array(MAX_BATCH_CALLS).fill("INVALID_KEY"));
  });

  it("refuses an unauthenticated batch with UNAUTHENTICATED", async () => {
    const error = await client.batch({ calls: [batchCall({ case: "reserve", value: reserveRequest(newKey()) })] }).then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect(error?.code).toBe(Code.Unauthenticated);
    expect(error?.findDetails(ErrorInfoSchema)[0]?.reason).toBe("UNAUTHENTICATED");
  });

  it("refuses unknown fields of the batch itself with UNKNOWN_FIELD", async () => {
    const batch = create(BatchRequestSchema, { calls: [batchCall({ case: "reserve", value: reserveRequest(newKey()) })] });
    batch.$unknown = [{ no: 7, wireType: WireType.Varint, data: new Uint8Array([1]) }];
    const error = await client.batch(batch, gateway()).then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect(error?.findDetails(ErrorInfoSchema)[0]?.reason).toBe("UNKNOWN_FIELD");
  });

  it("ends at its deadline while a call still runs, and that call finishes as a unary one would", async () => {
    const running = await executing();
    let release!: () => void;
    completeHeld = new Promise((resolve) => (release = resolve));
    try {
      const before = counted(await metricLines(), "idem_rpc_duration_seconds_count", ['method="Batch"', 'code="DeadlineExceeded"']);
      const error = await client
        // The deadline goes as its header alone, without the client's own timer: that timer, started
        // first, would cancel the stream and race the coordinator's, which is the one under test.
        .batch(
          { calls: [batchCall({ case: "complete", value: { ref: running.ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot } })] },
          { headers: { ...gateway().headers, "grpc-timeout": "300m" } },
        )
        .then(
          () => undefined,
          (e: unknown) => ConnectError.from(e),
        );
      // Answered while its call is still held (released only below): the coordinator's deadline ended it, nothing else could.
      expect(error?.code).toBe(Code.DeadlineExceeded);
      // The coordinator answered the batch at its deadline, while its call was still held.
      const deadlineExceeded = async () => counted(await metricLines(), "idem_rpc_duration_seconds_count", ['method="Batch"', 'code="DeadlineExceeded"']);
      await until(async () => (await deadlineExceeded()) >= before + 1, "the coordinator to time the Batch as DeadlineExceeded");
      expect(await deadlineExceeded()).toBe(before + 1);
    } finally {
      release();
      completeHeld = undefined;
    }
    // The held call committed: its record is complete, as after a unary call that outlived its deadline.
    await until(async () => {
      const { rows } = await t.pool.query<{ state: string }>("SELECT state FROM idem_record WHERE operation_id = $1", [running.ref.operationId]);
      return rows[0]?.state === "SUCCEEDED";
    }, "the held call's record to be complete");
  });
});

describe("a batch over every protocol", () => {
  /** A client decoding Connect JSON needs the detail types that may come inside a Status, as any JSON client of google.rpc.Status does. */
  const details = { registry: createRegistry(file_google_rpc_error_details) };
  const transports = {
    "Connect JSON": () => createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "1.1", useBinaryFormat: false, jsonOptions: details }),
    "Connect binary": () => createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2", useBinaryFormat: true }),
    gRPC: () => createGrpcTransport({ baseUrl: server.baseUrl }),
    "gRPC-Web": () => createGrpcWebTransport({ baseUrl: server.baseUrl, httpVersion: "1.1" }),
  };

  for (const [protocol, transport] of Object.entries(transports)) {
    it(`answers a refused call with its Status and ErrorInfo, and the others, over ${protocol}`, async () => {
      const over = createClient(CoordinatorService, transport());
      const { results } = await over.batch(
        { calls: [batchCall({ case: "reserve", value: reserveRequest("too-short") }), batchCall({ case: "reserve", value: reserveRequest(newKey()) })] },
        gateway(),
      );
      expect(batchAnswer(results[0]!.result)).toMatchObject({ code: Code.InvalidArgument, details: [{ reason: "INVALID_KEY", domain: "idempotency.v1" }] });
      expect(results[1]!.result).toMatchObject({ case: "reserve", value: { decision: Decision.ACCEPTED } });
      // A refused unary RPC carries the same detail over the same protocol.
      const unaryRefusal = await over.reserve(reserveRequest("too-short"), gateway()).then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
      expect(unaryRefusal?.findDetails(ErrorInfoSchema)[0]).toMatchObject({ reason: "INVALID_KEY", domain: "idempotency.v1" });
    });
  }

  it("writes a refused call's details in Connect JSON as curl sees them: the ErrorInfo with its @type", async () => {
    const response = await fetch(`${server.baseUrl}/idempotency.v1.CoordinatorService/Batch`, {
      method: "POST",
      headers: { "content-type": "application/json", ...gateway().headers },
      body: JSON.stringify({
        calls: [{ reserve: toJson(ReserveRequestSchema, reserveRequest("too-short")) }, { reserve: toJson(ReserveRequestSchema, reserveRequest(newKey())) }],
      }),
    });
    expect(response.status).toBe(200);
    const body = (await response.json()) as { results: Array<Record<string, unknown>> };
    expect(body.results[0]).toMatchObject({
      error: { code: Code.InvalidArgument, details: [{ "@type": "type.googleapis.com/google.rpc.ErrorInfo", reason: "INVALID_KEY", domain: "idempotency.v1" }] },
    });
    expect(body.results[1]).toMatchObject({ reserve: { decision: "DECISION_ACCEPTED" } });
  });
});
