import { readFileSync } from "node:fs";
import { Code } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { ERROR_DOMAIN, IdempotencyError, REASONS, refusalOf, REFUSALS, refuse, STATUS_CODES, type StatusCodeName } from "../../src/contract/errors.js";
import { ErrorReason } from "../../src/gen/idempotency/v1/errors_pb.js";

/** The enum's value names, without TypeScript's numeric reverse mappings. */
function protoReasonNames(): string[] {
  return Object.keys(ErrorReason).filter((name) => Number.isNaN(Number(name)) && name !== "ERROR_REASON_UNSPECIFIED");
}

describe("REASONS", () => {
  it("equals exactly the set of idempotency.v1.ErrorReason names", () => {
    const proto = protoReasonNames();
    expect(proto.length).toBeGreaterThan(0);
    expect([...REASONS].sort()).toEqual([...proto].sort());
  });

  it("has no duplicates and excludes the unspecified value", () => {
    expect(new Set(REASONS).size).toBe(REASONS.length);
    expect(REASONS as readonly string[]).not.toContain("ERROR_REASON_UNSPECIFIED");
  });

  it("lists the reasons in the proto's numeric order", () => {
    const byNumber = protoReasonNames().sort((a, b) => (ErrorReason[a as keyof typeof ErrorReason] as number) - (ErrorReason[b as keyof typeof ErrorReason] as number));
    expect([...REASONS]).toEqual(byNumber);
  });
});

/** Each reason of errors.proto with the comment above it (lint directives left out). */
function protoComments(): Map<string, string> {
  const lines = readFileSync(new URL("../../proto/idempotency/v1/errors.proto", import.meta.url), "utf8").split("\n");
  const comments = new Map<string, string>();
  let comment: string[] = [];
  for (const line of lines) {
    const text = line.trim();
    const value = /^([A-Z_]+) = \d+;$/.exec(text);
    if (value) {
      comments.set(value[1]!, comment.join(" "));
      comment = [];
    } else if (text.startsWith("//")) {
      if (!text.startsWith("// buf:lint:")) comment.push(text.slice(2).trim());
    } else {
      comment = [];
    }
  }
  comments.delete("ERROR_REASON_UNSPECIFIED");
  return comments;
}

describe("REFUSALS, the one table from reason to code", () => {
  const comments = protoComments();

  it("has exactly one entry per reason of errors.proto", () => {
    expect(Object.keys(REFUSALS).sort()).toEqual([...comments.keys()].sort());
    expect(Object.keys(REFUSALS).sort()).toEqual([...REASONS].sort());
  });

  it.each([...comments])("sends %s with the code its comment in errors.proto names", (reason, comment) => {
    const code = /^([A-Z_]+):/.exec(comment)?.[1];
    expect(code, `the comment of ${reason} starts with its status code`).toBeDefined();
    expect(REFUSALS[reason as keyof typeof REFUSALS].code).toBe(code);
  });

  it("marks retryable exactly the reasons errors.proto says to retry with backoff", () => {
    const toRetry = [...comments].filter(([, comment]) => /retry with backoff/.test(comment)).map(([reason]) => reason);
    expect(toRetry.length).toBeGreaterThan(0);
    expect(
      Object.entries(REFUSALS)
        .filter(([, refusal]) => refusal.retryable)
        .map(([reason]) => reason)
        .sort(),
    ).toEqual(toRetry.sort());
  });

  it("carries Connect's numbers for the gRPC codes, and one HTTP status per code", () => {
    const pascal = (name: StatusCodeName) => name.toLowerCase().replace(/(^|_)([a-z])/g, (_m, _u, c: string) => c.toUpperCase()) as keyof typeof Code;
    for (const [name, { grpc }] of Object.entries(STATUS_CODES) as Array<[StatusCodeName, { grpc: number }]>) {
      expect(grpc, name).toBe(Code[pascal(name)]);
    }
    expect(Object.fromEntries(Object.entries(STATUS_CODES).map(([name, { http }]) => [name, http]))).toEqual({
      INVALID_ARGUMENT: 400,
      UNAUTHENTICATED: 401,
      PERMISSION_DENIED: 403,
      NOT_FOUND: 404,
      FAILED_PRECONDITION: 409,
      RESOURCE_EXHAUSTED: 429,
      INTERNAL: 500,
      UNAVAILABLE: 503,
    });
  });

  it("looks reasons received as text up, and knows none it does not list", () => {
    expect(refusalOf("REGISTRY_BUSY")).toEqual({ code: "UNAVAILABLE", retryable: true });
    expect(refusalOf("SOMETHING_NEWER")).toBeUndefined();
    expect(refusalOf("toString")).toBeUndefined();
    expect(ERROR_DOMAIN).toBe("idempotency.v1");
  });
});

describe("IdempotencyError and refuse", () => {
  it("carries the reason, message and metadata", () => {
    const error = new IdempotencyError("NOT_FOUND", "no such operation", { operation_id: "x" });
    expect(error).toBeInstanceOf(Error);
    expect(error.name).toBe("IdempotencyError");
    expect(error.reason).toBe("NOT_FOUND");
    expect(error.message).toBe("no such operation");
    expect(error.metadata).toEqual({ operation_id: "x" });
    expect(new IdempotencyError("INTERNAL", "x").metadata).toEqual({});
  });

  it("keeps a cause", () => {
    const cause = new Error("db down");
    expect(new IdempotencyError("REGISTRY_UNAVAILABLE", "retry", {}, { cause }).cause).toBe(cause);
  });

  it("refuse throws an IdempotencyError", () => {
    let caught: unknown;
    try {
      refuse("LEASE_HELD", "another owner holds the lease", { generation: "3" });
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(IdempotencyError);
    expect((caught as IdempotencyError).reason).toBe("LEASE_HELD");
    expect((caught as IdempotencyError).metadata).toEqual({ generation: "3" });
  });
});
