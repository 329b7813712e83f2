import { Buffer } from "node:buffer";
import type { FieldSchema, JsonRules } from "./json-schema.js";
import { abbreviate, canonicalString, fail, parseStrictJson, type JsonValue } from "./json-parse.js";

/**
 * JSON mode of the payload fingerprint, second half: the canonical form of a
 * body (json-parse.ts parses it) validated against an operation's field
 * schema, RFC 8785-style: sorted members, minimal escapes, no whitespace, with
 * numbers written according to their declared type. Iterative like the
 * parser, so a deep schema cannot exhaust the call stack either.
 */

const INTEGER = /^-?(?:0|[1-9][0-9]*)$/;
const DECIMAL_PARTS = /^(-?)([0-9]+)(?:\.([0-9]+))?(?:[eE]([+-]?)([0-9]+))?$/;

/** Longest plain decimal text accepted. */
export const MAX_DECIMAL_CHARS = 512;
// Exponents beyond this many digits are clamped: far past anything that fits.
const MAX_EXPONENT_DIGITS = 15;

/**
 * The plain decimal text of the exact value a JSON number literal denotes (no
 * exponent, no float conversion), keeping the literal's scale or, when
 * `normalized`, dropping trailing fractional zeros. Undefined when the text
 * would exceed `MAX_DECIMAL_CHARS`.
 */
export function plainDecimal(literal: string, scale: "significant" | "normalized"): string | undefined {
  const parts = DECIMAL_PARTS.exec(literal);
  if (parts === null) return undefined;
  const negative = parts[1] === "-";
  const integerDigits = parts[2] ?? "";
  const fractionDigits = parts[3] ?? "";
  const exponentDigits = (parts[5] ?? "0").replace(/^0+(?=.)/, "");
  const exponentMagnitude = exponentDigits.length > MAX_EXPONENT_DIGITS ? 10 ** MAX_EXPONENT_DIGITS : Number(exponentDigits);
  const exponent = parts[4] === "-" ? -exponentMagnitude : exponentMagnitude;

  // value = digits × 10^-fractionScale
  let digits = (integerDigits + fractionDigits).replace(/^0+/, "");
  let fractionScale = fractionDigits.length - exponent;
  if (digits.length === 0) {
    // Zero: keep only its scale (never negative, never signed).
    const zeroScale = scale === "normalized" ? 0 : Math.max(0, fractionScale);
    if (zeroScale + 2 > MAX_DECIMAL_CHARS) return undefined;
    return zeroScale === 0 ? "0" : `0.${"0".repeat(zeroScale)}`;
  }
  if (scale === "normalized" && fractionScale > 0) {
    const trailing = digits.length - digits.replace(/0+$/, "").length;
    const drop = Math.min(trailing, fractionScale);
    digits = digits.slice(0, digits.length - drop);
    fractionScale -= drop;
  }
  const sign = negative ? "-" : "";
  if (fractionScale <= 0) {
    if (sign.length + digits.length - fractionScale > MAX_DECIMAL_CHARS) return undefined;
    return `${sign}${digits}${"0".repeat(-fractionScale)}`;
  }
  const length = sign.length + Math.max(digits.length, fractionScale + 1) + 1;
  if (length > MAX_DECIMAL_CHARS) return undefined;
  const padded = digits.padStart(fractionScale + 1, "0");
  const cut = padded.length - fractionScale;
  return `${sign}${padded.slice(0, cut)}.${padded.slice(cut)}`;
}

// --- Validation and canonical form. ---

const TYPE_NAMES: Record<FieldSchema["type"], string> = {
  string: "a string",
  boolean: "a boolean",
  integer: "an integer",
  decimal: "a decimal number",
  number: "a number",
  object: "an object",
  array: "an array",
};

function foundName(value: JsonValue): string {
  switch (value.kind) {
    case "object":
      return "an object";
    case "array":
      return "an array";
    case "string":
      return "a string";
    case "number":
      return `the number ${abbreviate(value.text)}`;
    case "boolean":
      return value.value ? "true" : "false";
    case "null":
      return "null";
  }
}

/** The rest of an object or array whose children are being canonicalized. */
type Frame =
  | {
      kind: "object";
      node: JsonValue & { kind: "object" };
      schemas: FieldSchema[];
      next: number;
      out: Array<[string, string] | undefined>;
    }
  | {
      kind: "array";
      node: JsonValue & { kind: "array" };
      schema: FieldSchema;
      set: boolean;
      next: number;
      out: string[];
    };

type Step = { done: string } | { frame: Frame };

/**
 * The canonical UTF-8 bytes of a JSON body validated against `rules.root`.
 * Refuses (INVALID_PAYLOAD, with `metadata.path`) anything `parseStrictJson`
 * refuses and anything the schema does not allow.
 */
export function canonicalJson(body: Uint8Array, rules: JsonRules): Uint8Array {
  const root = parseStrictJson(body, rules);
  return new TextEncoder().encode(canonicalValue(root, rules.root));
}

/** The canonical text of an already parsed value validated against `schema`. */
export function canonicalValue(root: JsonValue, schema: FieldSchema): string {
  const stack: Frame[] = [];
  // Enters the next child of `frame`, or finishes `frame` when it has none left.
  const advance = (frame: Frame): Step => {
    const child = nextChild(frame);
    if (child !== undefined) return enter(child.value, child.schema);
    stack.pop();
    return { done: finish(frame) };
  };
  let step = enter(root, schema);
  for (;;) {
    if ("frame" in step) {
      stack.push(step.frame);
      step = advance(step.frame);
    } else {
      const parent = stack[stack.length - 1];
      if (parent === undefined) return step.done;
      record(parent, step.done);
      step = advance(parent);
    }
  }
}

function nextChild(frame: Frame): { value: JsonValue; schema: FieldSchema } | undefined {
  if (frame.kind === "object") {
    const member = frame.node.members[frame.next];
    const schema = frame.schemas[frame.next];
    return member === undefined || schema === undefined ? undefined : { value: member.value, schema };
  }
  const element = frame.node.elements[frame.next];
  return element === undefined ? undefined : { value: element, schema: frame.schema };
}

/** Stores the canonical text of the child `frame.next` and moves on. */
function record(frame: Frame, text: string): void {
  if (frame.kind === "array") {
    frame.out.push(text);
  } else {
    const member = frame.node.members[frame.next];
    const schema = frame.schemas[frame.next];
    if (member !== undefined && schema !== undefined) {
      const omitted = schema.fingerprint === false || (member.value.kind === "null" && schema.nullEqualsAbsent === true);
      frame.out.push(omitted ? undefined : [member.name, text]);
    }
  }
  frame.next++;
}

/** Validates `value` itself (not its children) and returns its text or a frame for its children. */
function enter(value: JsonValue, schema: FieldSchema): Step {
  if (value.kind === "null") {
    if (schema.nullable === true) return { done: "null" };
    fail(value.path, `null is not allowed; expected ${TYPE_NAMES[schema.type] ?? "a value"}`);
  }
  switch (schema.type) {
    case "string":
      if (value.kind !== "string") mismatch(value, schema);
      return { done: canonicalString(value.value) };
    case "boolean":
      if (value.kind !== "boolean") mismatch(value, schema);
      return { done: value.value ? "true" : "false" };
    case "integer":
      if (value.kind !== "number") mismatch(value, schema);
      if (!INTEGER.test(value.text)) {
        fail(value.path, `found ${foundName(value)}; expected an integer written without fraction or exponent`);
      }
      return { done: value.text === "-0" ? "0" : value.text };
    case "decimal": {
      if (value.kind !== "number") mismatch(value, schema);
      const text = plainDecimal(value.text, schema.scale ?? "significant");
      if (text === undefined) {
        fail(value.path, `overflowing decimal ${abbreviate(value.text)}; ` + `expected a decimal whose plain form has at most ${MAX_DECIMAL_CHARS} characters`);
      }
      return { done: text };
    }
    case "number":
      if (value.kind !== "number") mismatch(value, schema);
      // ECMAScript Number::toString is RFC 8785's number serialization; String(-0) is "0".
      return { done: String(Number(value.text)) };
    case "object": {
      if (value.kind !== "object") mismatch(value, schema);
      const properties = schema.properties ?? {};
      const schemas: FieldSchema[] = [];
      const present = new Set<string>();
      for (const member of value.members) {
        const memberSchema = Object.hasOwn(properties, member.name) ? properties[member.name] : undefined;
        if (memberSchema === undefined) {
          const declared = Object.keys(properties);
          fail(
            value.path.member(member.name),
            `member ${canonicalString(member.name)} is not declared by the schema; expected ${
              declared.length === 0 ? "no members" : `only ${declared.map(canonicalString).join(", ")}`
            }`,
          );
        }
        schemas.push(memberSchema);
        present.add(member.name);
      }
      for (const [name, memberSchema] of Object.entries(properties)) {
        if (memberSchema.required === true && !present.has(name)) {
          fail(value.path.member(name), `required member ${canonicalString(name)} is missing; ` + `expected ${TYPE_NAMES[memberSchema.type] ?? "a value"}`);
        }
      }
      return { frame: { kind: "object", node: value, schemas, next: 0, out: [] } };
    }
    case "array": {
      if (value.kind !== "array") mismatch(value, schema);
      const items = schema.items;
      if (items === undefined) {
        if (value.elements.length > 0) {
          fail(value.path.index(0), "found an element; expected an empty array (the schema declares no items)");
        }
        return { done: "[]" };
      }
      return { frame: { kind: "array", node: value, schema: items, set: schema.set === true, next: 0, out: [] } };
    }
    default:
      fail(value.path, `the schema declares an unknown type ${canonicalString(String(schema.type))}`);
  }
}

function mismatch(value: JsonValue, schema: FieldSchema): never {
  fail(value.path, `found ${foundName(value)}; expected ${TYPE_NAMES[schema.type] ?? "a value"}`);
}

function finish(frame: Frame): string {
  if (frame.kind === "object") {
    const members = frame.out.filter((m): m is [string, string] => m !== undefined);
    members.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    return `{${members.map(([name, text]) => `${canonicalString(name)}:${text}`).join(",")}}`;
  }
  if (!frame.set) return `[${frame.out.join(",")}]`;
  const seen = new Map<string, number>();
  frame.out.forEach((text, index) => {
    const first = seen.get(text);
    if (first !== undefined) {
      fail(frame.node.path.index(index), `duplicate of element ${frame.node.path.index(first).toString()} in a set; expected distinct elements`);
    }
    seen.set(text, index);
  });
  const encoder = new TextEncoder();
  const sorted = frame.out.map((text) => ({ text, bytes: encoder.encode(text) }));
  sorted.sort((a, b) => Buffer.compare(a.bytes, b.bytes));
  return `[${sorted.map((e) => e.text).join(",")}]`;
}
