import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createRouterTransport } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { ErrorInfoSchema } from "../../src/gen/google/rpc/error_details_pb.js";
import { CoordinatorService, Decision, ReserveResponseSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { CoordinatorClient, CoordinatorError } from "../../src/gateway/index.js";
import { closedPort } from "./helpers.js";

const refusal = (code: Code, reason?: string) =>
  new ConnectError(
    `refused: ${reason ?? "no reason"}`,
    code,
    undefined,
    reason ? [{ desc: ErrorInfoSchema, value: create(ErrorInfoSchema, { reason, domain: "idempotency.v1" }) }] : [],
  );

/** A client over an in-memory coordinator whose Reserve fails with `failures` in turn, then accepts. */
function scripted(failures: ConnectError[], options: { attempts?: number } = {}) {
  const seen = { calls: 0, authorization: [] as Array<string | null> };
  const transport = createRouterTransport(({ service }) => {
    service(CoordinatorService, {
      reserve: (_req, ctx) => {
        seen.calls++;
        seen.authorization.push(ctx.requestHeader.get("authorization"));
        const failure = failures.shift();
        if (failure) throw failure;
        return create(ReserveResponseSchema, {
          decision: Decision.ACCEPTED,
          operationId: "0190f3a2-0000-7000-8000-000000000001",
          state: RecordState.EXECUTING,
          generation: 1n,
          enforced: true,
          schemaRevision: 1,
          contractVersion: "http.idempotency.v1",
        });
      },
    });
  });
  const client = new CoordinatorClient({ transport, token: "gw_token_0123456789abcdef", retry: { attempts: options.attempts ?? 4, baseDelayMs: 1, maxDelayMs: 2 } });
  return { client, seen };
}

const reserve = (client: CoordinatorClient) =>
  client.reserve({
    subject: { tenant: "acme", principal: "alice" },
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: "0d6f5f36-4ac4-4d8e-9b8e-2b8f3c0e6a11",
    parts: { method: "POST", path: "/v1/payments", query: "", mediaType: "application/json", headers: [], body: new Uint8Array() },
    claim: true,
  });

describe("the coordinator client's retries", () => {
  it.each([
    ["UNAVAILABLE without a reason (the transport failed)", undefined],
    ["REGISTRY_UNAVAILABLE", "REGISTRY_UNAVAILABLE"],
    ["REGISTRY_BUSY", "REGISTRY_BUSY"],
  ])("retries %s, where nothing was decided", async (_name, reason) => {
    const { client, seen } = scripted([refusal(Code.Unavailable, reason), refusal(Code.Unavailable, reason)]);
    const result = await reserve(client);
    expect(result).toMatchObject({ decision: "ACCEPTED", generation: 1, state: "EXECUTING", enforced: true });
    expect(seen.calls).toBe(3);
    // Every attempt carries the caller's token.
    expect(seen.authorization).toEqual(Array(3).fill("Bearer gw_token_0123456789abcdef"));
  });

  it.each([
    ["OPERATION_DRAINING", Code.Unavailable, "OPERATION_DRAINING"],
    ["QUOTA_EXCEEDED", Code.ResourceExhausted, "QUOTA_EXCEEDED"],
    ["STALE_GENERATION", Code.FailedPrecondition, "STALE_GENERATION"],
    ["INVALID_KEY", Code.InvalidArgument, "INVALID_KEY"],
    ["a deadline", Code.DeadlineExceeded, undefined],
  ])("never retries %s: it is an answer", async (_name, code, reason) => {
    const { client, seen } = scripted([refusal(code, reason)]);
    const error = await reserve(client).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CoordinatorError);
    expect((error as CoordinatorError).code).toBe(code);
    expect((error as CoordinatorError).reason).toBe(reason);
    expect((error as CoordinatorError).retryable).toBe(false);
    expect(seen.calls).toBe(1);
  });

  it("gives up after a bounded number of attempts", async () => {
    const { client, seen } = scripted(
      Array.from({ length: 10 }, () => refusal(Code.Unavailable)),
      { attempts: 3 },
    );
    const error = (await reserve(client).catch((e: unknown) => e)) as CoordinatorError;
    expect(error).toBeInstanceOf(CoordinatorError);
    expect(error.code).toBe(Code.Unavailable);
    expect(error.retryable).toBe(true);
    expect(error.unreachable).toBe(true);
    expect(seen.calls).toBe(3);
  });

  it("enforces a deadline on every call", async () => {
    const transport = createRouterTransport(({ service }) => {
      service(CoordinatorService, {
        reserve: (_req, ctx) => new Promise((_resolve, reject) => ctx.signal.addEventListener("abort", () => reject(new ConnectError("gone", Code.Canceled)))),
      });
    });
    const client = new CoordinatorClient({ transport, timeoutMs: 50, retry: { attempts: 1 } });
    const error = (await reserve(client).catch((e: unknown) => e)) as CoordinatorError;
    expect(error).toBeInstanceOf(CoordinatorError);
    expect(error.code).toBe(Code.DeadlineExceeded);
  });

  it("reports a coordinator that does not listen as unreachable (gRPC over HTTP/2)", async () => {
    const client = new CoordinatorClient({ baseUrl: `http://127.0.0.1:${await closedPort()}`, timeoutMs: 500, retry: { attempts: 2, baseDelayMs: 1 } });
    try {
      const error = (await reserve(client).catch((e: unknown) => e)) as CoordinatorError;
      expect(error).toBeInstanceOf(CoordinatorError);
      expect(error.code).toBe(Code.Unavailable);
      expect(error.reason).toBeUndefined();
      expect(error.unreachable).toBe(true);
    } finally {
      client.close();
    }
  });
});
