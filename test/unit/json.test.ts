import { describe, expect, it } from "vitest";
import { IdempotencyError } from "../../src/contract/errors.js";
import { canonicalJson, plainDecimal } from "../../src/contract/json-canonical.js";
import { canonicalString, JsonPath, parseStrictJson, type JsonValue } from "../../src/contract/json-parse.js";
import type { FieldSchema, JsonRules } from "../../src/contract/json-schema.js";
import { expectReason } from "../support/refusals.js";

// --- Helpers. ---

const enc = (s: string): Uint8Array => new TextEncoder().encode(s);
const dec = (b: Uint8Array): string => new TextDecoder("utf-8", { fatal: true }).decode(b);

const LIMITS = { maxDepth: 16, maxBytes: 1 << 20 };

function rules(root: FieldSchema, limits: Partial<typeof LIMITS> = {}): JsonRules {
  return { root, ...LIMITS, ...limits };
}

/** The canonical text of `body` under `root`. */
function canon(body: string | Uint8Array, root: FieldSchema, limits: Partial<typeof LIMITS> = {}): string {
  return dec(canonicalJson(typeof body === "string" ? enc(body) : body, rules(root, limits)));
}

/** Asserts a refusal of `body` under `root` at `path`, with message fragments, and returns it. */
function refused(body: string | Uint8Array, root: FieldSchema, path: string, ...fragments: string[]): IdempotencyError {
  return refusedWith(body, root, {}, path, ...fragments);
}

function refusedWith(body: string | Uint8Array, root: FieldSchema, limits: Partial<typeof LIMITS>, path: string, ...fragments: string[]): IdempotencyError {
  const error = expectReason(() => canonicalJson(typeof body === "string" ? enc(body) : body, rules(root, limits)), "INVALID_PAYLOAD");
  expect(error.metadata).toEqual({ path });
  expect(error.message).toContain(path);
  for (const fragment of fragments) expect(error.message).toContain(fragment);
  return error;
}

/** Parse-level refusal (no schema involved). */
function parseRefused(body: string | Uint8Array, path: string, ...fragments: string[]): IdempotencyError {
  const error = expectReason(() => parseStrictJson(typeof body === "string" ? enc(body) : body, LIMITS), "INVALID_PAYLOAD");
  expect(error.metadata).toEqual({ path });
  for (const fragment of fragments) expect(error.message).toContain(fragment);
  return error;
}

/** A plain view of the syntax tree, paths as strings. */
function view(value: JsonValue): unknown {
  switch (value.kind) {
    case "object":
      return {
        kind: "object",
        path: value.path.toString(),
        members: value.members.map((m) => [m.name, view(m.value)]),
      };
    case "array":
      return { kind: "array", path: value.path.toString(), elements: value.elements.map(view) };
    case "number":
      return { kind: "number", path: value.path.toString(), text: value.text };
    case "null":
      return { kind: "null", path: value.path.toString() };
    default:
      return { kind: value.kind, path: value.path.toString(), value: value.value };
  }
}

const str: FieldSchema = { type: "string" };
const int: FieldSchema = { type: "integer" };
const num: FieldSchema = { type: "number" };
const bool: FieldSchema = { type: "boolean" };
const dec0: FieldSchema = { type: "decimal" };
const decN: FieldSchema = { type: "decimal", scale: "normalized" };
const obj = (properties: Record<string, FieldSchema>, extra: Partial<FieldSchema> = {}): FieldSchema => ({
  type: "object",
  properties,
  ...extra,
});
const arr = (items: FieldSchema | undefined, extra: Partial<FieldSchema> = {}): FieldSchema =>
  items === undefined ? { type: "array", ...extra } : { type: "array", items, ...extra };

/** A permissive-enough schema for parser-level tests through canonicalJson. */
const payment = obj({
  amount: { type: "decimal", required: true },
  currency: { type: "string", required: true },
  note: { type: "string", fingerprint: false, nullable: true },
  items: arr(obj({ sku: str, qty: int })),
  tags: arr(str, { set: true }),
  meta: obj({ a: int, b: obj({ c: bool }) }),
});

// --- Paths. ---

describe("JsonPath", () => {
  it("writes the root, members, indexes and bracketed names", () => {
    expect(JsonPath.root.toString()).toBe("$");
    expect(JsonPath.root.member("amount").toString()).toBe("$.amount");
    expect(JsonPath.root.member("items").index(2).member("sku").toString()).toBe("$.items[2].sku");
    expect(JsonPath.root.member("_x9").toString()).toBe("$._x9");
    expect(JsonPath.root.member("weird name").toString()).toBe('$["weird name"]');
    expect(JsonPath.root.member("9lives").toString()).toBe('$["9lives"]');
    expect(JsonPath.root.member("").toString()).toBe('$[""]');
    expect(JsonPath.root.member('a"b\\c\n').toString()).toBe('$["a\\"b\\\\c\\n"]');
    expect(JsonPath.root.member("é").member("x-y").toString()).toBe('$["é"]["x-y"]');
  });
});

// --- Parsing. ---

describe("parseStrictJson: the syntax tree", () => {
  it("keeps number text, member order and unescaped names, and reports paths", () => {
    const tree = parseStrictJson(enc('{"b": 10.0, "a\\u0020b": [1E2, -0, {"sku": "x"}], "c": true, "d": null, "e": "\\"q\\""}'), LIMITS);
    expect(view(tree)).toEqual({
      kind: "object",
      path: "$",
      members: [
        ["b", { kind: "number", path: "$.b", text: "10.0" }],
        [
          "a b",
          {
            kind: "array",
            path: '$["a b"]',
            elements: [
              { kind: "number", path: '$["a b"][0]', text: "1E2" },
              { kind: "number", path: '$["a b"][1]', text: "-0" },
              {
                kind: "object",
                path: '$["a b"][2]',
                members: [["sku", { kind: "string", path: '$["a b"][2].sku', value: "x" }]],
              },
            ],
          },
        ],
        ["c", { kind: "boolean", path: "$.c", value: true }],
        ["d", { kind: "null", path: "$.d" }],
        ["e", { kind: "string", path: "$.e", value: '"q"' }],
      ],
    });
  });

  it("accepts every scalar at the top level and RFC 8259 whitespace around tokens", () => {
    expect(view(parseStrictJson(enc(" \t\r\n42\n"), LIMITS))).toEqual({ kind: "number", path: "$", text: "42" });
    expect(view(parseStrictJson(enc('"x"'), LIMITS))).toEqual({ kind: "string", path: "$", value: "x" });
    expect(view(parseStrictJson(enc("false"), LIMITS))).toEqual({ kind: "boolean", path: "$", value: false });
    expect(view(parseStrictJson(enc("null"), LIMITS))).toEqual({ kind: "null", path: "$" });
    expect(view(parseStrictJson(enc("[ ]"), LIMITS))).toEqual({ kind: "array", path: "$", elements: [] });
    expect(view(parseStrictJson(enc("{\n}"), LIMITS))).toEqual({ kind: "object", path: "$", members: [] });
    const spaced = parseStrictJson(enc(' { "a" \t:\r\n [ 1 , 2 ] } '), LIMITS);
    expect(view(spaced)).toEqual(view(parseStrictJson(enc('{"a":[1,2]}'), LIMITS)));
  });

  it("accepts every valid number form", () => {
    for (const text of ["0", "-0", "1", "-1", "10", "0.5", "-0.5", "1e5", "1E5", "1e+5", "1e-5", "1.25E-07", "1e-400"]) {
      expect(view(parseStrictJson(enc(text), LIMITS))).toEqual({ kind: "number", path: "$", text });
    }
  });

  it("unescapes every escape, including surrogate pairs", () => {
    const tree = parseStrictJson(enc('"\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u0041 \\u00e9 \\uD83D\\uDE00 é😀"'), LIMITS);
    expect(tree).toMatchObject({ kind: "string", value: '" \\ / \b \f \n \r \t A é 😀 é😀' });
  });

  it("accepts a body of exactly maxBytes and nesting of exactly maxDepth", () => {
    expect(parseStrictJson(enc("[1]"), { maxDepth: 1, maxBytes: 3 })).toMatchObject({ kind: "array" });
    expect(parseStrictJson(enc('{"a":{}}'), { maxDepth: 2, maxBytes: 100 })).toMatchObject({ kind: "object" });
    expect(parseStrictJson(enc("7"), { maxDepth: 0, maxBytes: 100 })).toMatchObject({ kind: "number", text: "7" });
  });

  it("parses very deep nesting without recursion when the limit allows it", () => {
    const depth = 100_000;
    const body = enc(`${"[".repeat(depth)}${"]".repeat(depth)}`);
    let node = parseStrictJson(body, { maxDepth: depth, maxBytes: body.byteLength });
    let levels = 1;
    while (node.kind === "array" && node.elements[0] !== undefined) {
      node = node.elements[0];
      levels++;
    }
    expect(levels).toBe(depth);
    expect(node.path.toString()).toBe(`$${"[0]".repeat(depth - 1)}`);
  });
});

describe("parseStrictJson: refusals", () => {
  it("refuses a body larger than maxBytes before decoding it", () => {
    // Invalid UTF-8 too, but the size is checked first.
    const body = new Uint8Array([0x5b, 0xff, 0xff, 0x5d]);
    const error = expectReason(() => parseStrictJson(body, { maxDepth: 4, maxBytes: 3 }), "INVALID_PAYLOAD");
    expect(error.metadata).toEqual({ path: "$" });
    expect(error.message).toContain("4 bytes");
    expect(error.message).toContain("at most 3");
    refusedWith('{"amount":1}', payment, { maxBytes: 11 }, "$", "12 bytes", "at most 11");
  });

  it("refuses a UTF-8 byte order mark", () => {
    parseRefused(new Uint8Array([0xef, 0xbb, 0xbf, 0x31]), "$", "byte order mark");
    refused(new Uint8Array([0xef, 0xbb, 0xbf, ...enc('{"amount":1,"currency":"EUR"}')]), payment, "$", "byte order mark");
    // Not whitespace elsewhere either.
    parseRefused("1\uFEFF", "$", "after the top-level value");
    parseRefused("[\uFEFF1]", "$[0]", "expected a JSON value");
  });

  it.each([
    ["an overlong '/'", [0xc0, 0xaf]],
    ["an overlong NUL", [0xc0, 0x80]],
    ["an overlong 3-byte form", [0xe0, 0x80, 0xaf]],
    ["a UTF-8-encoded high surrogate", [0xed, 0xa0, 0x80]],
    ["a UTF-8-encoded low surrogate", [0xed, 0xbf, 0xbf]],
    ["a code point above U+10FFFF", [0xf4, 0x90, 0x80, 0x80]],
    ["a truncated 2-byte sequence", [0xc3]],
    ["a truncated 4-byte sequence", [0xf0, 0x9f, 0x98]],
    ["a stray continuation byte", [0x80]],
    ["an impossible byte", [0xff]],
  ])("refuses invalid UTF-8: %s", (_label, bytes) => {
    const inString = new Uint8Array([...enc('{"currency":"'), ...bytes, ...enc('","amount":1}')]);
    refused(inString, payment, "$", "not valid UTF-8");
    const bare = new Uint8Array([0x5b, ...bytes, 0x5d]);
    parseRefused(bare, "$", "not valid UTF-8");
  });

  it("refuses empty and whitespace-only bodies", () => {
    parseRefused("", "$", "empty");
    parseRefused(" \n\t\r", "$", "empty");
  });

  it.each([
    ["1 2", "2"],
    ["{} {}", "{"],
    ["{}x", "x"],
    ["[]]", "]"],
    ["null,", ","],
    ['"a""b"', '"'],
    ["truex", "x"],
  ])("refuses trailing data after the top-level value: %s", (body, found) => {
    parseRefused(body, "$", "after the top-level value", `unexpected ${JSON.stringify(found)}`, "only whitespace");
  });

  it.each([
    ["single-quoted string", "['a']", "$[0]", "double quotes"],
    ["single-quoted member name", "{'a':1}", "$", "member name in double quotes"],
    ["unquoted member name", "{a:1}", "$", "member name in double quotes"],
    ["trailing comma in an array", "[1,2,]", "$", "trailing comma"],
    ["trailing comma in an object", '{"a":1,}', "$", "trailing comma"],
    ["leading comma", "[,1]", "$[0]", "expected a JSON value"],
    ["double comma", "[1,,2]", "$[1]", "expected a JSON value"],
    ["missing comma", "[1 2]", "$", "expected ',' or ']'"],
    ["missing colon", '{"a" 1}', "$.a", "expected ':'"],
    ["missing member value", '{"a":}', "$.a", "expected a JSON value"],
    ["missing comma between members", '{"a":1 "b":2}', "$", "expected ',' or '}'"],
    ["line comment", "[1 // c\n]", "$", "expected ',' or ']'"],
    ["block comment", "/* c */ 1", "$", "expected a JSON value"],
    ["NaN", "[NaN]", "$[0]", "expected a JSON value"],
    ["Infinity", '{"a":Infinity}', "$.a", "expected a JSON value"],
    ["-Infinity", "-Infinity", "$", "malformed number"],
    ["leading zero", "01", "$", "leading zero"],
    ["negative leading zero", "[-01]", "$[0]", "leading zero"],
    ["no digits after the point", "1.", "$", "malformed number"],
    ["no digits before the point", ".5", "$", "expected a JSON value"],
    ["leading plus", "+1", "$", "no leading '+'"],
    ["lone minus", "-", "$", "malformed number"],
    ["empty exponent", "1e", "$", "malformed number"],
    ["signed empty exponent", "1e+", "$", "malformed number"],
    ["point after exponent", "1e5.0", "$", "malformed number"],
    ["hexadecimal number", "0x10", "$", "after the top-level value"],
    ["unterminated string", '"abc', "$", "unterminated string"],
    ["unterminated array", "[1", "$", "expected ',' or ']'"],
    ["unterminated object", '{"a":1', "$", "expected ',' or '}'"],
    ["unclosed nested array", '{"a":[1}', "$.a", "expected ',' or ']'"],
    ["mismatched brackets", "[}", "$[0]", "expected a JSON value"],
    ["raw NUL in a string", '"a\u0000b"', "$", "unescaped control character U+0000"],
    ["raw tab in a string", '"a\tb"', "$", "unescaped control character U+0009"],
    ["raw LF in a member name", '{"a\nb":1}', "$", "unescaped control character U+000A"],
    ["raw U+001F in a string", '["\u001f"]', "$[0]", "U+001F"],
    ["invalid escape \\x", '"\\x41"', "$", "invalid escape \\x"],
    ["invalid escape \\'", '"\\\'"', "$", "invalid escape \\'"],
    ["invalid escape \\U", '"\\U0041"', "$", "invalid escape \\U"],
    ["short \\u escape", '"\\u12"', "$", "four hexadecimal digits"],
    ["non-hex \\u escape", '"\\u12G4"', "$", "four hexadecimal digits"],
    ["unterminated escape", '"\\', "$", "unterminated escape"],
    ["capitalized literal", "True", "$", "expected a JSON value"],
    ["truncated literal", "[nul]", "$[0]", "expected a JSON value"],
    ["undefined", '{"a":undefined}', "$.a", "expected a JSON value"],
  ])("refuses invalid syntax: %s", (_label, body, path, fragment) => {
    parseRefused(body, path, fragment);
  });

  it("reports a syntax error deep inside a document at its path and byte offset", () => {
    const error = parseRefused('{"items":[{"sku":"a"},{"sku":\'b\'}]}', "$.items[1].sku", "double quotes");
    expect(error.message).toContain("at byte 29");
    // Offsets count bytes, not characters.
    expect(parseRefused('["éé", x]', "$[1]").message).toContain("at byte 9");
  });

  it.each([
    ["a lone high surrogate", '"\\uD800"', "lone high surrogate"],
    ["a high surrogate before a normal character", '"\\uD800x"', "lone high surrogate"],
    ["a high surrogate before a non-surrogate escape", '"\\uD800\\u0041"', "lone high surrogate"],
    ["two high surrogates", '"\\uDBFF\\uDBFF"', "lone high surrogate"],
    ["a high surrogate before a bad escape", '"\\uD800\\n"', "lone high surrogate"],
    ["a lone low surrogate", '"\\uDC00"', "lone low surrogate"],
    ["a low surrogate before a high one", '"\\uDFFF\\uD800"', "lone low surrogate"],
    ["a high surrogate at the end of input", '"\\uD83D', "lone high surrogate"],
  ])("refuses lone surrogate escapes: %s", (_label, body, fragment) => {
    parseRefused(body, "$", fragment);
  });

  it("refuses a lone surrogate in a member value and in a member name at the right path", () => {
    refused('{"currency":"\\uDE00","amount":1}', payment, "$.currency", "lone low surrogate");
    parseRefused('{"a":{"\\uD800":1}}', "$.a", "lone high surrogate");
  });

  it("refuses duplicate member names, equal or escaped, at the duplicate's path", () => {
    refused('{"amount":1,"amount":1,"currency":"EUR"}', payment, "$.amount", 'duplicate member name "amount"');
    parseRefused('{"a":1,"a":2}', "$.a", 'duplicate member name "a"');
    parseRefused('{"a":1,"\\u0061":1}', "$.a", 'duplicate member name "a"');
    parseRefused('{"\\u0061":1,"a":1}', "$.a", "duplicate");
    parseRefused('{"a\\/b":1,"a/b":1}', '$["a/b"]', 'duplicate member name "a/b"');
    parseRefused('{"😀":1,"\\ud83d\\ude00":1}', '$["😀"]', "duplicate");
    parseRefused('{"x":{"a":1,"b":2,"a":3}}', "$.x.a", "duplicate");
    parseRefused('{"items":[{"sku":"a"},{"sku":"b","sku":"b"}]}', "$.items[1].sku", "duplicate");
    parseRefused('{"weird name":1,"weird name":1}', '$["weird name"]', "duplicate");
    // Names differing only in case, or reused in sibling objects, are distinct.
    expect(parseStrictJson(enc('{"a":1,"A":1,"x":{"a":1},"y":{"a":1}}'), LIMITS)).toMatchObject({ kind: "object" });
  });

  it("refuses numbers that overflow a double", () => {
    parseRefused("1e400", "$", "non-finite or overflowing number 1e400");
    parseRefused("-1e400", "$", "non-finite or overflowing number -1e400");
    parseRefused("[1E309]", "$[0]", "non-finite or overflowing");
    parseRefused('{"a":{"b":[0, 1.8e308]}}', "$.a.b[1]", "non-finite or overflowing");
    parseRefused(`1${"0".repeat(400)}`, "$", "non-finite or overflowing");
    refused('{"amount":1e400,"currency":"EUR"}', payment, "$.amount", "non-finite or overflowing number 1e400");
    // Underflow is a finite value (zero), and the largest double is fine.
    expect(parseStrictJson(enc("1.7976931348623157e308"), LIMITS)).toMatchObject({ kind: "number" });
    expect(parseStrictJson(enc("-1e-400"), LIMITS)).toMatchObject({ kind: "number", text: "-1e-400" });
    expect(parseStrictJson(enc("0e99999999999999999999"), LIMITS)).toMatchObject({ kind: "number" });
  });

  it("refuses nesting deeper than maxDepth at the container that exceeds it", () => {
    const limits = { maxDepth: 2, maxBytes: 1000 };
    expect(parseStrictJson(enc('{"a":{}}'), limits)).toMatchObject({ kind: "object" });
    const error = expectReason(() => parseStrictJson(enc('{"a":{"b":[]}}'), limits), "INVALID_PAYLOAD");
    expect(error.metadata).toEqual({ path: "$.a.b" });
    expect(error.message).toContain("deeper than 2");
    const rootOnly = expectReason(() => parseStrictJson(enc("[]"), { maxDepth: 0, maxBytes: 10 }), "INVALID_PAYLOAD");
    expect(rootOnly.metadata).toEqual({ path: "$" });
    refusedWith('[[[["x"]]]]', arr(arr(arr(arr(str)))), { maxDepth: 3 }, "$[0][0][0]", "deeper than 3");
    expect(canon('[[["x"]]]', arr(arr(arr(str))), { maxDepth: 3 })).toBe('[[["x"]]]');
  });

  it("refuses a very deep body over the limit without exhausting the stack", () => {
    const body = enc(`${"[".repeat(500_000)}${"]".repeat(500_000)}`);
    const error = expectReason(() => parseStrictJson(body, { maxDepth: 64, maxBytes: body.byteLength }), "INVALID_PAYLOAD");
    expect(error.metadata.path).toBe(`$${"[0]".repeat(64)}`);
  });
});

// --- Validation. ---

describe("canonicalJson: validation against the schema", () => {
  it("refuses a member the schema does not declare, at its path", () => {
    refused('{"amount":1,"currency":"EUR","extra":true}', payment, "$.extra", "not declared by the schema");
    refused('{"amount":1,"currency":"EUR","meta":{"b":{"d":1}}}', payment, "$.meta.b.d", "not declared", '"c"');
    refused('{"amount":1,"currency":"EUR","items":[{"sku":"a"},{"sku":"b","qty":1,"x":1}]}', payment, "$.items[1].x", "not declared");
    refused('{"amount":1,"currency":"EUR","weird name":1}', payment, '$["weird name"]', "not declared");
    // Inherited object properties are not declarations.
    refused('{"amount":1,"currency":"EUR","constructor":1}', payment, "$.constructor", "not declared");
    refused('{"amount":1,"currency":"EUR","__proto__":1}', payment, "$.__proto__", "not declared");
  });

  it("allows no members in an object schema without properties", () => {
    expect(canon("{}", { type: "object" })).toBe("{}");
    refused('{"a":1}', { type: "object" }, "$.a", "not declared by the schema", "no members");
  });

  it("refuses a missing required member, at the path it should have", () => {
    refused('{"currency":"EUR"}', payment, "$.amount", "required member", "missing", "a decimal");
    refused('{"amount":1,"currency":"EUR","x":{}}', obj({ amount: dec0, currency: str, x: obj({ y: { type: "boolean", required: true } }) }), "$.x.y", "required");
    expect(canon('{"amount":1,"currency":"EUR"}', payment)).toBe('{"amount":1,"currency":"EUR"}');
    // An optional object may be absent even if it has required members.
    expect(canon("{}", obj({ x: obj({ y: { ...bool, required: true } }) }))).toBe("{}");
  });

  it("refuses null unless the schema says nullable", () => {
    refused('{"amount":null,"currency":"EUR"}', payment, "$.amount", "null is not allowed", "a decimal");
    refused("null", payment, "$", "null is not allowed", "an object");
    refused('{"amount":1,"currency":"EUR","items":[null]}', payment, "$.items[0]", "null is not allowed");
    expect(canon('{"amount":1,"currency":"EUR","note":null}', payment)).toBe('{"amount":1,"currency":"EUR"}');
    expect(canon("[null,1]", arr({ type: "integer", nullable: true }))).toBe("[null,1]");
    expect(canon("null", { type: "string", nullable: true })).toBe("null");
  });

  it.each([
    ["a string where an integer is declared", '"1"', int, "found a string", "expected an integer"],
    ["a number where a string is declared", "1", str, "found the number 1", "expected a string"],
    ["a boolean where a number is declared", "true", num, "found true", "expected a number"],
    ["a string where a decimal is declared", '"10.00"', dec0, "found a string", "expected a decimal number"],
    ["a number where a boolean is declared", "0", bool, "found the number 0", "expected a boolean"],
    ["an array where an object is declared", "[]", obj({}), "found an array", "expected an object"],
    ["an object where an array is declared", "{}", arr(str), "found an object", "expected an array"],
    ["a string where an array is declared", '"[]"', arr(str), "found a string", "expected an array"],
    ["an object where a string is declared", "{}", str, "found an object", "expected a string"],
  ])("refuses a type mismatch: %s", (_label, body, schema, found, expected) => {
    refused(body, schema, "$", found, expected);
  });

  it("refuses type mismatches at nested paths", () => {
    refused('{"amount":"1","currency":"EUR"}', payment, "$.amount", "expected a decimal");
    refused('{"amount":1,"currency":"EUR","items":[{"sku":"a","qty":1},{"sku":"b","qty":"2"}]}', payment, "$.items[1].qty", "expected an integer");
    refused('{"amount":1,"currency":"EUR","tags":["a",2]}', payment, "$.tags[1]", "expected a string");
    refused('{"amount":1,"currency":"EUR","meta":{"b":{"c":"yes"}}}', payment, "$.meta.b.c", "expected a boolean");
  });

  it.each([
    ["a fraction", "1.0"],
    ["a zero fraction", "0.0"],
    ["an exponent", "1e2"],
    ["a signed exponent", "1E+2"],
    ["a negative fraction", "-1.5"],
  ])("refuses an integer written with %s", (_label, literal) => {
    refused(`{"q":${literal}}`, obj({ q: int }), "$.q", `the number ${literal}`, "without fraction or exponent");
  });

  it("accepts integers of any magnitude a double's range allows, and refuses beyond it as overflowing", () => {
    const big = `-${"9".repeat(300)}`;
    expect(canon(big, int)).toBe(big);
    refused(`1${"0".repeat(309)}`, int, "$", "non-finite or overflowing");
  });

  it("refuses a decimal whose plain form is longer than 512 characters", () => {
    refused('{"d":1e-600}', obj({ d: dec0 }), "$.d", "overflowing decimal 1e-600", "at most 512 characters");
    const longFraction = `0.${"0".repeat(600)}1`;
    refused(`[${longFraction}]`, arr(decN), "$[0]", "overflowing decimal", "…");
    refused("0e-511", dec0, "$", "overflowing decimal");
    refused("1e-99999999999999999999999", decN, "$", "overflowing decimal");
    // Exactly 512 characters is fine: "0." plus 510 digits.
    expect(canon("1e-510", dec0)).toHaveLength(512);
    expect(canon("-1e-509", dec0)).toHaveLength(512);
    expect(canon("0e-510", dec0)).toBe(`0.${"0".repeat(510)}`);
    // Normalized decimals are limited by their normalized form.
    expect(canon(`1.${"0".repeat(600)}`, decN)).toBe("1");
    refused(`1.${"0".repeat(600)}`, dec0, "$", "overflowing decimal");
    // The same literal is fine as a number.
    expect(canon("1e-600", num)).toBe("0");
  });

  it("refuses any element of an array schema without items", () => {
    expect(canon("[]", arr(undefined))).toBe("[]");
    refused("[1]", arr(undefined), "$[0]", "expected an empty array");
  });

  it("validates each element against items, at its index", () => {
    refused('[1,2,"3"]', arr(int), "$[2]", "expected an integer");
    refused("[[1],[2,true]]", arr(arr(int)), "$[1][1]", "found true");
  });

  it("refuses equal elements in a set, by canonical form", () => {
    refused('{"amount":1,"currency":"EUR","tags":["a","b","a"]}', payment, "$.tags[2]", "duplicate", "$.tags[0]", "distinct");
    refused('["\\u0061","a"]', arr(str, { set: true }), "$[1]", "duplicate of element $[0]");
    refused("[1.0, 1]", arr(num, { set: true }), "$[1]", "duplicate");
    refused("[1.50, 1.5]", arr(decN, { set: true }), "$[1]", "duplicate");
    refused("[0, -0]", arr(int, { set: true }), "$[1]", "duplicate");
    refused('[{"a":1,"b":2},{"b":2,"a":1}]', arr(obj({ a: int, b: int }), { set: true }), "$[1]", "duplicate");
    // Elements that differ only in members left out of the fingerprint are equal.
    refused('[{"a":1,"n":"x"},{"a":1,"n":"y"}]', arr(obj({ a: int, n: { type: "string", fingerprint: false } }), { set: true }), "$[1]", "duplicate");
    // Significant decimals differ by scale, so they are distinct.
    expect(canon("[1.50, 1.5]", arr(dec0, { set: true }))).toBe("[1.5,1.50]");
    // Lists may repeat.
    expect(canon('["a","a"]', arr(str))).toBe('["a","a"]');
  });

  it("validates members left out of the fingerprint", () => {
    refused('{"amount":1,"currency":"EUR","note":5}', payment, "$.note", "expected a string");
    const schema = obj({ id: int, hidden: obj({ x: int }, { fingerprint: false }) });
    refused('{"id":1,"hidden":{"x":1,"y":2}}', schema, "$.hidden.y", "not declared");
    refused('{"id":1,"hidden":{"x":1.5}}', schema, "$.hidden.x", "expected an integer");
    refused('{"id":1,"hidden":{"x":1e400}}', schema, "$.hidden.x", "non-finite");
    refused('{"id":1}', obj({ id: int, secret: { type: "string", required: true, fingerprint: false } }), "$.secret", "required");
  });

  it("validates a very deep schema without exhausting the stack", () => {
    const depth = 20_000;
    let schema: FieldSchema = int;
    for (let i = 0; i < depth; i++) schema = obj({ a: schema });
    const body = `${'{"a":'.repeat(depth)}7${"}".repeat(depth)}`;
    expect(canon(body, schema, { maxDepth: depth })).toBe(body);
    const bad = `${'{"a":'.repeat(depth)}"7"${"}".repeat(depth)}`;
    const error = expectReason(() => canonicalJson(enc(bad), rules(schema, { maxDepth: depth })), "INVALID_PAYLOAD");
    expect(error.metadata.path).toBe(`$${".a".repeat(depth)}`);
  });
});

// --- Canonical output. ---

describe("canonicalJson: canonical output", () => {
  it("returns UTF-8 bytes without whitespace, members sorted", () => {
    const out = canonicalJson(enc('{ "currency" : "EUR" ,\n "amount" : 12.50 }'), rules(payment));
    expect(out).toBeInstanceOf(Uint8Array);
    expect(dec(out)).toBe('{"amount":12.50,"currency":"EUR"}');
  });

  it("gives the same bytes whatever the member order and whitespace", () => {
    const a = '{"amount":1.5,"currency":"EUR","items":[{"sku":"x","qty":2}],"meta":{"b":{"c":true},"a":1}}';
    const b = '\n{ "meta" : { "a" : 1 , "b" : { "c" : true } } ,\t"items":[ {"qty":2,"sku":"x"} ],"currency":"EUR","amount":1.5 }\r\n';
    expect(canonicalJson(enc(a), rules(payment))).toEqual(canonicalJson(enc(b), rules(payment)));
    expect(canon(b, payment)).toBe('{"amount":1.5,"currency":"EUR","items":[{"qty":2,"sku":"x"}],"meta":{"a":1,"b":{"c":true}}}');
  });

  it("sorts member names by UTF-16 code units (the RFC 8785 example)", () => {
    const names = ["\u20ac", "\r", "\ufb33", "1", "\ud83d\ude00", "\u0080", "\u00f6"];
    const schema = obj(Object.fromEntries(names.map((n) => [n, { type: "string" }])));
    const body = `{${names.map((n, i) => `${JSON.stringify(n)}:"${i}"`).join(",")}}`;
    const order = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\ud83d\ude00", "\ufb33"];
    expect(canon(body, schema)).toBe(`{${order.map((n) => `${canonicalString(n)}:"${names.indexOf(n)}"`).join(",")}}`);
    expect(canon(body, schema)).toContain('{"\\r":"1","1":"3"');
  });

  it("passes the RFC 8785 sample document", () => {
    const schema = obj({
      numbers: arr(num),
      string: str,
      literals: arr({ type: "boolean", nullable: true }),
    });
    const body =
      '{\n  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],\n' +
      '  "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",\n  "literals": [null, true, false]\n}';
    expect(canon(body, schema)).toBe('{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],' + '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}');
  });

  it.each([
    ["1.0", "1"],
    ["1e21", "1e+21"],
    ["1e20", "100000000000000000000"],
    ["0.1", "0.1"],
    ["1e-7", "1e-7"],
    ["0.000001", "0.000001"],
    ["-0", "0"],
    ["-0.0e5", "0"],
    ["9007199254740993", "9007199254740992"],
    ["9007199254740992", "9007199254740992"],
    ["123456789012345680000", "123456789012345680000"],
    ["5e-324", "5e-324"],
    ["1.7976931348623157e308", "1.7976931348623157e+308"],
    ["-1.7976931348623157e308", "-1.7976931348623157e+308"],
    ["295147905179352830000", "295147905179352830000"],
    ["4.35", "4.35"],
    ["0.002", "0.002"],
    ["1e-27", "1e-27"],
    ["-5E-1", "-0.5"],
    ["1e-400", "0"],
  ])("writes the number %s as RFC 8785 does: %s", (literal, expected) => {
    expect(canon(literal, num)).toBe(expected);
  });

  it("keeps integers exactly, beyond 2^53 too", () => {
    expect(canon("9007199254740993", int)).toBe("9007199254740993");
    expect(canon("9007199254740993", int)).not.toBe(canon("9007199254740992", int));
    expect(canon("-12345678901234567890123", int)).toBe("-12345678901234567890123");
    expect(canon("-0", int)).toBe("0");
    expect(canon("0", int)).toBe("0");
  });

  it.each([
    ["10.0", "10.0", "10"],
    ["10", "10", "10"],
    ["1.50", "1.50", "1.5"],
    ["1.5e1", "15", "15"],
    ["1.50e1", "15.0", "15"],
    ["1e-2", "0.01", "0.01"],
    ["0.0", "0.0", "0"],
    ["0", "0", "0"],
    ["0.00", "0.00", "0"],
    ["-0.00", "0.00", "0"],
    ["-0", "0", "0"],
    ["-0e-3", "0.000", "0"],
    ["0e5", "0", "0"],
    ["1.2e+3", "1200", "1200"],
    ["1.2E3", "1200", "1200"],
    ["100", "100", "100"],
    ["1e2", "100", "100"],
    ["-12.340", "-12.340", "-12.34"],
    ["12.34e-5", "0.0001234", "0.0001234"],
    ["0.0100", "0.0100", "0.01"],
    ["120.50e-1", "12.050", "12.05"],
    ["1.000e3", "1000", "1000"],
    ["1.0000e3", "1000.0", "1000"],
    ["9007199254740993.000", "9007199254740993.000", "9007199254740993"],
    ["1e007", "10000000", "10000000"],
    ["5e-0", "5", "5"],
  ])("writes the decimal %s as %s (significant) and %s (normalized)", (literal, significant, normalized) => {
    expect(canon(literal, dec0)).toBe(significant);
    expect(canon(literal, { type: "decimal", scale: "significant" })).toBe(significant);
    expect(canon(literal, decN)).toBe(normalized);
    expect(plainDecimal(literal, "significant")).toBe(significant);
    expect(plainDecimal(literal, "normalized")).toBe(normalized);
  });

  it("distinguishes 10.0 and 10 as significant decimals, not as normalized ones", () => {
    const sig = obj({ amount: dec0 });
    const norm = obj({ amount: decN });
    expect(canonicalJson(enc('{"amount":10.0}'), rules(sig))).not.toEqual(canonicalJson(enc('{"amount":10}'), rules(sig)));
    expect(canonicalJson(enc('{"amount":10.0}'), rules(norm))).toEqual(canonicalJson(enc('{"amount":10}'), rules(norm)));
    expect(canonicalJson(enc('{"amount":10.0}'), rules(norm))).toEqual(canonicalJson(enc('{"amount":1e1}'), rules(norm)));
  });

  it("escapes strings as RFC 8785 does", () => {
    const controls = Array.from({ length: 0x20 }, (_, i) => String.fromCharCode(i)).join("");
    const body = JSON.stringify(`${controls}"\\/ é€😀\u007f\u2028\uffff`);
    const expected =
      '"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u000f' +
      "\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a\\u001b\\u001c\\u001d\\u001e\\u001f" +
      '\\"\\\\/ é€😀\u007f\u2028\uffff"';
    expect(canon(body, str)).toBe(expected);
    expect(canon('"\\/\\u00E9\\uD83D\\uDE00\\u001F"', str)).toBe('"/é😀\\u001f"');
    // Non-ASCII is written as UTF-8 bytes.
    expect(Array.from(canonicalJson(enc('"\\u00e9"'), rules(str)))).toEqual([0x22, 0xc3, 0xa9, 0x22]);
    // Member names are escaped the same way.
    expect(canon('{"a\\tb":"x"}', obj({ "a\tb": str }))).toBe('{"a\\tb":"x"}');
  });

  it("writes literals as they are", () => {
    expect(canon("[true,false]", arr(bool))).toBe("[true,false]");
    expect(canon("true", bool)).toBe("true");
  });

  it("distinguishes null from an absent member unless the schema says nullEqualsAbsent", () => {
    const distinct = obj({ id: int, ref: { type: "string", nullable: true } });
    expect(canon('{"id":1,"ref":null}', distinct)).toBe('{"id":1,"ref":null}');
    expect(canon('{"id":1}', distinct)).toBe('{"id":1}');
    const same = obj({ id: int, ref: { type: "string", nullable: true, nullEqualsAbsent: true } });
    expect(canon('{"id":1,"ref":null}', same)).toBe('{"id":1}');
    expect(canonicalJson(enc('{"id":1,"ref":null}'), rules(same))).toEqual(canonicalJson(enc('{"id":1}'), rules(same)));
    expect(canon('{"id":1,"ref":"x"}', same)).toBe('{"id":1,"ref":"x"}');
    // Without nullable, null stays refused.
    refused('{"id":1,"ref":null}', obj({ id: int, ref: { type: "string", nullEqualsAbsent: true } }), "$.ref", "null is not allowed");
  });

  it("leaves members with fingerprint: false out, whatever their value", () => {
    const schema = obj({
      amount: dec0,
      trace: { type: "object", fingerprint: false, properties: { id: str, at: int } },
      comment: { type: "string", fingerprint: false, nullable: true },
    });
    const expected = '{"amount":5.00}';
    for (const body of [
      '{"amount":5.00}',
      '{"amount":5.00,"comment":"first try"}',
      '{"amount":5.00,"comment":"second try","trace":{"id":"abc","at":1}}',
      '{"trace":{"id":"xyz"},"comment":null,"amount":5.00}',
    ]) {
      expect(canon(body, schema)).toBe(expected);
    }
    expect(canon('{"amount":5.0}', schema)).not.toBe(expected);
  });

  it("sorts sets by canonical UTF-8 bytes and keeps list order", () => {
    expect(canon('["b","a","c"]', arr(str, { set: true }))).toBe('["a","b","c"]');
    expect(canonicalJson(enc('["b","a","c"]'), rules(arr(str, { set: true })))).toEqual(canonicalJson(enc('["c","b","a"]'), rules(arr(str, { set: true }))));
    expect(canon('["b","a","c"]', arr(str))).toBe('["b","a","c"]');
    expect(canonicalJson(enc('["b","a"]'), rules(arr(str)))).not.toEqual(canonicalJson(enc('["a","b"]'), rules(arr(str))));
    // Bytes, not UTF-16: U+FFFF (EF BF BF) sorts before U+1F600 (F0 9F 98 80), and "10" before "9".
    expect(canon('["😀","\\uffff","z"]', arr(str, { set: true }))).toBe('["z","\uffff","😀"]');
    expect(canon("[9,10,-1]", arr(int, { set: true }))).toBe("[-1,10,9]");
    // Elements are compared in canonical form.
    expect(canon('[{"b":1,"a":2},{"a":1,"b":2}]', arr(obj({ a: int, b: int }), { set: true }))).toBe('[{"a":1,"b":2},{"a":2,"b":1}]');
    expect(canon('["b",null,"a"]', arr({ type: "string", nullable: true }, { set: true }))).toBe('["a","b",null]');
  });

  it("canonicalizes nested objects and arrays", () => {
    const schema = obj({
      order: obj({
        lines: arr(obj({ sku: str, qty: int, price: dec0, flags: arr(str, { set: true }) })),
        customer: obj({ id: int, name: str }),
      }),
      total: num,
    });
    const body = `{
      "total": 30.0,
      "order": {
        "customer": {"name": "Zoë", "id": 7},
        "lines": [
          {"qty": 1, "sku": "B", "price": 10.00, "flags": ["gift", "fragile"]},
          {"sku": "A", "flags": [], "price": 2e1, "qty": 1}
        ]
      }
    }`;
    expect(canon(body, schema)).toBe(
      '{"order":{"customer":{"id":7,"name":"Zoë"},"lines":[' +
        '{"flags":["fragile","gift"],"price":10.00,"qty":1,"sku":"B"},' +
        '{"flags":[],"price":20,"qty":1,"sku":"A"}]},"total":30}',
    );
  });

  it("canonicalizes a root array or a root scalar", () => {
    expect(canon(" [ 3 , 1 ] ", arr(int))).toBe("[3,1]");
    expect(canon(' "x" ', str)).toBe('"x"');
    expect(canon("1.50", dec0)).toBe("1.50");
  });

  it("is stable when applied to its own output", () => {
    const body = '{"amount":1.5e1,"currency":"EUR","tags":["b","a"],"note":"x","meta":{"a":-0,"b":{"c":false}}}';
    const once = canonicalJson(enc(body), rules(payment));
    expect(dec(once)).toBe('{"amount":15,"currency":"EUR","meta":{"a":0,"b":{"c":false}},"tags":["a","b"]}');
    expect(canonicalJson(once, rules(payment))).toEqual(once);
  });
});
