import { Buffer } from "node:buffer";
import { refuse } from "./errors.js";

/**
 * JSON mode of the payload fingerprint, first half: a strict RFC 8259 parser
 * (json-canonical.ts writes the canonical form of what it parses).
 *
 * Everything here is iterative (an explicit stack instead of recursion), so
 * a deep document cannot exhaust the call stack, and every failure is
 * an `IdempotencyError` with reason `INVALID_PAYLOAD` and the JSON path in
 * `metadata.path`.
 */

// --- Paths. ---

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Where a value sits in a document: `$`, `$.amount`, `$.items[2].sku`,
 * `$["weird name"]`. A linked list towards the root, formatted only when asked,
 * so that deep documents cost no more than their size.
 */
export class JsonPath {
  static readonly root = new JsonPath(undefined, "");

  private constructor(
    readonly parent: JsonPath | undefined,
    /** The member name or element index within the parent ("" for the root). */
    readonly key: string | number,
  ) {}

  member(name: string): JsonPath {
    return new JsonPath(this, name);
  }

  index(index: number): JsonPath {
    return new JsonPath(this, index);
  }

  toString(): string {
    const segments: string[] = [];
    // eslint-disable-next-line @typescript-eslint/no-this-alias -- a cursor that walks up the parent chain from this segment, not a captured `this`
    for (let at: JsonPath | undefined = this; at?.parent !== undefined; at = at.parent) {
      const key = at.key;
      segments.push(typeof key === "number" ? `[${key}]` : IDENTIFIER.test(key) ? `.${key}` : `[${canonicalString(key)}]`);
    }
    return `$${segments.reverse().join("")}`;
  }
}

// --- The syntax tree. ---

/** A parsed JSON value; numbers keep their exact source text, objects their members in source order. */
export type JsonValue =
  | { kind: "object"; members: JsonMember[]; path: JsonPath }
  | { kind: "array"; elements: JsonValue[]; path: JsonPath }
  | { kind: "string"; value: string; path: JsonPath }
  | { kind: "number"; text: string; path: JsonPath }
  | { kind: "boolean"; value: boolean; path: JsonPath }
  | { kind: "null"; path: JsonPath };

/** An object member: its unescaped name and its value. */
export interface JsonMember {
  name: string;
  value: JsonValue;
}

export interface JsonLimits {
  /** Deepest nesting of objects and arrays accepted (the root object or array is depth 1). */
  maxDepth: number;
  /** Largest body accepted, in bytes. */
  maxBytes: number;
}

/** Refuses the payload (INVALID_PAYLOAD) at `path`. */
export function fail(path: JsonPath | string, message: string): never {
  const where = typeof path === "string" ? path : path.toString();
  refuse("INVALID_PAYLOAD", `JSON body at ${where}: ${message}`, { path: where });
}

// --- Parsing. ---

const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;

type OpenContainer = { kind: "object"; node: JsonValue & { kind: "object" }; names: Set<string>; pending: string } | { kind: "array"; node: JsonValue & { kind: "array" } };

/**
 * Parses a body as one strict RFC 8259 JSON text. Refuses a body larger than
 * `maxBytes`, a BOM, invalid UTF-8, invalid syntax, trailing data, lone
 * surrogate escapes, duplicate member names (compared after unescaping),
 * numbers that overflow a double, and nesting deeper than `maxDepth`.
 */
export function parseStrictJson(body: Uint8Array, limits: JsonLimits): JsonValue {
  if (body.byteLength > limits.maxBytes) {
    fail("$", `the body has ${body.byteLength} bytes; expected at most ${limits.maxBytes}`);
  }
  if (body.byteLength >= 3 && body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf) {
    fail("$", "the body starts with a UTF-8 byte order mark; expected JSON text without a BOM");
  }
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(body);
  } catch {
    fail("$", "the body is not valid UTF-8; expected UTF-8 encoded JSON text");
  }
  return new Parser(text, limits.maxDepth).parse();
}

class Parser {
  private pos = 0;

  constructor(
    private readonly text: string,
    private readonly maxDepth: number,
  ) {}

  parse(): JsonValue {
    const stack: OpenContainer[] = [];
    let path = JsonPath.root;
    this.skipWhitespace();
    if (this.pos >= this.text.length) fail(path, "the body is empty; expected a JSON value");

    for (;;) {
      // At the start of a value whose path is `path`.
      this.skipWhitespace();
      let value: JsonValue;
      const ch = this.text.charCodeAt(this.pos);
      if (ch === 0x7b /* { */ || ch === 0x5b /* [ */) {
        if (stack.length + 1 > this.maxDepth) {
          fail(path, `nesting is deeper than ${this.maxDepth}; expected at most ${this.maxDepth} levels of objects and arrays`);
        }
        this.pos++;
        this.skipWhitespace();
        if (ch === 0x7b) {
          const node: JsonValue & { kind: "object" } = { kind: "object", members: [], path };
          if (this.text.charCodeAt(this.pos) === 0x7d /* } */) {
            this.pos++;
            value = node;
          } else {
            const open: OpenContainer = { kind: "object", node, names: new Set(), pending: "" };
            stack.push(open);
            path = this.memberName(open);
            continue;
          }
        } else {
          const node: JsonValue & { kind: "array" } = { kind: "array", elements: [], path };
          if (this.text.charCodeAt(this.pos) === 0x5d /* ] */) {
            this.pos++;
            value = node;
          } else {
            stack.push({ kind: "array", node });
            path = path.index(0);
            continue;
          }
        }
      } else {
        value = this.scalar(path);
      }

      // A value is complete: attach it to its container, then find what follows.
      for (;;) {
        const top = stack[stack.length - 1];
        if (top === undefined) {
          this.skipWhitespace();
          if (this.pos < this.text.length) {
            fail(JsonPath.root, `unexpected ${this.found()} after the top-level value; expected only whitespace`);
          }
          return value;
        }
        if (top.kind === "object") top.node.members.push({ name: top.pending, value });
        else top.node.elements.push(value);
        this.skipWhitespace();
        const next = this.text.charCodeAt(this.pos);
        if (next === 0x2c /* , */) {
          this.pos++;
          this.skipWhitespace();
          if (top.kind === "object") {
            path = this.memberName(top);
          } else {
            if (this.text.charCodeAt(this.pos) === 0x5d) {
              fail(top.node.path, `trailing comma ${this.at()}; expected another element`);
            }
            path = top.node.path.index(top.node.elements.length);
          }
          break;
        }
        const close = top.kind === "object" ? 0x7d : 0x5d;
        if (next === close) {
          this.pos++;
          stack.pop();
          value = top.node;
          continue;
        }
        fail(top.node.path, top.kind === "object" ? `unexpected ${this.found()} in an object; expected ',' or '}'` : `unexpected ${this.found()} in an array; expected ',' or ']'`);
      }
    }
  }

  /** Reads `"name" :` of the next member of `open` and returns the member's path. */
  private memberName(open: OpenContainer & { kind: "object" }): JsonPath {
    const objectPath = open.node.path;
    if (this.text.charCodeAt(this.pos) !== 0x22 /* " */) {
      const hint = this.text.charCodeAt(this.pos) === 0x7d ? "trailing comma; " : "";
      fail(objectPath, `${hint}unexpected ${this.found()}; expected a member name in double quotes`);
    }
    const name = this.string(objectPath);
    const path = objectPath.member(name);
    if (open.names.has(name)) {
      fail(path, `duplicate member name ${canonicalString(name)}; expected each name at most once per object`);
    }
    open.names.add(name);
    open.pending = name;
    this.skipWhitespace();
    if (this.text.charCodeAt(this.pos) !== 0x3a /* : */) {
      fail(path, `unexpected ${this.found()} after a member name; expected ':'`);
    }
    this.pos++;
    return path;
  }

  private scalar(path: JsonPath): JsonValue {
    const ch = this.text.charCodeAt(this.pos);
    if (ch === 0x22) return { kind: "string", value: this.string(path), path };
    if (ch === 0x2d /* - */ || (ch >= 0x30 && ch <= 0x39)) return { kind: "number", text: this.number(path), path };
    for (const [word, node] of LITERALS) {
      if (this.text.startsWith(word, this.pos)) {
        this.pos += word.length;
        return { ...node, path };
      }
    }
    const hint = ch === 0x27 ? " (strings need double quotes)" : ch === 0x2b ? " (numbers have no leading '+')" : "";
    fail(path, `unexpected ${this.found()}${hint}; expected a JSON value (object, array, string, number, true, false or null)`);
  }

  private number(path: JsonPath): string {
    NUMBER.lastIndex = this.pos;
    const match = NUMBER.exec(this.text);
    if (match === null) {
      fail(path, `malformed number ${this.at()}; expected '-' followed by digits`);
    }
    const literal = match[0];
    const end = this.pos + literal.length;
    const after = this.text.charCodeAt(end);
    if (after >= 0x30 && after <= 0x39) {
      fail(path, `number with a leading zero ${this.at()}; expected no leading zeros`);
    }
    if (after === 0x2e /* . */ || after === 0x65 || after === 0x45 || after === 0x2b || after === 0x2d) {
      fail(path, `malformed number ${this.at()}; expected digits after '.', 'e' or 'E'`);
    }
    if (!Number.isFinite(Number(literal))) {
      fail(path, `non-finite or overflowing number ${abbreviate(literal)}; expected a number within the range of a double`);
    }
    this.pos = end;
    return literal;
  }

  /** Reads a string starting at the opening quote and returns it unescaped. */
  private string(path: JsonPath): string {
    const text = this.text;
    let pos = this.pos + 1;
    let out = "";
    let runStart = pos;
    for (;;) {
      if (pos >= text.length) {
        this.pos = pos;
        fail(path, `unterminated string ${this.at()}; expected a closing '"'`);
      }
      const ch = text.charCodeAt(pos);
      if (ch === 0x22) {
        out += text.slice(runStart, pos);
        this.pos = pos + 1;
        return out;
      }
      if (ch < 0x20) {
        this.pos = pos;
        fail(path, `unescaped control character U+${hex4(ch)} in a string ${this.at()}; ` + `expected it escaped as \\u${hex4(ch).toLowerCase()}`);
      }
      if (ch !== 0x5c /* \ */) {
        pos++;
        continue;
      }
      out += text.slice(runStart, pos);
      this.pos = pos;
      const escape = text.charCodeAt(pos + 1);
      const simple = SIMPLE_ESCAPES.get(escape);
      if (simple !== undefined) {
        out += simple;
        pos += 2;
      } else if (escape === 0x75 /* u */) {
        const unit = this.hexEscape(pos, path);
        if (unit >= 0xdc00 && unit <= 0xdfff) {
          fail(path, `lone low surrogate escape \\u${hex4(unit)} ${this.at()}; expected a high surrogate escape before it`);
        }
        if (unit >= 0xd800 && unit <= 0xdbff) {
          const followedByEscape = text.charCodeAt(pos + 6) === 0x5c && text.charCodeAt(pos + 7) === 0x75;
          const low = followedByEscape ? this.hexEscape(pos + 6, path) : -1;
          if (low < 0xdc00 || low > 0xdfff) {
            fail(path, `lone high surrogate escape \\u${hex4(unit)} ${this.at()}; ` + "expected a low surrogate escape (\\uDC00-\\uDFFF) right after it");
          }
          out += String.fromCharCode(unit, low);
          pos += 12;
        } else {
          out += String.fromCharCode(unit);
          pos += 6;
        }
      } else {
        const what = Number.isNaN(escape) ? "an unterminated escape" : `the invalid escape \\${describeChar(text, pos + 1)}`;
        fail(path, `${what} ${this.at()}; expected one of \\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX`);
      }
      runStart = pos;
    }
  }

  /** The code unit of the `\uXXXX` escape at `at`. */
  private hexEscape(at: number, path: JsonPath): number {
    const digits = this.text.slice(at + 2, at + 6);
    if (!/^[0-9A-Fa-f]{4}$/.test(digits)) {
      this.pos = at;
      fail(path, `malformed \\u escape ${this.at()}; expected exactly four hexadecimal digits`);
    }
    return Number.parseInt(digits, 16);
  }

  private skipWhitespace(): void {
    const text = this.text;
    let pos = this.pos;
    for (;;) {
      const ch = text.charCodeAt(pos);
      if (ch === 0x20 || ch === 0x09 || ch === 0x0a || ch === 0x0d) pos++;
      else break;
    }
    this.pos = pos;
  }

  /** The byte offset of the current position, for messages. */
  private at(): string {
    return `at byte ${Buffer.byteLength(this.text.slice(0, this.pos), "utf8")}`;
  }

  private found(): string {
    if (this.pos >= this.text.length) return `end of input ${this.at()}`;
    return `${canonicalString(describeChar(this.text, this.pos))} ${this.at()}`;
  }
}

const LITERALS: ReadonlyArray<readonly [string, { kind: "boolean"; value: boolean } | { kind: "null" }]> = [
  ["true", { kind: "boolean", value: true }],
  ["false", { kind: "boolean", value: false }],
  ["null", { kind: "null" }],
];

const SIMPLE_ESCAPES = new Map<number, string>([
  [0x22, '"'],
  [0x5c, "\\"],
  [0x2f, "/"],
  [0x62, "\b"],
  [0x66, "\f"],
  [0x6e, "\n"],
  [0x72, "\r"],
  [0x74, "\t"],
]);

function hex4(unit: number): string {
  return unit.toString(16).toUpperCase().padStart(4, "0");
}

/** The whole code point at `pos` (never half a surrogate pair). */
function describeChar(text: string, pos: number): string {
  const cp = text.codePointAt(pos);
  return cp === undefined ? "" : String.fromCodePoint(cp);
}

export function abbreviate(literal: string): string {
  if (literal.length <= 40) return literal;
  return `${literal.slice(0, 20)}…${literal.slice(-10)} (${literal.length} characters)`;
}

// --- Canonical strings. ---

/** A string as RFC 8785 writes it: only `"`, `\` and U+0000..U+001F escaped, the latter minimally. */
export function canonicalString(value: string): string {
  let out = '"';
  let runStart = 0;
  for (let i = 0; i < value.length; i++) {
    const ch = value.charCodeAt(i);
    if (ch >= 0x20 && ch !== 0x22 && ch !== 0x5c) continue;
    out += value.slice(runStart, i);
    runStart = i + 1;
    switch (ch) {
      case 0x22:
        out += '\\"';
        break;
      case 0x5c:
        out += "\\\\";
        break;
      case 0x08:
        out += "\\b";
        break;
      case 0x09:
        out += "\\t";
        break;
      case 0x0a:
        out += "\\n";
        break;
      case 0x0c:
        out += "\\f";
        break;
      case 0x0d:
        out += "\\r";
        break;
      default:
        out += `\\u${ch.toString(16).padStart(4, "0")}`;
    }
  }
  return `${out}${value.slice(runStart)}"`;
}

// --- Canonical numbers. ---
