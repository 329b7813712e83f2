import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createRouterTransport, type Interceptor } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { MAX_BATCH_CALLS } from "../../src/contract/batch.js";
import type { FaultHooks, HookPoint } from "../../src/fault-hooks.js";
import { CoordinatorService, Decision as ProtoDecision, ReserveResponseSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { RecordState as ProtoRecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { CoordinatorClient, CoordinatorError, type CoordinatorClientOptions, type GatewayLogger, type ReserveInput } from "../../src/gateway/index.js";
import { useTestDatabase } from "../support/database.js";
import { jsonParts, newKey } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";
import { within } from "./helpers.js";

/**
 * The gateway SDK's batching against a real coordinator: concurrent calls
 * share Batch RPCs, and each call answers, fails, times out and is cancelled
 * exactly as the same call sent as its own RPC.
 */

/** Holds Complete after its commit while set: a call that is still running on the coordinator. */
let completeHeld: Promise<void> | undefined;
/** Called when the coordinator holds a Complete there. */
let onCompleteHeld: (() => void) | undefined;
const hooks: FaultHooks = {
  reached: (point: HookPoint) => {
    if (point !== "registry.complete.after-commit" || !completeHeld) return undefined;
    onCompleteHeld?.();
    return completeHeld;
  },
};

const t = useTestDatabase();
const server = useTestServer(t, { hooks });

/** A client of the server that tries each call once (closed after the last test). */
const client = (options: Partial<CoordinatorClientOptions> = {}): CoordinatorClient => server.sdkClient({ retry: { attempts: 1 }, ...options });

const reserveInput = (key: string, overrides: Partial<ReserveInput> = {}): ReserveInput => ({
  subject: { tenant: "acme", principal: "alice" },
  operation: "payments.create",
  apiRevision: 1,
  idempotencyKey: key,
  parts: jsonParts({ amount: 10 }),
  claim: true,
  ...overrides,
});

const snapshot = { statusCode: 201, mediaType: "application/json", location: "", businessVersion: "", headers: [] as Array<[string, string]>, body: new Uint8Array([1, 2]) };

/** How many RPCs of `method` the coordinator has timed (idem_rpc_duration_seconds on /metrics), whatever their code. */
async function rpcCount(method: string): Promise<number> {
  const text = await (await fetch(`${server.adminUrl}/metrics`)).text();
  let total = 0;
  for (const m of text.matchAll(/^idem_rpc_duration_seconds_count\{([^}]*)\} (\S+)$/gm)) {
    if (m[1]!.includes(`method="${method}"`)) total += Number(m[2]);
  }
  return total;
}

/** What a caller sees of a failed call. */
async function failureOf(call: Promise<unknown>) {
  const error = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error, "expected the call to fail").toBeInstanceOf(CoordinatorError);
  const failure = error as CoordinatorError;
  return { message: failure.message, code: failure.code, reason: failure.reason, metadata: failure.metadata, retryable: failure.retryable, unreachable: failure.unreachable };
}

describe("batching against a coordinator that serves Batch", () => {
  it("carries concurrent calls in fewer RPCs than calls, each with its own answer", async () => {
    const batched = client();
    const keys = Array.from({ length: 200 }, () => newKey());
    const batchesBefore = await rpcCount("Batch");
    const reservesBefore = await rpcCount("Reserve");
    const flows = await Promise.all(
      keys.map(async (key, i) => {
        const reserved = await batched.reserve(reserveInput(key, { parts: jsonParts({ amount: i }) }));
        const completed = await batched.complete({ ref: { tenant: "acme", operationId: reserved.operationId }, generation: reserved.generation, outcome: "SUCCEEDED", snapshot });
        return { reserved, completed };
      }),
    );
    const batches = (await rpcCount("Batch")) - batchesBefore;
    // Every call reached the coordinator (timed under its own RPC), in far fewer RPCs.
    expect((await rpcCount("Reserve")) - reservesBefore).toBe(keys.length);
    expect(batches).toBeGreaterThan(0);
    expect(batches).toBeLessThan(keys.length);
    expect(new Set(flows.map((f) => f.reserved.operationId)).size).toBe(keys.length);
    for (const { reserved, completed } of flows) {
      expect(reserved).toMatchObject({ decision: "ACCEPTED", generation: 1, state: "EXECUTING", enforced: true });
      expect(completed.state).toBe("SUCCEEDED");
    }
    // Each answer belongs to its own request: the record of each key, read alone, is the one its call was given.
    const alone = client({ batching: false });
    for (const [i, key] of keys.entries()) {
      const replay = await alone.reserve(reserveInput(key, { parts: jsonParts({ amount: i }) }));
      expect(replay).toMatchObject({ decision: "REPLAY", operationId: flows[i]!.reserved.operationId });
      expect(Buffer.from(replay.snapshot!.digest!).toString("hex")).toBe(Buffer.from(flows[i]!.completed.snapshotDigest).toString("hex"));
    }
  });

  it("never sends more than the contract's bound in one batch", async () => {
    // One Batch at a time: the last calls wait for the first batches, and a call's deadline runs from
    // when it is made, so it is far beyond what three batches take on a busy machine (and within the
    // coordinator's IDEM_MAX_DEADLINE_MS).
    const batched = client({ batching: { inFlight: 1 }, timeoutMs: 20_000 });
    const batchesBefore = await rpcCount("Batch");
    const calls = MAX_BATCH_CALLS * 2 + 10;
    // Calls refused before the registry: nothing of the database can make one of them time out.
    const failures = await Promise.all(Array.from({ length: calls }, () => failureOf(batched.reserve(reserveInput("too-short")))));
    expect(failures.every((f) => f.reason === "INVALID_KEY")).toBe(true);
    // Calls made together go together, in batches of at most the bound (the coordinator refuses larger ones).
    expect((await rpcCount("Batch")) - batchesBefore).toBe(Math.ceil(calls / MAX_BATCH_CALLS));
  });

  it("raises each refusal exactly as the same call sent alone, next to calls that succeed", async () => {
    const alone = client({ batching: false });
    const batched = client();
    const owned = await alone.reserve(reserveInput(newKey()));
    const ref = { tenant: "acme", operationId: owned.operationId };
    const refused: Array<(c: CoordinatorClient) => Promise<unknown>> = [
      (c) => c.complete({ ref, generation: 2, outcome: "SUCCEEDED", snapshot }),
      (c) => c.lookup({ ref: { tenant: "acme", operationId: "01a229d0-0f4c-7516-846e-0457ee592196" }, subject: { tenant: "acme", principal: "alice" } }),
      (c) => c.reserve(reserveInput(newKey(), { subject: { tenant: "globex", principal: "alice" } })),
      (c) => c.reserve(reserveInput("too-short")),
      (c) => c.claim({ ref, mode: "RECOVER", generation: 1 }),
      (c) => c.resolveEffectAttempt({ ref, generation: 1, attemptNumber: 7, status: "CONFIRMED" }),
    ];
    const expected = [];
    for (const call of refused) expected.push(await failureOf(call(alone)));
    expect(expected.map((e) => e.reason)).toEqual(["STALE_GENERATION", "NOT_FOUND", "PERMISSION_DENIED", "INVALID_KEY", "PERMISSION_DENIED", "ATTEMPT_NOT_FOUND"]);
    expect(expected[0]!.metadata).toEqual({ current_generation: "1" });

    const batchesBefore = await rpcCount("Batch");
    const [failures, neighbours] = await Promise.all([
      Promise.all(refused.map((call) => failureOf(call(batched)))),
      Promise.all(Array.from({ length: 6 }, () => batched.reserve(reserveInput(newKey())))),
    ]);
    expect(failures).toStrictEqual(expected);
    expect(neighbours.every((r) => r.decision === "ACCEPTED")).toBe(true);
    expect((await rpcCount("Batch")) - batchesBefore).toBeLessThan(refused.length + neighbours.length);
  });

  it("ends a call at its own deadline, with the error of a call sent alone, while its neighbours get their answers", async () => {
    const alone = client({ batching: false });
    const batched = client();
    const held = await alone.reserve(reserveInput(newKey()));
    const ref = { tenant: "acme", operationId: held.operationId };
    let release!: () => void;
    completeHeld = new Promise((resolve) => (release = resolve));
    try {
      const expected = await failureOf(alone.complete({ ref, generation: 1, outcome: "SUCCEEDED", snapshot }, { timeoutMs: 150 }));
      expect(expected.code).toBe(Code.DeadlineExceeded);
      const other = await alone.reserve(reserveInput(newKey()));
      const otherRef = { tenant: "acme", operationId: other.operationId };
      const started = performance.now();
      const timedOut = failureOf(batched.complete({ ref: otherRef, generation: 1, outcome: "SUCCEEDED", snapshot }, { timeoutMs: 150 }));
      const neighbour = batched.reserve(reserveInput(newKey()), { timeoutMs: 10_000 });
      expect(await timedOut).toStrictEqual(expected);
      // It stopped waiting at its deadline, not when its batch was answered.
      expect(performance.now() - started).toBeLessThan(1500);
      release();
      expect((await neighbour).decision).toBe("ACCEPTED");
    } finally {
      release();
      completeHeld = undefined;
    }
  });

  it("cancels a call with its signal, with the error of a call sent alone", async () => {
    const alone = client({ batching: false });
    const batched = client();
    const held = await alone.reserve(reserveInput(newKey()));
    const other = await alone.reserve(reserveInput(newKey()));
    let release!: () => void;
    completeHeld = new Promise((resolve) => (release = resolve));
    try {
      const cancelled = async (c: CoordinatorClient, operationId: string) => {
        const controller = new AbortController();
        const held = new Promise<void>((resolve) => (onCompleteHeld = resolve));
        const call = failureOf(
          c.complete({ ref: { tenant: "acme", operationId }, generation: 1, outcome: "SUCCEEDED", snapshot }, { signal: controller.signal, timeoutMs: 10_000 }),
        );
        // A neighbour made in the same turn, so that the batching client sends both in one Batch.
        const neighbour = c.reserve(reserveInput(newKey()), { timeoutMs: 10_000 });
        // Cancelled while the coordinator holds the call: in flight.
        await within(held, "the coordinator to hold the Complete");
        controller.abort();
        return { failure: await call, neighbour };
      };
      const { failure: expected } = await cancelled(alone, held.operationId);
      expect(expected.code).toBe(Code.Canceled);
      const batchesBefore = await rpcCount("Batch");
      const { failure, neighbour } = await cancelled(batched, other.operationId);
      expect(failure).toStrictEqual(expected);
      release();
      expect((await neighbour).decision).toBe("ACCEPTED");
      expect((await rpcCount("Batch")) - batchesBefore).toBe(1);
      // A signal aborted before the call: refused at once, as alone.
      const aborted = AbortSignal.abort();
      const complete = (c: CoordinatorClient) =>
        c.complete({ ref: { tenant: "acme", operationId: other.operationId }, generation: 1, outcome: "SUCCEEDED", snapshot }, { signal: aborted });
      expect(await failureOf(complete(batched))).toStrictEqual(await failureOf(complete(alone)));
    } finally {
      release();
      completeHeld = undefined;
      onCompleteHeld = undefined;
    }
  });

  it("sends a call that goes out with no other as its own RPC, and batches the calls that queued behind it", async () => {
    const batched = client({ batching: { inFlight: 1 } });
    const batchesBefore = await rpcCount("Batch");
    const reservesBefore = await rpcCount("Reserve");
    const lone = await batched.reserve(reserveInput(newKey()));
    expect(lone.decision).toBe("ACCEPTED");
    expect((await rpcCount("Batch")) - batchesBefore).toBe(0);
    expect((await rpcCount("Reserve")) - reservesBefore).toBe(1);
    // The first call goes alone and holds the one place in flight; the next ten, made meanwhile, go together.
    const together = await Promise.all(Array.from({ length: 11 }, () => batched.reserve(reserveInput(newKey()))));
    expect(together.every((r) => r.decision === "ACCEPTED")).toBe(true);
    expect((await rpcCount("Batch")) - batchesBefore).toBe(1);
    expect((await rpcCount("Reserve")) - reservesBefore).toBe(12);
  });

  it("sends no Batch RPC with batching off", async () => {
    const alone = client({ batching: false });
    const batchesBefore = await rpcCount("Batch");
    const reservesBefore = await rpcCount("Reserve");
    await Promise.all(Array.from({ length: 20 }, () => alone.reserve(reserveInput(newKey()))));
    expect((await rpcCount("Batch")) - batchesBefore).toBe(0);
    expect((await rpcCount("Reserve")) - reservesBefore).toBe(20);
  });
});

describe("batching against a coordinator without Batch", () => {
  /** An in-memory coordinator that serves Reserve only, as one that predates Batch; `seen` lists the RPCs it was asked for. */
  function olderCoordinator() {
    const seen: string[] = [];
    const counting: Interceptor = (next) => (req) => {
      seen.push(req.method.name);
      return next(req);
    };
    const transport = createRouterTransport(
      ({ service }) => {
        service(CoordinatorService, {
          reserve: (req) =>
            create(ReserveResponseSchema, {
              decision: ProtoDecision.ACCEPTED,
              operationId: `op-${req.idempotencyKey}`,
              state: ProtoRecordState.EXECUTING,
              generation: 1n,
              enforced: true,
              schemaRevision: 1,
              contractVersion: "http.idempotency.v1",
            }),
        });
      },
      { router: { interceptors: [counting] } },
    );
    return { transport, seen };
  }

  function recordingLogger(): GatewayLogger & { warnings: string[] } {
    const warnings: string[] = [];
    const ignore = () => undefined;
    return { warnings, debug: ignore, info: ignore, error: ignore, warn: (_obj, msg) => warnings.push(msg ?? "") };
  }

  it("falls back to unary RPCs for good when Batch is UNIMPLEMENTED, and says so once", async () => {
    const { transport, seen } = olderCoordinator();
    const logger = recordingLogger();
    const fallingBack = new CoordinatorClient({ transport, logger, retry: { attempts: 1 } });
    const keys = Array.from({ length: 30 }, () => newKey());
    const first = await Promise.all(keys.map((key) => fallingBack.reserve(reserveInput(key))));
    expect(first.map((r) => r.operationId)).toEqual(keys.map((key) => `op-${key}`));
    const asked = seen.filter((m) => m === "Batch").length;
    expect(asked).toBeGreaterThan(0);
    // Later calls never ask for Batch again.
    const later = await Promise.all(keys.map((key) => fallingBack.reserve(reserveInput(key))));
    expect(later.every((r) => r.decision === "ACCEPTED")).toBe(true);
    expect(seen.filter((m) => m === "Batch")).toHaveLength(asked);
    expect(seen.filter((m) => m === "Reserve")).toHaveLength(keys.length * 2);
    expect(logger.warnings).toHaveLength(1);
    expect(logger.warnings[0]).toMatch(/does not serve Batch/);
  });

  it("retries a batch that failed in transit call by call, as each call alone", async () => {
    // The first two RPCs fail in transit, whichever they are: the batch, then a call retried on its own.
    let failures = 2;
    const accepted = (key: string) =>
      create(ReserveResponseSchema, { decision: ProtoDecision.ACCEPTED, operationId: `op-${key}`, state: ProtoRecordState.EXECUTING, generation: 1n, enforced: true });
    const inTransit = () => {
      if (failures-- > 0) throw new ConnectError("connection reset", Code.Unavailable);
    };
    const seen: string[] = [];
    const transport = createRouterTransport(({ service }) => {
      service(CoordinatorService, {
        batch: (req) => {
          seen.push("Batch");
          inTransit();
          return {
            results: req.calls.map((call) => ({ result: { case: "reserve" as const, value: accepted(call.call.case === "reserve" ? call.call.value.idempotencyKey : "") } })),
          };
        },
        reserve: (req) => {
          seen.push("Reserve");
          inTransit();
          return accepted(req.idempotencyKey);
        },
      });
    });
    const retrying = new CoordinatorClient({ transport, retry: { attempts: 4, baseDelayMs: 1, maxDelayMs: 2 } });
    // Two calls made together go in one Batch (a call alone would go as its own RPC).
    const keys = [newKey(), newKey()];
    const answers = await Promise.all(keys.map((key) => retrying.reserve(reserveInput(key))));
    expect(answers).toMatchObject(keys.map((key) => ({ decision: "ACCEPTED", operationId: `op-${key}` })));
    expect(seen[0]).toBe("Batch");
    // Both failures were met and retried past.
    expect(failures).toBeLessThan(0);
  });
});
