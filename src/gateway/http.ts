import { IdempotencyError } from "../contract/errors.js";
import { parseStrictJson } from "../contract/json-parse.js";
import { isNeverStored } from "../contract/snapshot.js";
import { check, handlerResponse } from "./arguments.js";
import { MalformedJsonBody } from "./errors.js";
import type { Outcome } from "../contract/words.js";
import type { RequestParts } from "../contract/fingerprint.js";
import type { GatewayRequest } from "./route.js";
import type { HandlerResponse, HttpResponse, ResponseSnapshot } from "./types.js";

/**
 * HTTP on both sides of the gateway: problem details (RFC 9457), the
 * decision-to-status mapping of the contract's section 8, and the
 * conversions between a handler's response and a stored snapshot.
 */

/** The header that marks a replayed response. */
export const REPLAYED_HEADER = "idempotent-replayed";
/** The request header carrying the client's key. */
export const KEY_HEADER = "idempotency-key";

/** Request headers never forwarded: the key travels on its own, the rest is per delivery. */
const NOT_FORWARDED = new Set([KEY_HEADER, "host", "content-type", "accept-encoding", "user-agent"]);

/**
 * The parts of a request the gateway sends for the coordinator to
 * fingerprint: the method upper-cased, path, raw query, media type, the
 * headers to forward (those named in `forwardHeaders`, lower-cased; by
 * default every one but credentials, cookies, hop-by-hop and per-delivery
 * ones and the key itself), each value received in order, and the body.
 */
export function requestParts(request: GatewayRequest, forwardHeaders: ReadonlySet<string> | undefined): RequestParts {
  const headers: Array<{ name: string; value: string }> = [];
  for (const [rawName, value] of Object.entries(request.headers)) {
    const name = rawName.toLowerCase();
    if (value === undefined) continue;
    const wanted = forwardHeaders ? forwardHeaders.has(name) : !NOT_FORWARDED.has(name) && !isNeverStored(name);
    if (!wanted) continue;
    for (const v of typeof value === "string" ? [value] : value) headers.push({ name, value: v });
  }
  return {
    method: request.method.toUpperCase(),
    path: request.path,
    query: request.query,
    mediaType: headerText(request.headers["content-type"]),
    headers,
    body: request.body,
  };
}

/** A header's value as one text: several values joined with ", ", none as "". */
export function headerText(value: string | readonly string[] | undefined): string {
  if (value === undefined) return "";
  return typeof value === "string" ? value : value.join(", ");
}

/** Problem types the gateway answers with; `type` is `<problemTypeBase><slug>`. */
export type ProblemSlug =
  | "idempotency-key-missing"
  | "idempotency-key-invalid"
  | "invalid-payload"
  | "malformed-json"
  | "request-too-large"
  | "unauthenticated"
  | "request-in-progress"
  | "payload-conflict"
  | "result-expired"
  | "too-many-pending-requests"
  | "operation-draining"
  | "coordinator-unavailable"
  | "retryable-failure"
  | "outcome-pending"
  | "outcome-not-recorded"
  | "gateway-misconfigured";

export interface Problem {
  status: number;
  slug: ProblemSlug;
  title: string;
  detail: string;
  /** Seconds, for `Retry-After`. */
  retryAfterSeconds?: number;
  /** Extra headers (Location, Link). */
  headers?: Array<[string, string]>;
  /** Extension members (RFC 9457 section 3.2). */
  extensions?: Record<string, unknown>;
}

/** An `application/problem+json` response. */
export function problemResponse(problem: Problem, typeBase: string): HttpResponse {
  const body = {
    type: `${typeBase}${problem.slug}`,
    title: problem.title,
    status: problem.status,
    detail: problem.detail,
    ...problem.extensions,
  };
  const headers: Array<[string, string]> = [
    ["content-type", "application/problem+json"],
    // A refusal describes this moment, not a resource: never cache it.
    ["cache-control", "no-store"],
  ];
  if (problem.retryAfterSeconds !== undefined) headers.push(["retry-after", String(problem.retryAfterSeconds)]);
  headers.push(...(problem.headers ?? []));
  return { status: problem.status, headers, body: new TextEncoder().encode(JSON.stringify(body)) };
}

/** `Retry-After` seconds for a wait in milliseconds: whole seconds, at least 1. */
export function retryAfterSeconds(ms: number | undefined, fallbackMs = 1000): number {
  return Math.max(1, Math.ceil((ms ?? fallbackMs) / 1000));
}

/** The outcome to complete with for a handler's status, or "release" (retryable, nothing happened). */
export function outcomeForStatus(status: number, effectPossible: boolean): Outcome | "release" {
  if (status >= 500) return effectPossible ? "FAILED_FINAL" : "release";
  if (status >= 400) return effectPossible ? "FAILED_FINAL" : "REJECTED";
  return "SUCCEEDED";
}

/** Headers with a dedicated snapshot field (media type, location, business version) or that are per delivery. */
const FIELD_HEADERS = new Set(["content-type", "location", "etag", "content-length"]);

/**
 * The snapshot of a response: its status, media type, Location, ETag as the
 * business version, its other headers except those that are never stored
 * (Date, trace and request ids, Set-Cookie, …: they describe one delivery)
 * and the body. The coordinator filters again by the policy's allowlist.
 */
export function snapshotOf(response: HttpResponse): ResponseSnapshot {
  const grouped = new Map<string, string[]>();
  for (const [name, value] of response.headers) {
    const lower = name.toLowerCase();
    grouped.set(lower, [...(grouped.get(lower) ?? []), value]);
  }
  const single = (name: string) => grouped.get(name)?.join(", ") ?? "";
  const headers: Array<[string, string]> = [];
  for (const [name, values] of grouped) {
    if (FIELD_HEADERS.has(name) || isNeverStored(name) || name === REPLAYED_HEADER) continue;
    headers.push([name, values.join(", ")]);
  }
  headers.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  return {
    statusCode: response.status,
    mediaType: single("content-type"),
    location: single("location"),
    businessVersion: single("etag"),
    headers,
    body: response.body,
  };
}

/** The response a snapshot replays; `replayed` adds `Idempotent-Replayed: true`. */
export function responseOfSnapshot(snapshot: ResponseSnapshot, replayed: boolean): HttpResponse {
  const headers: Array<[string, string]> = [];
  if (snapshot.mediaType) headers.push(["content-type", snapshot.mediaType]);
  if (snapshot.location) headers.push(["location", snapshot.location]);
  if (snapshot.businessVersion) headers.push(["etag", snapshot.businessVersion]);
  for (const [name, value] of snapshot.headers) {
    if (!FIELD_HEADERS.has(name)) headers.push([name, value]);
  }
  if (replayed) headers.push([REPLAYED_HEADER, "true"]);
  return { status: snapshot.statusCode, headers, body: snapshot.body };
}

/** A handler's response description as concrete HTTP. */
export function toHttpResponse(response: HandlerResponse): HttpResponse {
  check({ name: "toHttpResponse", takes: "(response: { status, headers?, json? | body? })" }, response, "response", handlerResponse);
  const headers: Array<[string, string]> = [];
  for (const [name, value] of Object.entries(response.headers ?? {})) {
    if (value === undefined) continue;
    if (Array.isArray(value)) for (const v of value as readonly string[]) headers.push([name.toLowerCase(), v]);
    else headers.push([name.toLowerCase(), String(value)]);
  }
  let body: Uint8Array;
  if (response.json !== undefined) {
    body = new TextEncoder().encode(JSON.stringify(response.json));
    if (!headers.some(([n]) => n === "content-type")) headers.push(["content-type", "application/json"]);
  } else if (typeof response.body === "string") {
    body = new TextEncoder().encode(response.body);
  } else {
    body = response.body ?? new Uint8Array();
  }
  return { status: response.status, headers, body };
}

/** Flattens Node-style headers (`getHeaders()`, `IncomingHttpHeaders`) into [lower-case name, value] pairs. */
export function headerPairs(headers: Record<string, string | number | readonly string[] | undefined>): Array<[string, string]> {
  const pairs: Array<[string, string]> = [];
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    if (Array.isArray(value)) for (const v of value as readonly string[]) pairs.push([name.toLowerCase(), v]);
    else pairs.push([name.toLowerCase(), String(value)]);
  }
  return pairs;
}

/** True when two responses would give the client the same status and body bytes. */
export function sameStatusAndBody(a: { status: number; body: Uint8Array }, b: { statusCode: number; body: Uint8Array }): boolean {
  return a.status === b.statusCode && Buffer.from(a.body).equals(Buffer.from(b.body));
}

/**
 * The value of the Idempotency-Key header: undefined when absent, "" when
 * unusable (several values). A Structured Fields string (`"…"`, as the IETF
 * draft writes it) is unquoted; a bare token is taken as is.
 */
export function readKeyHeader(value: string | readonly string[] | undefined): string | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== "string") return value.length === 1 ? readKeyHeader(value[0]) : "";
  const text = value.trim();
  const quoted = /^"([^"\\]*)"$/.exec(text);
  if (quoted) return quoted[1]!;
  // Node joins repeated headers with ", "; a key never contains a comma.
  return text.includes(",") ? "" : text;
}

/** True for a JSON media type: `application/json` or `application/<anything>+json`, with or without parameters. */
export function isJsonMediaType(contentType: string): boolean {
  return /^\s*application\/([a-z0-9.!#$&^_-]+\+)?json\s*(;|$)/i.test(contentType);
}

/** Parses a body as JSON the way `ctx.json()` does; throws MalformedJsonBody saying what is wrong and where. */
export function parseJsonBody(body: Uint8Array): unknown {
  const text = Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString("utf8");
  try {
    return JSON.parse(text);
  } catch (error) {
    throw malformedJson(body, error);
  }
}

/**
 * What is wrong with a body JSON.parse refused, and where: the strict parser
 * of the contract (the one JSON-mode fingerprints use) names the JSON path
 * and the byte; JSON.parse's own message when it finds nothing (it refuses
 * whatever JSON.parse refuses, and more).
 */
function malformedJson(body: Uint8Array, parseError: unknown): MalformedJsonBody {
  try {
    parseStrictJson(body, { maxDepth: Number.MAX_SAFE_INTEGER, maxBytes: Number.MAX_SAFE_INTEGER });
  } catch (error) {
    if (error instanceof IdempotencyError) return new MalformedJsonBody(error.message, error.metadata.path ?? "$", { cause: parseError });
  }
  return new MalformedJsonBody(`JSON body at $: ${(parseError as Error).message}`, "$", { cause: parseError });
}
