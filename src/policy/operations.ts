import { DEFAULT_KEY_RULES, type KeyRules } from "../contract/keys.js";
import type { FingerprintRules } from "../contract/fingerprint.js";
import type { SnapshotRules } from "../contract/snapshot.js";
import { validateApiRevision, validateOperationName } from "../contract/scope.js";
import { IdempotencyError } from "../contract/errors.js";

/** How the coordinator treats an operation during rollout and rollback. */
export type OperationMode = "ENFORCE" | "SHADOW" | "DRAINING";

/** The rules of one operation at one API revision. */
export interface OperationPolicy {
  operation: string;
  apiRevision: number;
  /** ENFORCE, SHADOW (decide and record, `enforced=false`) or DRAINING (no new acceptance). */
  mode: OperationMode;
  /** Writers deployed with an older writer epoch are refused (rollback fence). */
  writerEpoch: number;
  fingerprint: FingerprintRules;
  keys: KeyRules;
  lease: { defaultMs: number; maxMs: number };
  /** How long a finished record keeps its snapshot. */
  retentionMs: number;
  /** Most unfinished records one principal may hold for this operation. */
  maxActivePerPrincipal: number;
  snapshot: SnapshotRules;
}

/** Where the registry and the server find an operation's policy. */
export interface PolicySource {
  /** The policy, or undefined when the operation is not declared at this revision. */
  get(operation: string, apiRevision: number): OperationPolicy | undefined;
}

/** Policies declared in configuration, fixed for the life of the process. */
export class StaticPolicies implements PolicySource {
  private readonly byKey = new Map<string, OperationPolicy>();

  constructor(policies: readonly OperationPolicy[]) {
    for (const policy of policies) {
      const key = `${policy.operation}@${policy.apiRevision}`;
      if (this.byKey.has(key)) {
        throw new PolicyError(`operations: ${key} is declared twice`);
      }
      this.byKey.set(key, policy);
    }
  }

  get(operation: string, apiRevision: number): OperationPolicy | undefined {
    return this.byKey.get(`${operation}@${apiRevision}`);
  }

  list(): OperationPolicy[] {
    return [...this.byKey.values()];
  }
}

/** A policy declaration that cannot be used, with the path of the offending field. */
export class PolicyError extends Error {
  override readonly name = "PolicyError";
}

const DEFAULT_HEADER_ALLOWLIST = ["content-type", "content-language", "etag", "location", "cache-control"];
const MIB = 1024 * 1024;

/**
 * Reads operation declarations (a JSON array; see README "Configuration"),
 * filling defaults and refusing anything that would loosen the contract.
 */
export function parseOperationPolicies(input: unknown): OperationPolicy[] {
  if (!Array.isArray(input)) throw new PolicyError("operations must be a JSON array of operation declarations");
  const policies = input.map((entry, index) => parseOne(entry, `operations[${index}]`));
  new StaticPolicies(policies); // refuses an operation declared twice
  return policies;
}

function parseOne(entry: unknown, path: string): OperationPolicy {
  const o = object(entry, path);
  allowOnly(o, path, [
    "operation",
    "apiRevision",
    "schemaRevision",
    "mode",
    "writerEpoch",
    "fingerprint",
    "keys",
    "lease",
    "retentionHours",
    "maxActivePerPrincipal",
    "snapshot",
  ]);
  const operation = string(o.operation, `${path}.operation`);
  const apiRevision = integer(o.apiRevision, `${path}.apiRevision`, 1, 65535);
  guard(() => validateOperationName(operation, `${path}.operation`));
  guard(() => validateApiRevision(apiRevision, `${path}.apiRevision`));

  const fp = object(o.fingerprint ?? {}, `${path}.fingerprint`);
  allowOnly(fp, `${path}.fingerprint`, ["mode", "queryParameters", "headers", "maxBodyBytes"]);
  if (fp.mode !== undefined && fp.mode !== "raw") {
    throw new PolicyError(`${path}.fingerprint.mode: only "raw" is supported by this version`);
  }
  const keys = object(o.keys ?? {}, `${path}.keys`);
  allowOnly(keys, `${path}.keys`, ["minLength", "maxLength", "minEntropyBits"]);
  const lease = object(o.lease ?? {}, `${path}.lease`);
  allowOnly(lease, `${path}.lease`, ["defaultSeconds", "maxSeconds"]);
  const snapshot = object(o.snapshot ?? {}, `${path}.snapshot`);
  allowOnly(snapshot, `${path}.snapshot`, ["headerAllowlist", "maxBodyBytes"]);

  const defaultLeaseSeconds = integer(lease.defaultSeconds ?? 30, `${path}.lease.defaultSeconds`, 1, 3600);
  const maxLeaseSeconds = integer(lease.maxSeconds ?? 300, `${path}.lease.maxSeconds`, defaultLeaseSeconds, 86400);
  const mode = o.mode ?? "ENFORCE";
  if (mode !== "ENFORCE" && mode !== "SHADOW" && mode !== "DRAINING") {
    throw new PolicyError(`${path}.mode must be ENFORCE, SHADOW or DRAINING`);
  }

  return {
    operation,
    apiRevision,
    mode,
    writerEpoch: integer(o.writerEpoch ?? 0, `${path}.writerEpoch`, 0, Number.MAX_SAFE_INTEGER),
    fingerprint: {
      schemaRevision: integer(o.schemaRevision ?? 1, `${path}.schemaRevision`, 1, 65535),
      payload: "raw",
      queryParameters: strings(fp.queryParameters ?? [], `${path}.fingerprint.queryParameters`),
      headers: strings(fp.headers ?? [], `${path}.fingerprint.headers`).map((h) => h.toLowerCase()),
      maxBodyBytes: integer(fp.maxBodyBytes ?? MIB, `${path}.fingerprint.maxBodyBytes`, 0, 16 * MIB),
    },
    // Policies may only tighten the default key rules, never loosen them.
    keys: {
      minLength: integer(keys.minLength ?? DEFAULT_KEY_RULES.minLength, `${path}.keys.minLength`, DEFAULT_KEY_RULES.minLength, DEFAULT_KEY_RULES.maxLength),
      maxLength: integer(keys.maxLength ?? DEFAULT_KEY_RULES.maxLength, `${path}.keys.maxLength`, DEFAULT_KEY_RULES.minLength, DEFAULT_KEY_RULES.maxLength),
      minEntropyBits: integer(keys.minEntropyBits ?? DEFAULT_KEY_RULES.minEntropyBits, `${path}.keys.minEntropyBits`, DEFAULT_KEY_RULES.minEntropyBits, 1024),
    },
    lease: { defaultMs: defaultLeaseSeconds * 1000, maxMs: maxLeaseSeconds * 1000 },
    retentionMs: integer(o.retentionHours ?? 72, `${path}.retentionHours`, 1, 24 * 3650) * 3600 * 1000,
    maxActivePerPrincipal: integer(o.maxActivePerPrincipal ?? 1000, `${path}.maxActivePerPrincipal`, 1, 1_000_000),
    snapshot: {
      headerAllowlist: strings(snapshot.headerAllowlist ?? DEFAULT_HEADER_ALLOWLIST, `${path}.snapshot.headerAllowlist`).map((h) => h.toLowerCase()),
      maxBodyBytes: integer(snapshot.maxBodyBytes ?? MIB, `${path}.snapshot.maxBodyBytes`, 0, 16 * MIB),
    },
  };
}

function guard(check: () => void): void {
  try {
    check();
  } catch (error) {
    if (error instanceof IdempotencyError) throw new PolicyError(error.message);
    throw error;
  }
}

function object(value: unknown, path: string): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new PolicyError(`${path} must be an object`);
  }
  return value as Record<string, unknown>;
}

function allowOnly(o: Record<string, unknown>, path: string, known: readonly string[]): void {
  for (const key of Object.keys(o)) {
    if (!known.includes(key)) {
      throw new PolicyError(`${path}.${key} is not a known setting (known: ${known.join(", ")})`);
    }
  }
}

function string(value: unknown, path: string): string {
  if (typeof value !== "string" || value.length === 0) throw new PolicyError(`${path} must be a non-empty string`);
  return value;
}

function strings(value: unknown, path: string): string[] {
  if (!Array.isArray(value)) throw new PolicyError(`${path} must be an array of strings`);
  const seen = new Set<string>();
  return value.map((item, i) => {
    const s = string(item, `${path}[${i}]`);
    if (seen.has(s.toLowerCase())) throw new PolicyError(`${path} lists '${s}' twice`);
    seen.add(s.toLowerCase());
    return s;
  });
}

function integer(value: unknown, path: string, min: number, max: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    throw new PolicyError(`${path} must be an integer from ${min} to ${max}`);
  }
  return value;
}
