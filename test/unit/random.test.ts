import { describe, expect, it } from "vitest";
import { fillRandom, randomBytesPooled } from "../../src/crypto/random.js";

describe("random bytes drawn a pool at a time", () => {
  it("hands out each byte once, across refills of the pool", () => {
    // 16-byte draws over several pools of 4096 bytes, and draws that straddle a pool's end.
    const draws = [...Array.from({ length: 1000 }, () => randomBytesPooled(16)), ...Array.from({ length: 100 }, () => randomBytesPooled(97))];
    const seen = new Set(draws.map((d) => d.toString("hex")));
    expect(seen.size).toBe(draws.length);
    // Not a constant pattern: the bits of all draws are about half ones.
    const ones = draws.reduce((sum, d) => sum + [...d].reduce((s, b) => s + b.toString(2).replaceAll("0", "").length, 0), 0);
    const bits = draws.reduce((sum, d) => sum + d.length * 8, 0);
    expect(ones / bits).toBeGreaterThan(0.48);
    expect(ones / bits).toBeLessThan(0.52);
  });

  it("fills the asked part of a buffer only, and refuses draws larger than 256 bytes", () => {
    const into = Buffer.alloc(32);
    fillRandom(into, 8, 16);
    expect(into.subarray(0, 8).equals(Buffer.alloc(8))).toBe(true);
    expect(into.subarray(24).equals(Buffer.alloc(8))).toBe(true);
    expect(into.subarray(8, 24).equals(Buffer.alloc(16))).toBe(false);
    expect(() => randomBytesPooled(257)).toThrow(/at most 256 bytes/);
  });
});
