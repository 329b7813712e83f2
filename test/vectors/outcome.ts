import { IdempotencyError } from "../../src/contract/errors.js";
import { canonicalRequest, fingerprintOf, type FingerprintRules } from "../../src/contract/fingerprint.js";
import { encodeList, fieldBytes, frame, toHex } from "../../src/contract/frame.js";
import type { FieldSchema } from "../../src/contract/json-schema.js";

/** The rules of one vector, as the file writes them. */
export interface VectorRules {
  schemaRevision: number;
  mode: "raw" | "json";
  queryParameters: string[];
  headers: string[];
  maxBodyBytes: number;
  maxDepth?: number;
  schema?: FieldSchema;
}

/** The request parts of one vector; the body in hex. */
export interface VectorRequest {
  method: string;
  path: string;
  query: string;
  mediaType: string;
  headers: Array<[string, string]>;
  bodyHex: string;
}

/** What this implementation makes of a vector: every canonical part, the framed bytes and the digest, or the refusal. */
export function vectorOutcome(rules: VectorRules, request: VectorRequest): Record<string, unknown> {
  const fingerprintRules: FingerprintRules = {
    schemaRevision: rules.schemaRevision,
    queryParameters: rules.queryParameters,
    headers: rules.headers,
    maxBodyBytes: rules.maxBodyBytes,
    payload: rules.mode === "json" ? { mode: "json", json: { root: rules.schema!, maxDepth: rules.maxDepth!, maxBytes: rules.maxBodyBytes } } : { mode: "raw" },
  };
  try {
    const canonical = canonicalRequest(
      { ...request, headers: request.headers.map(([name, value]) => ({ name, value })), body: Buffer.from(request.bodyHex, "hex") },
      fingerprintRules,
    );
    const framed = frame(
      "idem-fp-v1",
      canonical.method,
      canonical.target,
      canonical.mediaType,
      rules.schemaRevision,
      encodeList(canonical.headers.flatMap(([n, v]) => [fieldBytes(n), fieldBytes(v)])),
      canonical.payload,
    );
    return {
      method: canonical.method,
      target: canonical.target,
      mediaType: canonical.mediaType,
      headers: canonical.headers,
      canonicalPayloadHex: toHex(canonical.payload),
      framedHex: toHex(framed),
      fingerprint: toHex(fingerprintOf(canonical, rules.schemaRevision)),
    };
  } catch (error) {
    if (!(error instanceof IdempotencyError)) throw error;
    return { refusal: { reason: error.reason, ...(error.metadata.path ? { path: error.metadata.path } : {}) } };
  }
}
