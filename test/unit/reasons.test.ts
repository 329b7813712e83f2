import { describe, expect, it } from "vitest";
import { IdempotencyError, REASONS, refuse } from "../../src/contract/errors.js";
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
    const byNumber = protoReasonNames().sort(
      (a, b) => (ErrorReason[a as keyof typeof ErrorReason] as number) - (ErrorReason[b as keyof typeof ErrorReason] as number),
    );
    expect([...REASONS]).toEqual(byNumber);
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
