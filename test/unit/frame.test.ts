import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { encodeList, fieldBytes, frame, framedDigest, sha256, toHex } from "../../src/contract/frame.js";

const utf8 = (text: string): Uint8Array => new TextEncoder().encode(text);
const hex = (bytes: Uint8Array): string => Buffer.from(bytes).toString("hex");

describe("encodeList", () => {
  it("encodes an empty list as a zero count only", () => {
    expect(hex(encodeList([]))).toBe("00000000");
  });

  it("encodes one empty item as count 1 and length 0", () => {
    expect(hex(encodeList([new Uint8Array(0)]))).toBe("00000001" + "00000000");
  });

  it("lays out u32be count, then u32be length and bytes for each item", () => {
    const encoded = encodeList([utf8("a"), utf8("bc"), new Uint8Array([0x00, 0xff, 0x10])]);
    expect(hex(encoded)).toBe(
      "00000003" + // count
        "00000001" +
        "61" + // "a"
        "00000002" +
        "6263" + // "bc"
        "00000003" +
        "00ff10", // raw bytes
    );
    expect(encoded.byteLength).toBe(4 + (4 + 1) + (4 + 2) + (4 + 3));
  });

  it("writes lengths big-endian (a 258-byte item has length 00000102)", () => {
    const item = new Uint8Array(258).fill(0xab);
    const encoded = encodeList([item]);
    expect(hex(encoded.subarray(0, 8))).toBe("00000001" + "00000102");
    expect(encoded.byteLength).toBe(8 + 258);
    expect(encoded.subarray(8).every((b) => b === 0xab)).toBe(true);
  });

  it("writes a count above 255 big-endian", () => {
    const items = Array.from({ length: 300 }, () => new Uint8Array(0));
    const encoded = encodeList(items);
    expect(hex(encoded.subarray(0, 4))).toBe("0000012c");
    expect(encoded.byteLength).toBe(4 + 300 * 4);
  });

  it("copies only the viewed bytes of a subarray item", () => {
    const backing = new Uint8Array([1, 2, 3, 4, 5, 6]);
    const view = backing.subarray(2, 4);
    expect(hex(encodeList([view]))).toBe("00000001" + "00000002" + "0304");
  });

  it("nests: an encoded list can be an item of another list", () => {
    const inner = encodeList([utf8("x")]);
    expect(hex(encodeList([inner]))).toBe("00000001" + "00000009" + "00000001" + "00000001" + "78");
  });
});

describe("frame", () => {
  it("puts the domain tag first, then the fields", () => {
    expect(hex(frame("d", "ab", "c"))).toBe("00000003" + "00000001" + "64" + "00000002" + "6162" + "00000001" + "63");
  });

  it("is unambiguous when bytes move between adjacent fields", () => {
    const a = frame("d", "ab", "c");
    const b = frame("d", "a", "bc");
    expect(hex(b)).toBe("00000003" + "00000001" + "64" + "00000001" + "61" + "00000002" + "6263");
    expect(hex(a)).not.toBe(hex(b));
    expect(hex(framedDigest("d", "ab", "c"))).not.toBe(hex(framedDigest("d", "a", "bc")));
  });

  it("distinguishes the domain from the first field and field counts", () => {
    expect(hex(frame("da", "b"))).not.toBe(hex(frame("d", "ab")));
    expect(hex(frame("d", "", "x"))).not.toBe(hex(frame("d", "x")));
    expect(hex(frame("d", "x", ""))).not.toBe(hex(frame("d", "x")));
    expect(hex(frame("d"))).toBe("00000001" + "00000001" + "64");
  });

  it("does not confuse separator-like contents with field boundaries", () => {
    expect(hex(frame("d", "a|b", "c"))).not.toBe(hex(frame("d", "a", "b|c")));
    expect(hex(frame("d", "a\u0000b"))).not.toBe(hex(frame("d", "a", "b")));
  });

  it("encodes text as UTF-8", () => {
    // "é" is c3 a9, "€" is e2 82 ac.
    expect(hex(frame("d", "é€"))).toBe("00000002" + "00000001" + "64" + "00000005" + "c3a9e282ac");
  });

  it("encodes numbers and bigints as their decimal text", () => {
    expect(hex(frame("d", 42))).toBe("00000002" + "00000001" + "64" + "00000002" + "3432");
    expect(hex(frame("d", 0))).toBe("00000002" + "00000001" + "64" + "00000001" + "30");
    expect(hex(frame("d", -7))).toBe("00000002" + "00000001" + "64" + "00000002" + "2d37");
    expect(hex(frame("d", 12345678901234567890n))).toBe(hex(frame("d", "12345678901234567890")));
    expect(hex(frame("d", Number.MAX_SAFE_INTEGER))).toBe(hex(frame("d", "9007199254740991")));
    expect(hex(frame("d", 1))).toBe(hex(frame("d", "1")));
  });

  it("passes byte fields through unchanged", () => {
    const bytes = new Uint8Array([0xde, 0xad, 0xbe, 0xef]);
    expect(hex(frame("d", bytes))).toBe("00000002" + "00000001" + "64" + "00000004" + "deadbeef");
    expect(fieldBytes(bytes)).toBe(bytes);
  });

  it("refuses numbers that are not safe integers", () => {
    for (const bad of [1.5, -0.1, Number.MAX_SAFE_INTEGER + 1, 2 ** 53, -(2 ** 53), Number.NaN, Infinity, -Infinity]) {
      expect(() => fieldBytes(bad), String(bad)).toThrow(RangeError);
      expect(() => frame("d", bad), String(bad)).toThrow(/not a safe integer/);
      expect(() => framedDigest("d", bad), String(bad)).toThrow(RangeError);
    }
  });
});

describe("sha256, framedDigest and toHex", () => {
  it("sha256 agrees with node:crypto", () => {
    for (const input of [new Uint8Array(0), utf8("abc"), new Uint8Array(1000).fill(7)]) {
      const expected = createHash("sha256").update(input).digest("hex");
      expect(toHex(sha256(input))).toBe(expected);
    }
    // The well-known vector for "abc".
    expect(toHex(sha256(utf8("abc")))).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  });

  it("framedDigest is SHA-256 of the frame bytes, computed independently", () => {
    const expectedFrame = Buffer.from("00000003" + "00000001" + "64" + "00000002" + "6162" + "00000001" + "63", "hex");
    const expected = createHash("sha256").update(expectedFrame).digest("hex");
    expect(toHex(framedDigest("d", "ab", "c"))).toBe(expected);
    expect(toHex(framedDigest("d", "ab", "c"))).toBe(toHex(sha256(frame("d", "ab", "c"))));
    expect(framedDigest("d", "ab", "c").byteLength).toBe(32);
  });

  it("toHex is lower-case hex and honours subarray offsets", () => {
    const backing = new Uint8Array([0x00, 0xab, 0xcd, 0xef, 0x01]);
    expect(toHex(backing)).toBe("00abcdef01");
    expect(toHex(backing.subarray(1, 3))).toBe("abcd");
    expect(toHex(new Uint8Array(0))).toBe("");
  });
});
