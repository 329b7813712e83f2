import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { IdempotencyError } from "../../src/contract/errors.js";
import { canonicalJson } from "../../src/contract/json-canonical.js";
import { JsonPath, parseStrictJson, type JsonValue } from "../../src/contract/json-parse.js";
import type { FieldSchema, JsonRules } from "../../src/contract/json-schema.js";

// --- A model of documents that keeps number text as written. ---

type Doc =
  { t: "str"; v: string } | { t: "num"; text: string } | { t: "bool"; v: boolean } | { t: "null" } | { t: "obj"; members: Array<[string, Doc]> } | { t: "arr"; items: Doc[] };

const enc = (s: string): Uint8Array => new TextEncoder().encode(s);
const dec = (b: Uint8Array): string => new TextDecoder("utf-8", { fatal: true }).decode(b);
const LIMITS = { maxDepth: 32, maxBytes: 1 << 20 };
const rulesOf = (root: FieldSchema): JsonRules => ({ root, ...LIMITS });

/** A small deterministic PRNG, so that one generated seed drives a whole serialization. */
function prng(seed: number): () => number {
  let state = seed >>> 0 || 1;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 0x1_0000_0000;
  };
}

const SHORT_ESCAPES: Record<string, string> = {
  '"': '\\"',
  "\\": "\\\\",
  "\b": "\\b",
  "\f": "\\f",
  "\n": "\\n",
  "\r": "\\r",
  "\t": "\\t",
};

function u(unit: number, upper: boolean): string {
  const hex = unit.toString(16).padStart(4, "0");
  return `\\u${upper ? hex.toUpperCase() : hex}`;
}

/** A JSON string literal, with randomly chosen (but equivalent) escapes when `rnd` is given. */
function writeString(value: string, rnd?: () => number): string {
  let out = '"';
  for (const ch of value) {
    const code = ch.codePointAt(0) ?? 0;
    const escapeAnyway = rnd !== undefined && rnd() < 0.15;
    if (escapeAnyway) {
      const upper = rnd() < 0.5;
      if (ch === "/") out += "\\/";
      else if (code > 0xffff) out += u(ch.charCodeAt(0), upper) + u(ch.charCodeAt(1), upper);
      else out += u(code, upper);
    } else if (ch in SHORT_ESCAPES) {
      out += SHORT_ESCAPES[ch];
    } else if (code < 0x20) {
      out += u(code, false);
    } else {
      out += ch;
    }
  }
  return `${out}"`;
}

const SPACES = ["", "", "", " ", "\n", "\t", "\r\n", "  "];

/** JSON text for `doc`; with `rnd`, members are shuffled and whitespace is sprinkled. */
function serialize(doc: Doc, rnd?: () => number): string {
  const ws = (): string => (rnd === undefined ? "" : (SPACES[Math.floor(rnd() * SPACES.length)] ?? ""));
  switch (doc.t) {
    case "str":
      return writeString(doc.v, rnd);
    case "num":
      return doc.text;
    case "bool":
      return doc.v ? "true" : "false";
    case "null":
      return "null";
    case "arr":
      return `[${ws()}${doc.items.map((item) => `${serialize(item, rnd)}${ws()}`).join(`,${ws()}`)}]`;
    case "obj": {
      const members = [...doc.members];
      if (rnd !== undefined) {
        for (let i = members.length - 1; i > 0; i--) {
          const j = Math.floor(rnd() * (i + 1));
          [members[i], members[j]] = [members[j]!, members[i]!];
        }
      }
      const parts = members.map(([name, value]) => `${writeString(name, rnd)}${ws()}:${ws()}${serialize(value, rnd)}${ws()}`);
      return `{${ws()}${parts.join(`,${ws()}`)}}`;
    }
  }
}

// --- Generators: a random schema, then a document that matches it. ---

const nameArb = fc.oneof(
  fc.constantFrom("a", "b", "id", "amount", "x_1", "A", "weird name", "é", "😀", "\u0000", 'q"uote', "a/b", "\u20ac"),
  fc.string({ unit: "binary", maxLength: 4 }),
);

const leafSchemaArb: fc.Arbitrary<FieldSchema> = fc.oneof(
  fc.constant<FieldSchema>({ type: "string" }),
  fc.constant<FieldSchema>({ type: "boolean" }),
  fc.constant<FieldSchema>({ type: "integer" }),
  fc.constant<FieldSchema>({ type: "decimal" }),
  fc.constant<FieldSchema>({ type: "decimal", scale: "normalized" }),
  fc.constant<FieldSchema>({ type: "number" }),
);

/** Member flags: mostly fingerprinted, sometimes nullable, required, nullEqualsAbsent. */
const flagsArb = fc.record({
  nullable: fc.boolean(),
  nullEqualsAbsent: fc.boolean(),
  fingerprint: fc.oneof({ weight: 4, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
  required: fc.boolean(),
});

function schemaArb(depth: number): fc.Arbitrary<FieldSchema> {
  if (depth <= 0) return leafSchemaArb;
  const member = fc.tuple(schemaArb(depth - 1), flagsArb).map(([schema, flags]) => ({ ...schema, ...flags }));
  return fc.oneof(
    { weight: 2, arbitrary: leafSchemaArb },
    { weight: 3, arbitrary: objectSchemaArb(member) },
    { weight: 1, arbitrary: schemaArb(depth - 1).map((items): FieldSchema => ({ type: "array", items })) },
    {
      weight: 1,
      arbitrary: fc.constantFrom<FieldSchema>({ type: "string" }, { type: "integer" }).map((items): FieldSchema => ({ type: "array", items, set: true })),
    },
  );
}

function objectSchemaArb(member: fc.Arbitrary<FieldSchema>): fc.Arbitrary<FieldSchema> {
  return fc
    .uniqueArray(fc.tuple(nameArb, member), { maxLength: 5, selector: ([name]) => name })
    .map((entries): FieldSchema => ({ type: "object", properties: Object.fromEntries(entries) }));
}

/** A root object schema with at least one fingerprinted leaf and one member left out of the fingerprint. */
const richRootArb: fc.Arbitrary<FieldSchema> = fc.tuple(schemaArb(3), leafSchemaArb, schemaArb(2), fc.boolean()).map(([extra, anchor, hidden, hiddenRequired]) => ({
  type: "object",
  properties: {
    ...(extra.type === "object" ? extra.properties : { extra }),
    anchor: { ...anchor, required: true },
    hidden: { ...hidden, fingerprint: false, required: hiddenRequired },
  },
}));

const digits = (min: number, max: number): fc.Arbitrary<string> => fc.string({ unit: fc.constantFrom(..."0123456789"), minLength: min, maxLength: max });

/** Any finite JSON number literal, with a bounded exponent. */
const numberTextArb: fc.Arbitrary<string> = fc
  .tuple(
    fc.boolean(),
    fc.oneof(
      fc.constant("0"),
      fc.tuple(fc.constantFrom(..."123456789"), digits(0, 20)).map(([a, b]) => a + b),
    ),
    fc.option(digits(1, 10), { nil: undefined }),
    fc.option(fc.tuple(fc.constantFrom("e", "E"), fc.constantFrom("", "+", "-"), digits(1, 2)), { nil: undefined }),
  )
  .map(([negative, int, frac, exp]) => `${negative ? "-" : ""}${int}${frac === undefined ? "" : `.${frac}`}${exp === undefined ? "" : exp.join("")}`);

const integerTextArb: fc.Arbitrary<string> = fc.oneof(
  { weight: 9, arbitrary: fc.bigInt({ min: -(10n ** 30n), max: 10n ** 30n }).map(String) },
  { weight: 1, arbitrary: fc.constant("-0") },
);

const stringArb: fc.Arbitrary<string> = fc.oneof(
  fc.string({ unit: "binary", maxLength: 8 }),
  fc.string({
    unit: fc.constantFrom("a", "\u0000", "\n", '"', "\\", "/", "\u001f", "\u007f", "é", "😀", "\u2028"),
    maxLength: 6,
  }),
);

function valueArb(schema: FieldSchema): fc.Arbitrary<Doc> {
  const value = nonNullArb(schema);
  return schema.nullable === true ? fc.oneof({ weight: 1, arbitrary: fc.constant<Doc>({ t: "null" }) }, { weight: 3, arbitrary: value }) : value;
}

function nonNullArb(schema: FieldSchema): fc.Arbitrary<Doc> {
  switch (schema.type) {
    case "string":
      return stringArb.map((v): Doc => ({ t: "str", v }));
    case "boolean":
      return fc.boolean().map((v): Doc => ({ t: "bool", v }));
    case "integer":
      return integerTextArb.map((text): Doc => ({ t: "num", text }));
    case "decimal":
    case "number":
      return numberTextArb.map((text): Doc => ({ t: "num", text }));
    case "object": {
      const entries = Object.entries(schema.properties ?? {});
      const memberArbs = entries.map(([name, member]) =>
        member.required === true
          ? valueArb(member).map((v): [string, Doc] | undefined => [name, v])
          : fc.option(
              valueArb(member).map((v): [string, Doc] => [name, v]),
              { nil: undefined },
            ),
      );
      return fc.tuple(...memberArbs).map((members): Doc => ({ t: "obj", members: members.filter((m): m is [string, Doc] => m !== undefined) }));
    }
    case "array": {
      const items = schema.items;
      if (items === undefined) return fc.constant<Doc>({ t: "arr", items: [] });
      if (schema.set === true) {
        return fc.uniqueArray(valueArb(items), { maxLength: 4, selector: (d) => setKey(d) }).map((docs): Doc => ({ t: "arr", items: docs }));
      }
      return fc.array(valueArb(items), { maxLength: 3 }).map((docs): Doc => ({ t: "arr", items: docs }));
    }
  }
}

/** Canonical identity of a set element (sets are generated over strings and integers only). */
function setKey(doc: Doc): string {
  if (doc.t === "str") return `s${doc.v}`;
  if (doc.t === "num") return `n${doc.text === "-0" ? "0" : doc.text}`;
  return doc.t;
}

const schemaAndDocArb = (root: fc.Arbitrary<FieldSchema>): fc.Arbitrary<{ schema: FieldSchema; doc: Doc }> =>
  root.chain((schema) => valueArb(schema).map((doc) => ({ schema, doc })));

/** The same schema, without `required` where canonical output leaves a member out. */
function relaxed(schema: FieldSchema): FieldSchema {
  const out: FieldSchema = { ...schema };
  if (schema.properties !== undefined) {
    out.properties = Object.fromEntries(
      Object.entries(schema.properties).map(([name, member]) => {
        const m = relaxed(member);
        if (member.fingerprint === false || member.nullEqualsAbsent === true) m.required = false;
        return [name, m];
      }),
    );
  }
  if (schema.items !== undefined) out.items = relaxed(schema.items);
  return out;
}

// --- Paths into documents, for targeted changes. ---

type Key = string | number;

interface Target {
  path: Key[];
  schema: FieldSchema;
  doc: Doc;
}

/**
 * Non-null leaves reached only through fingerprinted members and non-set
 * arrays (`fingerprinted`), and members left out of the fingerprint (`hidden`).
 */
function targets(doc: Doc, schema: FieldSchema): { fingerprinted: Target[]; hidden: Target[] } {
  const fingerprinted: Target[] = [];
  const hidden: Target[] = [];
  const walk = (d: Doc, s: FieldSchema, path: Key[], counted: boolean): void => {
    if (d.t === "obj") {
      for (const [name, value] of d.members) {
        const member = s.properties?.[name];
        if (member === undefined) continue;
        const memberPath = [...path, name];
        if (member.fingerprint === false) hidden.push({ path: memberPath, schema: member, doc: value });
        walk(value, member, memberPath, counted && member.fingerprint !== false);
      }
    } else if (d.t === "arr") {
      if (s.set === true || s.items === undefined) return;
      d.items.forEach((item, i) => walk(item, s.items!, [...path, i], counted));
    } else if (d.t !== "null" && counted) {
      fingerprinted.push({ path, schema: s, doc: d });
    }
  };
  walk(doc, schema, [], true);
  return { fingerprinted, hidden };
}

/** `doc` with the value at `path` replaced (or removed, for `undefined` at a member). */
function replaceAt(doc: Doc, path: Key[], replacement: Doc | undefined): Doc {
  const [head, ...rest] = path;
  if (head === undefined) return replacement ?? { t: "null" };
  if (doc.t === "obj" && typeof head === "string") {
    const members: Array<[string, Doc]> = [];
    let found = false;
    for (const [name, value] of doc.members) {
      found ||= name === head;
      if (name !== head) members.push([name, value]);
      else if (rest.length > 0) members.push([name, replaceAt(value, rest, replacement)]);
      else if (replacement !== undefined) members.push([name, replacement]);
    }
    // A member that was absent is added.
    if (!found && rest.length === 0 && replacement !== undefined) members.push([head, replacement]);
    return { t: "obj", members };
  }
  if (doc.t === "arr" && typeof head === "number") {
    return { t: "arr", items: doc.items.map((item, i) => (i === head ? replaceAt(item, rest, replacement) : item)) };
  }
  throw new Error(`no ${String(head)} in ${doc.t}`);
}

/** Every object in `doc` that has members, with its path. */
interface FoundObject {
  path: JsonPath;
  members: Array<[string, Doc]>;
  at: Key[];
}

function objectsIn(doc: Doc): FoundObject[] {
  const found: FoundObject[] = [];
  const walk = (d: Doc, p: JsonPath, at: Key[]): void => {
    if (d.t === "obj") {
      if (d.members.length > 0) found.push({ path: p, members: d.members, at });
      for (const [name, value] of d.members) walk(value, p.member(name), [...at, name]);
    } else if (d.t === "arr") {
      d.items.forEach((item, i) => walk(item, p.index(i), [...at, i]));
    }
  };
  walk(doc, JsonPath.root, []);
  return found;
}

/** `doc` with the object at `at` given `members`. */
function withMembers(doc: Doc, at: Key[], members: Array<[string, Doc]>): Doc {
  const [head, ...rest] = at;
  if (head === undefined) return { t: "obj", members };
  if (doc.t === "obj") {
    const replaced = doc.members.map(([n, v]): [string, Doc] => [n, n === head ? withMembers(v, rest, members) : v]);
    return { t: "obj", members: replaced };
  }
  if (doc.t === "arr") return { t: "arr", items: doc.items.map((v, i) => (i === head ? withMembers(v, rest, members) : v)) };
  throw new Error(`no ${String(head)} in ${doc.t}`);
}

/** A different value with a different meaning for the leaf `doc` of type `schema`. */
function changedLeaf(doc: Doc, schema: FieldSchema, toNull: boolean): Doc {
  if (toNull && schema.nullable === true) return { t: "null" };
  switch (doc.t) {
    case "str":
      return { t: "str", v: `${doc.v}x` };
    case "bool":
      return { t: "bool", v: !doc.v };
    case "num":
      if (schema.type === "integer") return { t: "num", text: (BigInt(doc.text) + 1n).toString() };
      // Different doubles are different exact values, whatever the type.
      return { t: "num", text: Number(doc.text) !== 7.25 ? "7.25" : "8.5" };
    default:
      throw new Error(`not a leaf: ${doc.t}`);
  }
}

/** Calls `work` and asserts it either returns or throws an INVALID_PAYLOAD refusal with a path. */
function refusesCleanly<T>(work: () => T): T | undefined {
  try {
    return work();
  } catch (error) {
    expect(error).toBeInstanceOf(IdempotencyError);
    const refusal = error as IdempotencyError;
    expect(refusal.reason).toBe("INVALID_PAYLOAD");
    expect(refusal.metadata.path).toMatch(/^\$/);
    expect(refusal.message).toContain(refusal.metadata.path);
    return undefined;
  }
}

/** The plain JavaScript value of a parsed document, as JSON.parse would give it. */
function toPlain(value: JsonValue): unknown {
  switch (value.kind) {
    case "object": {
      const out: Record<string, unknown> = {};
      for (const m of value.members) Object.defineProperty(out, m.name, { value: toPlain(m.value), enumerable: true });
      return out;
    }
    case "array":
      return value.elements.map(toPlain);
    case "number":
      return Number(value.text);
    case "null":
      return null;
    default:
      return value.value;
  }
}

// A schema that any object-ish input can be checked against.
const LOOSE: FieldSchema = {
  type: "object",
  properties: {
    a: { type: "number", nullable: true },
    b: { type: "array", items: { type: "string" } },
    c: { type: "object", properties: { d: { type: "integer" } } },
  },
};

// --- Properties. ---

describe("canonicalJson properties", () => {
  it("is idempotent: canonical output canonicalizes to itself", () => {
    fc.assert(
      fc.property(schemaAndDocArb(schemaArb(3)), ({ schema, doc }) => {
        const rules = rulesOf(relaxed(schema));
        const once = canonicalJson(enc(serialize(doc)), rules);
        expect(canonicalJson(once, rules)).toEqual(once);
        expect((): unknown => JSON.parse(dec(once))).not.toThrow();
      }),
      { numRuns: 600 },
    );
  });

  it("does not depend on member order, whitespace or the choice of escapes", () => {
    fc.assert(
      fc.property(schemaAndDocArb(schemaArb(3)), fc.integer(), fc.integer(), ({ schema, doc }, seedA, seedB) => {
        const rules = rulesOf(schema);
        const plain = canonicalJson(enc(serialize(doc)), rules);
        const a = canonicalJson(enc(serialize(doc, prng(seedA))), rules);
        const b = canonicalJson(enc(serialize(doc, prng(seedB))), rules);
        expect(a).toEqual(plain);
        expect(b).toEqual(plain);
      }),
      { numRuns: 600 },
    );
  });

  it("changes whenever a fingerprinted value changes", () => {
    fc.assert(
      fc.property(schemaAndDocArb(richRootArb), fc.nat(), fc.boolean(), fc.integer(), ({ schema, doc }, pick, toNull, seed) => {
        const { fingerprinted } = targets(doc, schema);
        expect(fingerprinted.length).toBeGreaterThan(0); // at least $.anchor
        const target = fingerprinted[pick % fingerprinted.length]!;
        const changed = replaceAt(doc, target.path, changedLeaf(target.doc, target.schema, toNull));
        const rules = rulesOf(schema);
        const before = canonicalJson(enc(serialize(doc, prng(seed))), rules);
        const after = canonicalJson(enc(serialize(changed, prng(seed))), rules);
        expect(after).not.toEqual(before);
      }),
      { numRuns: 600 },
    );
  });

  it("does not change when a member left out of the fingerprint changes", () => {
    const arb = schemaAndDocArb(richRootArb).chain(({ schema, doc }) => {
      const { hidden } = targets(doc, schema);
      // The optional root member $.hidden may be absent: then adding it is the change.
      const hiddenSchema = schema.properties?.["hidden"];
      if (hiddenSchema !== undefined && !hidden.some((t) => t.path.length === 1 && t.path[0] === "hidden")) {
        hidden.push({ path: ["hidden"], schema: hiddenSchema, doc: { t: "null" } });
      }
      return fc.nat({ max: Math.max(0, hidden.length - 1) }).chain((pick) => {
        const target = hidden[pick];
        if (target === undefined) return fc.constant({ schema, doc, changed: doc, hiddenCount: 0 });
        const replacement = target.schema.required === true ? valueArb(target.schema) : fc.option(valueArb(target.schema), { nil: undefined });
        return replacement.map((value) => ({
          schema,
          doc,
          changed: replaceAt(doc, target.path, value),
          hiddenCount: hidden.length,
        }));
      });
    });
    fc.assert(
      fc.property(arb, fc.integer(), ({ schema, doc, changed, hiddenCount }, seed) => {
        expect(hiddenCount).toBeGreaterThan(0); // at least $.hidden
        const rules = rulesOf(schema);
        const before = canonicalJson(enc(serialize(doc)), rules);
        const after = canonicalJson(enc(serialize(changed, prng(seed))), rules);
        expect(after).toEqual(before);
      }),
      { numRuns: 600 },
    );
  });

  it("agrees with JSON.parse on every document JSON.stringify writes", () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 4, stringUnit: "binary" }), (value) => {
        const text = JSON.stringify(value);
        const parsed = parseStrictJson(enc(text), LIMITS);
        expect(toPlain(parsed)).toEqual(JSON.parse(text));
      }),
      { numRuns: 500 },
    );
  });
});

describe("parseStrictJson and canonicalJson never fail unexpectedly", () => {
  /** Feeds `bytes` to the parser and to canonicalJson; only refusals may escape. */
  function probe(bytes: Uint8Array, schema: FieldSchema = LOOSE): void {
    const tree = refusesCleanly(() => parseStrictJson(bytes, LIMITS));
    if (tree !== undefined) {
      // Whatever the strict parser accepts, JSON.parse accepts too, with the same meaning.
      const text = dec(bytes);
      expect(toPlain(tree)).toEqual(JSON.parse(text));
    }
    const out = refusesCleanly(() => canonicalJson(bytes, rulesOf(schema)));
    if (out !== undefined) {
      expect(tree).toBeDefined();
      expect((): unknown => JSON.parse(dec(out))).not.toThrow();
      expect(canonicalJson(out, rulesOf(relaxed(schema)))).toEqual(out);
    }
  }

  it("refuses random bytes cleanly", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => probe(bytes)),
      { numRuns: 1000 },
    );
  });

  it("refuses random Unicode strings cleanly", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary", maxLength: 48 }), (text) => probe(enc(text))),
      { numRuns: 1000 },
    );
  });

  it("refuses near-JSON token soup cleanly", () => {
    const token = fc.constantFrom(
      "{",
      "}",
      "[",
      "]",
      ",",
      ":",
      " ",
      '"',
      "\\",
      "\\u",
      "D800",
      "DC00",
      "00e9",
      "a",
      '"a"',
      '"b"',
      '"c"',
      '"d"',
      "0",
      "1",
      "-",
      ".",
      "e",
      "E",
      "+",
      "1e400",
      "true",
      "null",
      "fals",
      "\u0000",
      "\n",
      "é",
      "\uFEFF",
    );
    fc.assert(
      fc.property(fc.string({ unit: token, maxLength: 24 }), (text) => probe(enc(text))),
      { numRuns: 1000 },
    );
  });

  it("refuses any duplicated member name, however it is escaped, at its path", () => {
    fc.assert(
      fc.property(schemaAndDocArb(richRootArb), fc.nat(), fc.nat(), fc.integer(), ({ schema, doc }, pickObject, pickMember, seed) => {
        const objects = objectsIn(doc);
        expect(objects.length).toBeGreaterThan(0); // at least the root
        const target = objects[pickObject % objects.length]!;
        const [name, value] = target.members[pickMember % target.members.length]!;
        const duplicated = withMembers(doc, target.at, [...target.members, [name, value]]);
        const body = enc(serialize(duplicated, prng(seed)));
        for (const work of [() => parseStrictJson(body, LIMITS), () => canonicalJson(body, rulesOf(schema))]) {
          let caught: unknown;
          try {
            work();
          } catch (error) {
            caught = error;
          }
          expect(caught).toBeInstanceOf(IdempotencyError);
          const refusal = caught as IdempotencyError;
          expect(refusal.reason).toBe("INVALID_PAYLOAD");
          expect(refusal.message).toContain("duplicate member name");
          expect(refusal.metadata.path).toBe(target.path.member(name).toString());
        }
      }),
      { numRuns: 500 },
    );
  });

  it("refuses any lone surrogate escape inside a string", () => {
    fc.assert(
      fc.property(
        fc.string({ unit: "binary", maxLength: 6 }),
        fc.integer({ min: 0xd800, max: 0xdfff }),
        fc.string({ unit: "binary", maxLength: 6 }),
        fc.integer(),
        (prefix, unit, suffix, seed) => {
          const rnd = prng(seed);
          const literal = `${writeString(prefix, rnd).slice(0, -1)}${u(unit, rnd() < 0.5)}${writeString(suffix, rnd).slice(1)}`;
          let caught: unknown;
          try {
            parseStrictJson(enc(`{"k":[${literal}]}`), LIMITS);
          } catch (error) {
            caught = error;
          }
          expect(caught).toBeInstanceOf(IdempotencyError);
          expect((caught as IdempotencyError).message).toContain("surrogate");
          expect((caught as IdempotencyError).metadata.path).toBe("$.k[0]");
        },
      ),
      { numRuns: 500 },
    );
  });

  it("refuses mutations of valid documents cleanly (byte flips, insertions, deletions)", () => {
    const mutation = fc.oneof(
      fc.record({ kind: fc.constant("flip" as const), at: fc.nat(), bits: fc.integer({ min: 1, max: 255 }) }),
      fc.record({ kind: fc.constant("insert" as const), at: fc.nat(), byte: fc.integer({ min: 0, max: 255 }) }),
      fc.record({ kind: fc.constant("delete" as const), at: fc.nat() }),
    );
    fc.assert(
      fc.property(schemaAndDocArb(schemaArb(3)), fc.integer(), fc.array(mutation, { minLength: 1, maxLength: 3 }), ({ schema, doc }, seed, mutations) => {
        const bytes = Array.from(enc(serialize(doc, prng(seed))));
        for (const m of mutations) {
          const at = m.at % (bytes.length + 1);
          if (m.kind === "insert") bytes.splice(at, 0, m.byte);
          else if (bytes.length === 0) continue;
          else if (m.kind === "delete") bytes.splice(at % bytes.length, 1);
          else bytes[at % bytes.length] = (bytes[at % bytes.length] ?? 0) ^ m.bits;
        }
        probe(new Uint8Array(bytes), schema);
      }),
      { numRuns: 1000 },
    );
  });
});
