import { describe, expect, it } from "vitest";
import { toHex } from "../../src/contract/frame.js";
import {
  CONTRACT_VERSION,
  scopeDigest,
  validateApiRevision,
  validateOperationName,
  validateSubject,
  validateText,
  type ScopeInput,
  type Subject,
} from "../../src/contract/scope.js";
import { expectReason } from "../support/refusals.js";

const BASE: ScopeInput = {
  subject: { tenant: "acme", principal: "alice" },
  operation: "payments.create",
  apiRevision: 1,
  idempotencyKey: "f47ac10b-58cc-4372-a567-0e02b2c3d479",
};

const digest = (input: ScopeInput): string => toHex(scopeDigest(input));

describe("scopeDigest", () => {
  it("is a deterministic 32-byte digest", () => {
    expect(scopeDigest(BASE).byteLength).toBe(32);
    expect(digest({ ...BASE, subject: { ...BASE.subject } })).toBe(digest(BASE));
  });

  it.each<[string, ScopeInput]>([
    ["tenant", { ...BASE, subject: { tenant: "globex", principal: "alice" } }],
    ["principal", { ...BASE, subject: { tenant: "acme", principal: "bob" } }],
    ["operation", { ...BASE, operation: "payments.refund" }],
    ["apiRevision", { ...BASE, apiRevision: 2 }],
    ["key", { ...BASE, idempotencyKey: "f47ac10b-58cc-4372-a567-0e02b2c3d47a" }],
  ])("differs when only the %s changes", (_field, changed) => {
    expect(digest(changed)).not.toBe(digest(BASE));
  });

  it("does not confuse bytes moved between tenant and principal", () => {
    const a = digest({ ...BASE, subject: { tenant: "acme", principal: "alice" } });
    const b = digest({ ...BASE, subject: { tenant: "acmea", principal: "lice" } });
    expect(a).not.toBe(b);
  });

  it("does not confuse the api revision with a key suffix", () => {
    const a = digest({ ...BASE, apiRevision: 12, idempotencyKey: "3f9a0c7e1b5d8246" });
    const b = digest({ ...BASE, apiRevision: 1, idempotencyKey: "23f9a0c7e1b5d8246" });
    expect(a).not.toBe(b);
  });

  it("is case-sensitive in the key", () => {
    expect(digest({ ...BASE, idempotencyKey: BASE.idempotencyKey.toUpperCase() })).not.toBe(digest(BASE));
  });
});

describe("validateSubject", () => {
  it("returns a valid subject", () => {
    const subject: Subject = { tenant: "acme", principal: "user:alice@example.com" };
    expect(validateSubject(subject)).toBe(subject);
    expect(validateSubject({ tenant: "t".repeat(128), principal: "p".repeat(256) }).tenant).toHaveLength(128);
    expect(validateSubject({ tenant: "Zürich AG", principal: "名前 😀" }).principal).toBe("名前 😀");
  });

  it("refuses a missing subject, naming the field", () => {
    const error = expectReason(() => validateSubject(undefined), "INVALID_REQUEST");
    expect(error.message).toMatch(/subject/);
    expect(expectReason(() => validateSubject(undefined, "owner"), "INVALID_REQUEST").message).toMatch(/owner/);
  });

  it.each<[string, Subject]>([
    ["an empty tenant", { tenant: "", principal: "alice" }],
    ["a tenant over 128 characters", { tenant: "t".repeat(129), principal: "alice" }],
    ["an empty principal", { tenant: "acme", principal: "" }],
    ["a principal over 256 characters", { tenant: "acme", principal: "p".repeat(257) }],
    ["a principal with a control character", { tenant: "acme", principal: "ali\u0001ce" }],
    ["a principal with a newline", { tenant: "acme", principal: "alice\n" }],
    ["a principal with a lone surrogate", { tenant: "acme", principal: "\uD800" }],
    ["a principal with a lone low surrogate", { tenant: "acme", principal: "a\uDC00b" }],
    ["a tenant with a zero-width joiner (format character)", { tenant: "ac\u200Dme", principal: "alice" }],
    ["a tenant with a line separator", { tenant: "ac\u2028me", principal: "alice" }],
    ["a tenant with a DEL", { tenant: "acme\u007f", principal: "alice" }],
  ])("refuses %s with INVALID_REQUEST", (_label, subject) => {
    expectReason(() => validateSubject(subject), "INVALID_REQUEST");
  });

  it("names the offending part in the message", () => {
    expect(expectReason(() => validateSubject({ tenant: "", principal: "a" }), "INVALID_REQUEST").message).toMatch(/subject\.tenant/);
    expect(expectReason(() => validateSubject({ tenant: "a", principal: "\uD800" }), "INVALID_REQUEST").message).toMatch(/subject\.principal/);
  });
});

describe("validateText", () => {
  it("accepts text up to the maximum and refuses one more character", () => {
    expect(() => validateText("abc", "f", 3)).not.toThrow();
    expectReason(() => validateText("abcd", "f", 3), "INVALID_REQUEST");
  });
});

describe("validateOperationName", () => {
  it.each(["payments.create", "payments", "a.b.c", "payments_v2.create_refund", "x1.y2"])("accepts %s", (name) => {
    expect(() => validateOperationName(name)).not.toThrow();
  });

  it("accepts exactly 128 characters and refuses 129", () => {
    expect(() => validateOperationName("a".repeat(128))).not.toThrow();
    expectReason(() => validateOperationName("a".repeat(129)), "INVALID_REQUEST");
  });

  it.each(["Payments.Create", "payments..create", "", "1payments", ".payments", "payments.", "payments.1create", "payments-create", "payments create", "_payments"])(
    "refuses %j with INVALID_REQUEST",
    (name) => {
      expectReason(() => validateOperationName(name), "INVALID_REQUEST");
    },
  );
});

describe("validateApiRevision", () => {
  it.each([1, 2, 65535])("accepts %s", (revision) => {
    expect(() => validateApiRevision(revision)).not.toThrow();
  });

  it.each([0, -1, 65536, 1.5, Number.NaN])("refuses %s with INVALID_REQUEST", (revision) => {
    expectReason(() => validateApiRevision(revision), "INVALID_REQUEST");
  });
});

describe("CONTRACT_VERSION", () => {
  it("is http.idempotency.v1", () => {
    expect(CONTRACT_VERSION).toBe("http.idempotency.v1");
  });
});
