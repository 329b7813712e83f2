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

/** What of a response a policy lets the registry keep. */
export interface SnapshotRules {
  /** Header names (lower-case) that may be stored and replayed. */
  headerAllowlist: readonly string[];
  /** Largest body kept, in bytes. */
  maxBodyBytes: number;
}

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
 * An oversize body is refused with `SNAPSHOT_TOO_LARGE`.
 */
export function storedSnapshot(input: Snapshot, rules: SnapshotRules): Snapshot {
  if (!Number.isInteger(input.statusCode) || input.statusCode < 100 || input.statusCode > 599) {
    refuse("INVALID_REQUEST", "snapshot.status_code must be an HTTP status from 100 to 599");
  }
  if (input.body.byteLength > rules.maxBodyBytes) {
    refuse(
      "SNAPSHOT_TOO_LARGE",
      `snapshot.body has ${input.body.byteLength} bytes; this operation stores at most ${rules.maxBodyBytes}`,
      { limit: String(rules.maxBodyBytes) },
    );
  }
  const hopByHop = new Set(
    input.headers
      .filter(([name]) => name.toLowerCase() === "connection")
      .flatMap(([, value]) => value.split(",").map((token) => token.trim().toLowerCase())),
  );
  const allowed = new Set(rules.headerAllowlist.map((n) => n.toLowerCase()));
  const headers = input.headers
    .map(([name, value]): [string, string] => [name.toLowerCase(), value])
    .filter(([name]) => allowed.has(name) && !isNeverStored(name) && !hopByHop.has(name))
    .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  return { ...input, headers };
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
