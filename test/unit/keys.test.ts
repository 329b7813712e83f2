import { randomBytes, randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { DEFAULT_KEY_RULES, estimatedEntropyBits, keyEntropy, MIN_ENTROPY_BITS_FLOOR, validateKey } from "../../src/contract/keys.js";
import { ulid, uuidv7 } from "../support/keys.js";
import { expectReason } from "../support/refusals.js";

const ADVICE = /send a UUIDv4 or 128 random bits/;
const log2 = Math.log2;

/** The keys of `make` (count of them) that validateKey refuses. */
function refusedAmong(count: number, make: () => string): string[] {
  const refused: string[] = [];
  for (let i = 0; i < count; i++) {
    const key = make();
    try {
      validateKey(key);
    } catch {
      refused.push(key);
    }
  }
  return refused;
}

describe("validateKey: accepted keys", () => {
  it("has the documented defaults and floor", () => {
    expect(DEFAULT_KEY_RULES).toEqual({ minLength: 16, maxLength: 255, minEntropyBits: 96 });
    expect(Object.isFrozen(DEFAULT_KEY_RULES)).toBe(true);
    expect(MIN_ENTROPY_BITS_FLOOR).toBe(64);
  });

  it.each([
    "f47ac10b-58cc-4372-a567-0e02b2c3d479",
    "9b2d6c1e-3f4a-4b8e-9c7d-2a1f0e5d4c3b",
    "F47AC10B-58CC-4372-A567-0E02B2C3D479",
    "01932c07-1b2f-7c3e-9a4d-5e6f7a8b9c0d",
    "01ARZ3NDEKTSV4RRFFQ69G5FAV",
    "01jd2y6zq0b8c9d7e5f3g1h2k4",
    "3f9a0c7e1b5d8246a0c9d1e2f3a4b5c6",
    "q8Zt1_Vx3Lk9-Pw2Rm7Ns4",
  ])("accepts %s", (key) => {
    expect(() => validateKey(key)).not.toThrow();
  });

  it("accepts 2000 random UUIDv4s, in lower and upper case", () => {
    expect(refusedAmong(2000, randomUUID)).toEqual([]);
    expect(refusedAmong(500, () => randomUUID().toUpperCase())).toEqual([]);
  });

  it("accepts 2000 UUIDv7s, whose first 48 bits are a timestamp", () => {
    const sample = uuidv7();
    expect(sample).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(parseInt(sample.replace(/-/g, "").slice(0, 12), 16)).toBeLessThanOrEqual(Date.now());
    expect(refusedAmong(2000, uuidv7)).toEqual([]);
  });

  it("accepts 2000 ULIDs, whose first 10 characters are a timestamp, in upper and lower case", () => {
    const sample = ulid();
    expect(sample).toMatch(/^[0-7][0-9A-HJKMNP-TV-Z]{25}$/);
    expect(refusedAmong(2000, ulid)).toEqual([]);
    expect(refusedAmong(500, () => ulid().toLowerCase())).toEqual([]);
  });

  it("accepts 2000 keys of 128 random bits in base64url and in hex", () => {
    expect(refusedAmong(2000, () => randomBytes(16).toString("base64url"))).toEqual([]);
    expect(refusedAmong(2000, () => randomBytes(16).toString("hex"))).toEqual([]);
  });

  it.each([
    "order.7Hq2-Zx9_Lm4~Pk8:Rt3Vb6Nc1Jd5",
    "tenant:acme~req_5f2c91ab.e7d3a5f0c2b9d4e1f6a8c3b7",
    `payments:${randomUUID()}`,
    `gate.${randomBytes(16).toString("base64url")}`,
  ])("accepts the punctuation . _ ~ : - in %s", (key) => {
    expect(() => validateKey(key)).not.toThrow();
  });

  it("accepts exactly 16 and exactly 255 characters", () => {
    expect(() => validateKey("Xq7_Lm2-Pz9kRt4W")).not.toThrow();
    const long = randomBytes(192).toString("base64url").slice(0, 255);
    expect(long).toHaveLength(255);
    expect(() => validateKey(long)).not.toThrow();
  });
});

describe("validateKey: refused keys", () => {
  it("refuses the empty key, saying it is missing", () => {
    const error = expectReason(() => validateKey(""), "INVALID_KEY");
    expect(error.message).toMatch(/missing/);
  });

  it("refuses 15 characters and 256 characters", () => {
    const fifteen = "Xq7_Lm2-Pz9kRt4";
    expect(fifteen).toHaveLength(15);
    expect(expectReason(() => validateKey(fifteen), "INVALID_KEY").message).toMatch(/15 characters/);
    const long = randomBytes(192).toString("base64url");
    expect(long).toHaveLength(256);
    expect(expectReason(() => validateKey(long), "INVALID_KEY").message).toMatch(/256 characters/);
  });

  it("refuses a key that looks like an e-mail address", () => {
    const error = expectReason(() => validateKey("alice.smith@example.com"), "INVALID_KEY");
    expect(error.message).toMatch(/e-mail/);
  });

  it.each([
    ["a space", "3f9a0c7e 1b5d8246x"],
    ["a tab", "3f9a0c7e\t1b5d8246x"],
    ["a newline", "3f9a0c7e1b5d8246\n"],
    ["a control character", "3f9a0c7e\u00011b5d8246"],
    ["a DEL character", "3f9a0c7e\u007f1b5d8246"],
    ["a zero-width space", "3f9a0c7e\u200b1b5d8246"],
    ["a no-break space", "3f9a0c7e\u00a01b5d8246"],
  ])("refuses %s", (_label, key) => {
    expectReason(() => validateKey(key), "INVALID_KEY");
  });

  it.each([
    ["non-ASCII letters", "schlüssel-ändern-größe"],
    ["Cyrillic letters", "ключидемпотентности"],
    ["an emoji", "3f9a0c7e1b5d8246😀"],
    ["'/'", "3f9a0c7e/1b5d8246"],
    ["'+'", "3f9a0c7e+1b5d8246"],
    ["'='", "3f9a0c7e1b5d8246=="],
    ["'%'", "3f9a0c7e%201b5d8246"],
  ])("refuses %s", (_label, key) => {
    const error = expectReason(() => validateKey(key), "INVALID_KEY");
    expect(error.message).toMatch(/may only contain/);
  });

  it.each([
    ["a counter", "order-0000000001"],
    ["a counter without separator", "ORDER00000000000000000000000042"],
    ["a counter in a long key", "invoice-000000000000000000000123"],
    ["an ISO timestamp", "2026-11-30T10:00:00"],
    ["an ISO timestamp with fraction and zone", "2026-11-30T10:00:00.123456Z"],
    ["a compact timestamp", "20261130T100000Z"],
    ["a timestamp and a counter", "2026-11-30T10:00:00.000000Z-0000000000000001"],
    ["a dated order number", "order-2026-11-30-000042"],
    ["a day-first date", "invoice-30.11.2026-0042"],
    ["an epoch time in microseconds", "1732958400123456"],
    ["the alphabet", "abcdefghijklmnop"],
    ["the alphabet and the digits", "abcdefghijklmnopqrstuvwxyz0123456789"],
    ["a descending run", "zyxwvutsrqponmlk"],
    ["a keyboard row", "qwertyuiopasdfgh"],
    ["the hex digits in order", "0123456789abcdef"],
    ["one repeated character", "aaaaaaaaaaaaaaaa"],
    ["zeros and a one", "0000000000000001"],
    ["a repeated pair", "abababababababab"],
    ["a repeated block", "a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4"],
    ["two runs", "1111111111112222"],
    ["a short random hex key (64 bits)", "3f9a0c7e1b5d8246"],
    ["a short random decimal key", "48392017463829104756"],
  ])("refuses %s (%s) with INVALID_KEY and says what to send instead", (_label, key) => {
    const error = expectReason(() => validateKey(key), "INVALID_KEY");
    expect(error.message).toMatch(/too predictable/);
    expect(error.message).toMatch(ADVICE);
    expect(error.metadata).toEqual({ min_entropy_bits: "96" });
  });

  it("names what it recognised, or how many characters the alphabet needs", () => {
    expect(expectReason(() => validateKey("2026-11-30T10:00:00"), "INVALID_KEY").message).toMatch(/it contains a date and a time/);
    expect(expectReason(() => validateKey("order-0000000001"), "INVALID_KEY").message).toMatch(/repeated characters/);
    expect(expectReason(() => validateKey("3f9a0c7e1b5d8246"), "INVALID_KEY").message).toMatch(/16 hex characters carry 64 bits; 96 take 24/);
  });

  it("applies a lowered entropy floor: short random keys pass, counters and dates still fail", () => {
    const lowered = { ...DEFAULT_KEY_RULES, minEntropyBits: MIN_ENTROPY_BITS_FLOOR };
    expect(() => validateKey("3f9a0c7e1b5d8246", lowered)).not.toThrow();
    for (const key of ["order-0000000001", "2026-11-30T10:00:00", "order-2026-11-30-000042", "ORD-20261130-4839", "abcdefghijklmnop"]) {
      expect(expectReason(() => validateKey(key, lowered), "INVALID_KEY").metadata, key).toEqual({ min_entropy_bits: "64" });
    }
  });

  it("applies tightened policy rules", () => {
    const strict = { minLength: 32, maxLength: 64, minEntropyBits: 120 };
    const twentyTwo = "q8Zt1_Vx3Lk9-Pw2Rm7Ns4";
    expect(() => validateKey(twentyTwo)).not.toThrow();
    expectReason(() => validateKey(twentyTwo, strict), "INVALID_KEY");
    // A UUIDv4 (36 characters) meets the stricter rules.
    expect(() => validateKey("f47ac10b-58cc-4372-a567-0e02b2c3d479", strict)).not.toThrow();
    // Too long for maxLength 64.
    expectReason(() => validateKey(`${randomUUID()}${randomUUID()}`, strict), "INVALID_KEY");
  });

  it("accepts a key at exactly the entropy floor (96 bits is not below 96)", () => {
    expect(estimatedEntropyBits("Xq7_Lm2-Pz9kRt4W")).toBe(96);
    expect(() => validateKey("Xq7_Lm2-Pz9kRt4W")).not.toThrow();
    expectReason(() => validateKey("Xq7_Lm2-Pz9kRt4W", { ...DEFAULT_KEY_RULES, minEntropyBits: 97 }), "INVALID_KEY");
  });
});

/** Asserts keyEntropy(key) to 9 decimals of bits, and its other facts exactly. */
function expectEntropy(key: string, expected: { bits: number } & Partial<Omit<ReturnType<typeof keyEntropy>, "bits">>): void {
  const { bits, ...facts } = expected;
  const actual = keyEntropy(key);
  expect(actual.bits, key).toBeCloseTo(bits, 9);
  expect(actual, key).toMatchObject(facts);
}

describe("keyEntropy: the worked examples of docs/policies.md", () => {
  it("reads each key in the smallest alphabet that spells it", () => {
    expectEntropy("48392017463829104756", { alphabet: "decimal", bits: 20 * log2(10), structure: [] });
    expectEntropy("3f9a0c7e1b5d8246", { alphabet: "hex", bits: 64, structure: [] });
    expectEntropy("01ARZ3NDEKTSV4RRFFQ69G5FAV", { alphabet: "Crockford base32", bits: 130, structure: [] });
    expectEntropy("tenant:acme~req_5f2c91ab.e7d3a5f0c2b9d4e1f6a8c3b7", { alphabet: "Crockford base32", bits: 45 * 5 });
    expectEntropy("ORDERNUMBERXYZ42", { alphabet: "base36", bits: 16 * log2(36) });
    expectEntropy("q8Zt1Vx3Lk9Pw2Rm7Ns4", { alphabet: "base62", bits: 20 * log2(62) });
    expectEntropy("q8Zt1_Vx3Lk9-Pw2Rm7Ns4", { alphabet: "base64url", bits: 22 * 6 });
  });

  it("counts - and _ only in keys with both cases, and never . ~ :", () => {
    expectEntropy("f47ac10b-58cc-4372-a567-0e02b2c3d479", { alphabet: "hex", characters: 32, bits: 128 });
    expect(keyEntropy("F47AC10B-58CC-4372-A567-0E02B2C3D479").bits).toBe(128);
    expectEntropy("Xq7_Lm2-Pz9kRt4W", { alphabet: "base64url", characters: 16, bits: 96 });
    expect(keyEntropy("Xq7.Lm2~Pz9kRt4W:")).toMatchObject({ alphabet: "base62", characters: 14 });
  });

  it("charges a date and a time what they carry plus where they are", () => {
    // 15 characters, Crockford base32; the date and the time replace all of them.
    expectEntropy("2026-11-30T10:00:00", { bits: 16 + log2(15) + 17 + log2(15), structure: ["date", "time"] });
  });

  it("charges a run where it starts and how long it is, the first character keeping its bits", () => {
    // hex, 16 characters: "a", then 15 repeats of it.
    expectEntropy("aaaaaaaaaaaaaaaa", { bits: 4 + log2(16) + log2(15), structure: ["repetition"] });
    // base36, 16 characters: "a", then 15 characters each one after the one before.
    expectEntropy("abcdefghijklmnop", { bits: log2(36) + log2(16) + log2(15), structure: ["sequence"] });
    // base36, 15 characters: "order", then 10 digits read as decimal, of which 8 repeat the first zero.
    expectEntropy("order-0000000001", {
      bits: 5 * log2(36) + 2 * log2(10) + log2(15) + log2(8),
      structure: ["repetition", "decimal number"],
    });
  });

  it("leaves runs too short to count as they are", () => {
    expect(keyEntropy("Ab3aaa7Qw9ZrXy2K").structure).toEqual([]);
    expect(keyEntropy("Ab3abc7Qw9ZrXy2K").structure).toEqual([]);
  });

  it("matches structure case-insensitively", () => {
    expect(keyEntropy("AbCdEfGhIjKlMnOp").structure).toEqual(["sequence"]);
    expect(keyEntropy("aAaAaAaAaAaAaAaA").structure).toEqual(["repetition"]);
  });
});
