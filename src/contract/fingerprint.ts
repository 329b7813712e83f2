import { refuse } from "./errors.js";
import { encodeList, fieldBytes, framedDigest } from "./frame.js";
import { canonicalJson } from "./json-canonical.js";
import type { JsonRules } from "./json-schema.js";

/** The fingerprint algorithm's name, as a precomputed fingerprint must declare it. */
export const FINGERPRINT_SCHEME = "idem-fp-v1";

/** The parts of an HTTP request a gateway forwards for fingerprinting. */
export interface RequestParts {
  method: string;
  path: string;
  /** The raw query string, without `?`. */
  query: string;
  mediaType: string;
  headers: ReadonlyArray<{ name: string; value: string }>;
  body: Uint8Array;
}

/** What of a request counts, as one schema revision of an operation's policy says. */
export interface FingerprintRules {
  schemaRevision: number;
  /** How the body becomes the canonical payload: as it is, or as canonical JSON under a field schema. */
  payload: { mode: "raw" } | { mode: "json"; json: JsonRules };
  /** Query parameter names that are part of the target (case-sensitive). */
  queryParameters: readonly string[];
  /** Business header names that count (lower-case). */
  headers: readonly string[];
  /** Largest body accepted, in bytes. */
  maxBodyBytes: number;
}

/** A request reduced to exactly what its fingerprint covers. */
export interface CanonicalRequest {
  method: string;
  target: string;
  mediaType: string;
  /** Selected headers as [lower-case name, trimmed value], sorted by name. */
  headers: Array<[string, string]>;
  payload: Uint8Array;
}

/**
 * fingerprint = SHA-256(frame("idem-fp-v1", method, canonical_target, media_type,
 *                             schema_revision, selected_headers, canonical_payload))
 * where selected_headers is list(name1, value1, name2, value2, …).
 */
export function fingerprint(parts: RequestParts, rules: FingerprintRules): Uint8Array {
  return fingerprintOf(canonicalRequest(parts, rules), rules.schemaRevision);
}

/** The fingerprint of an already canonical request. */
export function fingerprintOf(request: CanonicalRequest, schemaRevision: number): Uint8Array {
  const headerItems = request.headers.flatMap(([name, value]) => [fieldBytes(name), fieldBytes(value)]);
  return framedDigest(FINGERPRINT_SCHEME, request.method, request.target, request.mediaType, schemaRevision, encodeList(headerItems), request.payload);
}

/** Reduces request parts to their canonical form, refusing what cannot be canonical. */
export function canonicalRequest(parts: RequestParts, rules: FingerprintRules): CanonicalRequest {
  if (parts.body.byteLength > rules.maxBodyBytes) {
    refuse("INVALID_PAYLOAD", `parts.body has ${parts.body.byteLength} bytes; this operation accepts at most ${rules.maxBodyBytes}`, { limit: String(rules.maxBodyBytes) });
  }
  return {
    method: canonicalMethod(parts.method),
    target: canonicalTarget(parts.path, parts.query, rules.queryParameters),
    mediaType: canonicalMediaType(parts.mediaType),
    headers: selectHeaders(parts.headers, rules.headers),
    payload: canonicalPayload(parts.body, rules),
  };
}

/** Raw mode hashes the body as it is; JSON mode its canonical form under the field schema. */
function canonicalPayload(body: Uint8Array, rules: FingerprintRules): Uint8Array {
  switch (rules.payload.mode) {
    case "raw":
      return body;
    case "json":
      return canonicalJson(body, rules.payload.json);
  }
}

const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/** The method upper-cased; it must be an HTTP token. */
export function canonicalMethod(method: string): string {
  if (!TOKEN.test(method)) {
    refuse("INVALID_PAYLOAD", "parts.method must be an HTTP method such as POST");
  }
  return method.toUpperCase();
}

/**
 * The path with normalized percent-encoding, plus only the named query
 * parameters, sorted by name (repeated names keep their order), each name and
 * value decoded (`+` is a space) and re-encoded so that only RFC 3986
 * unreserved characters stay literal.
 */
export function canonicalTarget(path: string, query: string, names: readonly string[]): string {
  if (!path.startsWith("/")) {
    refuse("INVALID_PAYLOAD", "parts.path must start with '/'");
  }
  const canonicalPath = normalizePath(path);
  if (names.length === 0 || query.length === 0) return canonicalPath;
  const wanted = new Set(names);
  const pairs: Array<[string, string]> = [];
  for (const piece of query.split("&")) {
    if (piece.length === 0) continue;
    const eq = piece.indexOf("=");
    const rawName = eq < 0 ? piece : piece.slice(0, eq);
    const rawValue = eq < 0 ? "" : piece.slice(eq + 1);
    // A name that does not even decode cannot be one the policy selects.
    const name = tryDecodeQueryComponent(rawName);
    if (name === undefined || !wanted.has(name)) continue;
    pairs.push([encodeUnreserved(name), encodeUnreserved(decodeQueryComponent(rawValue))]);
  }
  if (pairs.length === 0) return canonicalPath;
  pairs.sort((a, b) => compareCodeUnits(a[0], b[0]));
  return `${canonicalPath}?${pairs.map(([n, v]) => `${n}=${v}`).join("&")}`;
}

const UNRESERVED = /[A-Za-z0-9\-._~]/;
// Characters a path may hold literally (RFC 3986 pchar and "/"), besides "%".
const PATH_LITERAL = /[A-Za-z0-9\-._~!$&'()*+,;=:@/]/;

function normalizePath(path: string): string {
  let out = "";
  const bytes = new TextEncoder().encode(path);
  for (let i = 0; i < bytes.length; i++) {
    const byte = bytes[i]!;
    if (byte === 0x25) {
      const hex = String.fromCharCode(bytes[i + 1] ?? 0, bytes[i + 2] ?? 0);
      if (!/^[0-9A-Fa-f]{2}$/.test(hex)) {
        refuse("INVALID_PAYLOAD", "parts.path has a malformed percent-encoding");
      }
      const decoded = Number.parseInt(hex, 16);
      const ch = String.fromCharCode(decoded);
      out += UNRESERVED.test(ch) ? ch : `%${hex.toUpperCase()}`;
      i += 2;
      continue;
    }
    const ch = String.fromCharCode(byte);
    out += byte < 0x80 && PATH_LITERAL.test(ch) ? ch : percent(byte);
  }
  return out;
}

function decodeQueryComponent(component: string): string {
  const decoded = tryDecodeQueryComponent(component);
  if (decoded === undefined) refuse("INVALID_PAYLOAD", "parts.query has a malformed percent-encoding or invalid UTF-8");
  return decoded;
}

function tryDecodeQueryComponent(component: string): string | undefined {
  try {
    return decodeURIComponent(component.replaceAll("+", " "));
  } catch {
    return undefined;
  }
}

function encodeUnreserved(text: string): string {
  let out = "";
  for (const byte of new TextEncoder().encode(text)) {
    const ch = String.fromCharCode(byte);
    out += byte < 0x80 && UNRESERVED.test(ch) ? ch : percent(byte);
  }
  return out;
}

function percent(byte: number): string {
  return `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
}

function compareCodeUnits(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/**
 * `type/subtype` lower-cased, then its parameters sorted by lower-cased name,
 * joined without spaces: `application/json;charset=utf-8`. Values are written
 * as tokens when they are tokens and as quoted strings otherwise (so that
 * `a="1;b=2"` never reads as two parameters); the `charset` value is
 * lower-cased. An empty media type stays empty.
 */
export function canonicalMediaType(mediaType: string): string {
  const trimmed = mediaType.trim();
  if (trimmed.length === 0) return "";
  const [essence = "", ...rawParams] = splitParameters(trimmed);
  const match = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+)\/([!#$%&'*+.^_`|~0-9A-Za-z-]+)$/.exec(essence.trim());
  if (!match) {
    refuse("INVALID_PAYLOAD", "parts.media_type must look like type/subtype; parameters");
  }
  const params = new Map<string, string>();
  for (const raw of rawParams) {
    if (raw.trim().length === 0) continue;
    const eq = raw.indexOf("=");
    const name = (eq < 0 ? raw : raw.slice(0, eq)).trim().toLowerCase();
    let value = eq < 0 ? "" : raw.slice(eq + 1).trim();
    if (!TOKEN.test(name)) {
      refuse("INVALID_PAYLOAD", "parts.media_type has a malformed parameter");
    }
    if (value.startsWith('"')) value = unquote(value);
    if (name === "charset") value = value.toLowerCase();
    if (params.has(name)) {
      refuse("INVALID_PAYLOAD", `parts.media_type repeats the parameter '${name}'`);
    }
    params.set(name, value);
  }
  const sorted = [...params.entries()].sort((a, b) => compareCodeUnits(a[0], b[0]));
  const head = `${match[1]!.toLowerCase()}/${match[2]!.toLowerCase()}`;
  return [head, ...sorted.map(([n, v]) => `${n}=${TOKEN.test(v) ? v : quote(v)}`)].join(";");
}

/** Splits on ";" outside quoted strings. */
function splitParameters(text: string): string[] {
  const parts: string[] = [];
  let current = "";
  let quoted = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i]!;
    if (quoted && ch === "\\") {
      current += ch + (text[i + 1] ?? "");
      i++;
    } else if (ch === '"') {
      quoted = !quoted;
      current += ch;
    } else if (ch === ";" && !quoted) {
      parts.push(current);
      current = "";
    } else {
      current += ch;
    }
  }
  if (quoted) refuse("INVALID_PAYLOAD", "parts.media_type has an unterminated quoted string");
  parts.push(current);
  return parts;
}

function quote(value: string): string {
  return `"${value.replace(/["\\]/g, "\\$&")}"`;
}

function unquote(value: string): string {
  if (value.length < 2 || !value.endsWith('"')) {
    refuse("INVALID_PAYLOAD", "parts.media_type has a malformed quoted parameter value");
  }
  return value.slice(1, -1).replace(/\\(.)/g, "$1");
}

/** The headers the policy names, as [lower-case name, trimmed value], sorted by name. */
export function selectHeaders(headers: ReadonlyArray<{ name: string; value: string }>, names: readonly string[]): Array<[string, string]> {
  if (names.length === 0) return [];
  const wanted = new Set(names.map((n) => n.toLowerCase()));
  const selected: Array<[string, string]> = [];
  for (const { name, value } of headers) {
    const lower = name.toLowerCase();
    if (wanted.has(lower)) selected.push([lower, value.trim()]);
  }
  // Array.prototype.sort is stable: repeated headers keep the order received.
  return selected.sort((a, b) => compareCodeUnits(a[0], b[0]));
}
