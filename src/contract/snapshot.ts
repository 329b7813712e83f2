import { refuse } from "./errors.js";
import { encodeList, fieldBytes, framedDigest } from "./frame.js";

/** The response an operation's retries replay. */
export interface Snapshot {
  statusCode: number;
  mediaType: string;
  location: string;
  businessVersion: string;
  /** [lower-case name, value], in the order they are replayed. */
  headers: Array<[string, string]>;
  body: Uint8Array;
}

/** What of a response a policy lets the registry keep, and how much of each part. */
export interface SnapshotRules extends SnapshotBounds {
  /** Header names (lower-case) that may be stored and replayed. */
  headerAllowlist: readonly string[];
  /** Largest body kept, in bytes. */
  maxBodyBytes: number;
}

/** Bounds of the stored parts of a snapshot besides its body; sizes are UTF-8 bytes. */
export interface SnapshotBounds {
  /** Most headers stored (after the allowlist; a repeated name counts each time). */
  maxHeaders: number;
  /** Longest stored header name. */
  maxHeaderNameBytes: number;
  /** Longest stored header value. */
  maxHeaderValueBytes: number;
  /** Longest `location`. */
  maxLocationBytes: number;
  /** Longest `business_version`. */
  maxBusinessVersionBytes: number;
  /** Longest `media_type`. */
  maxMediaTypeBytes: number;
}

/**
 * The default bounds (docs/policies.md). Generous for real responses: the
 * longest registered header names have about 40 bytes, servers commonly cap a
 * header at 8 KiB, URLs beyond 2 KiB are not portable, an ETag of a SHA-512
 * takes 130 bytes, and RFC 6838 caps media type and subtype at 127 each. At
 * most they keep about 520 KiB per record besides the body.
 */
export const DEFAULT_SNAPSHOT_BOUNDS: Readonly<SnapshotBounds> = Object.freeze({
  maxHeaders: 64,
  maxHeaderNameBytes: 256,
  maxHeaderValueBytes: 8192,
  maxLocationBytes: 2048,
  maxBusinessVersionBytes: 256,
  maxMediaTypeBytes: 256,
});

/**
 * Headers never stored, whatever a policy allows: they describe one delivery
 * (dates, trace and request ids, connection handling), or they are secrets
 * or one-time tokens that a replay to a retry must not hand out again.
 */
const NEVER_STORED = new Set([
  "date",
  "age",
  "expires",
  "traceparent",
  "tracestate",
  "baggage",
  "b3",
  "uber-trace-id",
  "x-cloud-trace-context",
  "x-amzn-trace-id",
  "x-request-id",
  "x-trace-id",
  "x-correlation-id",
  "request-id",
  "set-cookie",
  "set-cookie2",
  "cookie",
  "authorization",
  "proxy-authorization",
  "proxy-authenticate",
  "www-authenticate",
  "x-csrf-token",
  "x-xsrf-token",
  "csrf-token",
  "x-one-time-token",
  "connection",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "content-length",
  "idempotent-replayed",
]);
const NEVER_STORED_PATTERN = /^x-b3-|-(request|trace|span|correlation)-id$|(^|-)(token|secret|session)(-|$)/;

/** True when a header must never be stored in a snapshot. */
export function isNeverStored(name: string): boolean {
  const lower = name.toLowerCase();
  return NEVER_STORED.has(lower) || NEVER_STORED_PATTERN.test(lower);
}

/**
 * The snapshot to store: only allowlisted headers survive, never the
 * never-stored ones (nor any header a `Connection` header names), names
 * lower-cased and sorted so the digest does not depend on header order.
 * A part of what would be stored beyond its bound (body, media type,
 * location, business version, number of headers, a header's name or value)
 * is refused with `SNAPSHOT_TOO_LARGE`, naming the part and the policy
 * setting; headers that are not stored are not counted.
 */
export function storedSnapshot(input: Snapshot, rules: SnapshotRules): Snapshot {
  if (!Number.isInteger(input.statusCode) || input.statusCode < 100 || input.statusCode > 599) {
    refuse("INVALID_REQUEST", "snapshot.status_code must be an HTTP status from 100 to 599");
  }
  const bounded = (field: string, size: number, limit: number, setting: string, what = `${field} has ${size} bytes`) => {
    if (size > limit) {
      refuse("SNAPSHOT_TOO_LARGE", `${what}; this operation stores at most ${limit} (policy snapshot.${setting})`, { field, limit: String(limit) });
    }
  };
  bounded("snapshot.body", input.body.byteLength, rules.maxBodyBytes, "maxBodyBytes");
  bounded("snapshot.media_type", utf8Bytes(input.mediaType), rules.maxMediaTypeBytes, "maxMediaTypeBytes");
  bounded("snapshot.location", utf8Bytes(input.location), rules.maxLocationBytes, "maxLocationBytes");
  bounded("snapshot.business_version", utf8Bytes(input.businessVersion), rules.maxBusinessVersionBytes, "maxBusinessVersionBytes");
  const hopByHop = new Set(
    input.headers.filter(([name]) => name.toLowerCase() === "connection").flatMap(([, value]) => value.split(",").map((token) => token.trim().toLowerCase())),
  );
  const allowed = new Set(rules.headerAllowlist.map((n) => n.toLowerCase()));
  const headers = input.headers
    .map(([name, value]): [string, string] => [name.toLowerCase(), value])
    .filter(([name]) => allowed.has(name) && !isNeverStored(name) && !hopByHop.has(name))
    .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  bounded("snapshot.headers", headers.length, rules.maxHeaders, "maxHeaders", `snapshot.headers has ${headers.length} headers to store`);
  for (const [name, value] of headers) {
    const nameBytes = utf8Bytes(name);
    bounded("snapshot.headers", nameBytes, rules.maxHeaderNameBytes, "maxHeaderNameBytes", `snapshot.headers: a header name has ${nameBytes} bytes (${name.slice(0, 32)}…)`);
    bounded("snapshot.headers", utf8Bytes(value), rules.maxHeaderValueBytes, "maxHeaderValueBytes", `snapshot.headers[${name}] value has ${utf8Bytes(value)} bytes`);
  }
  return { ...input, headers };
}

function utf8Bytes(text: string): number {
  return Buffer.byteLength(text, "utf8");
}

/**
 * snapshot_digest = SHA-256(frame("idem-snapshot-v1", status, media_type, location,
 *                                 business_version, list(name1, value1, …), body))
 */
export function snapshotDigest(snapshot: Snapshot): Uint8Array {
  return framedDigest(
    "idem-snapshot-v1",
    snapshot.statusCode,
    snapshot.mediaType,
    snapshot.location,
    snapshot.businessVersion,
    encodeList(snapshot.headers.flatMap(([n, v]) => [fieldBytes(n), fieldBytes(v)])),
    snapshot.body,
  );
}
