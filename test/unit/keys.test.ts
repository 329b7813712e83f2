import { randomBytes, randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { DEFAULT_KEY_RULES, estimatedEntropyBits, validateKey } from "../../src/contract/keys.js";
import { expectReason } from "../support/refusals.js";


const CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/** A ULID-like string: 26 characters of Crockford base32. */
function ulidLike(): string {
  return Array.from(randomBytes(26), (b) => CROCKFORD[b % 32]).join("");
}

describe("validateKey: accepted keys", () => {
  it("has the documented defaults", () => {
    expect(DEFAULT_KEY_RULES).toEqual({ minLength: 16, maxLength: 255, minEntropyBits: 24 });
    expect(Object.isFrozen(DEFAULT_KEY_RULES)).toBe(true);
  });

  it.each([
    "f47ac10b-58cc-4372-a567-0e02b2c3d479",
    "9b2d6c1e-3f4a-4b8e-9c7d-2a1f0e5d4c3b",
  ])("accepts the UUIDv4 %s", (key) => {
    expect(() => validateKey(key)).not.toThrow();
  });

  it("accepts freshly generated UUIDv4s", () => {
    for (let i = 0; i < 200; i++) {
      const key = randomUUID();
      expect(() => validateKey(key), key).not.toThrow();
    }
  });

  it("accepts ULID-like 26-character base32 strings", () => {
    expect(() => validateKey("01ARZ3NDEKTSV4RRFFQ69G5FAV")).not.toThrow();
    expect(() => validateKey("01HZX3Q8V7K2M9N4P6R5T1W0YS")).not.toThrow();
    for (let i = 0; i < 200; i++) {
      const key = ulidLike();
      expect(key).toHaveLength(26);
      expect(() => validateKey(key), key).not.toThrow();
    }
  });

  it("accepts 16-character random hex", () => {
    expect(() => validateKey("3f9a0c7e1b5d8246")).not.toThrow();
    expect(() => validateKey("0123456789abcdef")).not.toThrow();
  });

  it.each([
    "order.7Hq2-Zx9_Lm4~Pk8:Rt3",
    "a1.b2_c3~d4:e5-f6g7h8",
    "tenant:acme~req_5f2c-91ab.e7d3",
    "Ab3._~:-Xy7Qw9Zr",
  ])("accepts the punctuation . _ ~ : - in %s", (key) => {
    expect(() => validateKey(key)).not.toThrow();
  });

  it("accepts exactly 16 and exactly 255 characters", () => {
    const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~:-";
    const long = Array.from({ length: 255 }, (_, i) => alphabet[(i * 7) % alphabet.length]).join("");
    expect(long).toHaveLength(255);
    expect(() => validateKey(long)).not.toThrow();
    expect(() => validateKey("0123456789abcdef")).not.toThrow();
  });

  it("does not refuse 1000 random 16-character hex keys, the shortest common random keys", () => {
    // A random key falls under the 24-bit floor about once in 10^8 (see keys.ts).
    const refused: string[] = [];
    for (let i = 0; i < 1000; i++) {
      const key = randomBytes(8).toString("hex");
      try {
        validateKey(key);
      } catch {
        refused.push(key);
      }
    }
    expect(refused).toEqual([]);
  });
});

describe("validateKey: refused keys", () => {
  it("refuses the empty key, saying it is missing", () => {
    const error = expectReason(() => validateKey(""), "INVALID_KEY");
    expect(error.message).toMatch(/missing/);
  });

  it("refuses 15 characters and 256 characters", () => {
    const fifteen = "3f9a0c7e1b5d824";
    expect(fifteen).toHaveLength(15);
    expect(expectReason(() => validateKey(fifteen), "INVALID_KEY").message).toMatch(/15 characters/);
    const long = "0123456789abcdef".repeat(16);
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

  it.each(["aaaaaaaaaaaaaaaa", "0000000000000001", "abababababababab", "1111111111112222", "aaaaaaaabbbbbbbb"])(
    "refuses the low-variety key %s",
    (key) => {
      expect(key).toHaveLength(16);
      const error = expectReason(() => validateKey(key), "INVALID_KEY");
      expect(error.message).toMatch(/variety/);
    },
  );

  it("accepts a key at exactly the entropy floor (24 bits is not below 24)", () => {
    expect(estimatedEntropyBits("1111111122223333")).toBe(24);
    expect(() => validateKey("1111111122223333")).not.toThrow();
  });

  it("applies tightened policy rules", () => {
    const strict = { minLength: 32, maxLength: 64, minEntropyBits: 64 };
    const twenty = "3f9a0c7e1b5d8246a0c9";
    expect(twenty).toHaveLength(20);
    expect(() => validateKey(twenty)).not.toThrow();
    expectReason(() => validateKey(twenty, strict), "INVALID_KEY");
    // A UUIDv4 (36 characters) meets the stricter rules.
    expect(() => validateKey("f47ac10b-58cc-4372-a567-0e02b2c3d479", strict)).not.toThrow();
    // Too long for maxLength 64.
    expectReason(() => validateKey(`${randomUUID()}${randomUUID()}`, strict), "INVALID_KEY");
  });

  it("applies a tightened entropy floor", () => {
    const key = "0123456789abcdef"; // exactly 64 bits
    expect(() => validateKey(key, { ...DEFAULT_KEY_RULES, minEntropyBits: 64 })).not.toThrow();
    expectReason(() => validateKey(key, { ...DEFAULT_KEY_RULES, minEntropyBits: 65 }), "INVALID_KEY");
  });
});

describe("estimatedEntropyBits", () => {
  it("is 0 for the empty string and for a single repeated character", () => {
    expect(estimatedEntropyBits("")).toBe(0);
    expect(estimatedEntropyBits("a")).toBe(0);
    expect(estimatedEntropyBits("aaaaaaaaaaaaaaaa")).toBe(0);
  });

  it("is exactly 64 for 16 distinct characters each once (16 * log2 16)", () => {
    expect(estimatedEntropyBits("0123456789abcdef")).toBe(64);
  });

  it("is length times Shannon entropy of the character frequencies", () => {
    expect(estimatedEntropyBits("ab")).toBe(2);
    expect(estimatedEntropyBits("abababababababab")).toBe(16);
    expect(estimatedEntropyBits("abcd")).toBe(8);
    // 15 zeros and one 1: 16 * -(15/16 log2 15/16 + 1/16 log2 1/16) ≈ 5.4
    const expected = -16 * ((15 / 16) * Math.log2(15 / 16) + (1 / 16) * Math.log2(1 / 16));
    expect(estimatedEntropyBits("0000000000000001")).toBeCloseTo(expected, 10);
    expect(estimatedEntropyBits("0000000000000001")).toBeCloseTo(5.4, 1);
  });

  it("does not depend on character order", () => {
    expect(estimatedEntropyBits("aabbcc")).toBeCloseTo(estimatedEntropyBits("abcabc"), 12);
    expect(estimatedEntropyBits("aabbcc")).toBeCloseTo(6 * Math.log2(3), 12);
  });
});
