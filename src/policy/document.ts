import { createHash } from "node:crypto";
import { IdempotencyError, refuse } from "../contract/errors.js";
import type { FieldSchema, FieldType } from "../contract/json-schema.js";
import { DEFAULT_KEY_RULES, MIN_ENTROPY_BITS_FLOOR } from "../contract/keys.js";
import { DEFAULT_SNAPSHOT_BOUNDS, type SnapshotBounds } from "../contract/snapshot.js";
import { validateApiRevision, validateOperationName } from "../contract/scope.js";

/**
 * A policy revision as people write it (YAML or JSON, docs/policies.md) and as
 * the registry stores it: after `parsePolicyDocument`, every default is filled
 * in and every duration is in its canonical text form, so that equal rules
 * have equal documents and equal digests.
 */
export interface PolicyDocument {
  operation: string;
  apiRevision: number;
  schemaRevision: number;
  fingerprint: {
    mode: "raw" | "json";
    queryParameters: string[];
    headers: string[];
    maxBodyBytes: number;
    /** JSON mode only. */
    maxDepth?: number;
    /** JSON mode only. */
    schema?: FieldSchema;
  };
  keys: { minLength: number; maxLength: number; minEntropyBits: number };
  lease: { default: string; max: string };
  retention: {
    keep: string;
    clientRetryWindow: string;
    queueBacklogWindow: string;
    reconciliationWindow: string;
    backupRestoreWindow: string;
    tombstoneReuse: { allowed: boolean; horizon: string };
  };
  maxActivePerPrincipal: number;
  snapshot: { headerAllowlist: string[]; maxBodyBytes: number } & SnapshotBounds;
}

const MIB = 1024 * 1024;
const KIB = 1024;
/** Each snapshot bound and the most a policy may raise it to (the least is 1). */
const SNAPSHOT_BOUND_RANGES: ReadonlyArray<[keyof SnapshotBounds, number]> = [
  ["maxHeaders", 1024],
  ["maxHeaderNameBytes", 4 * KIB],
  ["maxHeaderValueBytes", 64 * KIB],
  ["maxLocationBytes", 64 * KIB],
  ["maxBusinessVersionBytes", 8 * KIB],
  ["maxMediaTypeBytes", 4 * KIB],
];
const DEFAULT_HEADER_ALLOWLIST = ["cache-control", "content-language", "content-type", "etag", "location"];
const FIELD_TYPES: readonly FieldType[] = ["string", "boolean", "integer", "decimal", "number", "object", "array"];

/**
 * Validates a policy revision and fills its defaults. Anything unknown,
 * malformed, or looser than the contract allows is refused with
 * INVALID_POLICY and the path of the offending field.
 */
export function parsePolicyDocument(input: unknown, path = "policy"): PolicyDocument {
  const o = object(input, path);
  // Every setting is read even after one was refused, so that a document's author
  // learns every problem of it at once, each with its path.
  const problems: IdempotencyError[] = [];
  const part = <T>(read: () => T, fallback: T): T => {
    try {
      return read();
    } catch (error) {
      if (!(error instanceof IdempotencyError) || error.reason !== "INVALID_POLICY") throw error;
      problems.push(error);
      return fallback;
    }
  };
  part(() => allowOnly(o, path, ["operation", "apiRevision", "schemaRevision", "fingerprint", "keys", "lease", "retention", "maxActivePerPrincipal", "snapshot"]), undefined);
  const operation = part(() => {
    const name = string(o.operation, `${path}.operation`);
    guard(`${path}.operation`, () => validateOperationName(name));
    return name;
  }, "");
  const apiRevision = part(() => {
    const revision = integer(o.apiRevision, `${path}.apiRevision`, 1, 65535);
    guard(`${path}.apiRevision`, () => validateApiRevision(revision));
    return revision;
  }, 1);
  const schemaRevision = part(() => integer(o.schemaRevision ?? 1, `${path}.schemaRevision`, 1, 65535), 1);
  const fingerprint = part(() => fingerprintRules(o.fingerprint ?? {}, `${path}.fingerprint`), { mode: "raw", queryParameters: [], headers: [], maxBodyBytes: MIB });

  const keys = part(() => object(o.keys ?? {}, `${path}.keys`), {});
  part(() => allowOnly(keys, `${path}.keys`, ["minLength", "maxLength", "minEntropyBits"]), undefined);
  const leaseSettings = part(() => object(o.lease ?? {}, `${path}.lease`), {});
  part(() => allowOnly(leaseSettings, `${path}.lease`, ["default", "max"]), undefined);
  const leaseDefault = part(() => duration(leaseSettings.default ?? "30s", `${path}.lease.default`, 1000, 3600_000), 30_000);
  const leaseMax = part(() => duration(leaseSettings.max ?? "5m", `${path}.lease.max`, leaseDefault, 86_400_000), 300_000);

  const snapshot = part(() => object(o.snapshot ?? {}, `${path}.snapshot`), {});
  part(() => allowOnly(snapshot, `${path}.snapshot`, ["headerAllowlist", "maxBodyBytes", ...SNAPSHOT_BOUND_RANGES.map(([name]) => name)]), undefined);

  const document: PolicyDocument = {
    operation,
    apiRevision,
    schemaRevision,
    fingerprint,
    // Policies may only tighten the default key lengths. The entropy floor may
    // also be lowered, for clients whose random keys are shorter than 128
    // bits, but never below the point where counters and dates pass.
    keys: {
      minLength: part(
        () => integer(keys.minLength ?? DEFAULT_KEY_RULES.minLength, `${path}.keys.minLength`, DEFAULT_KEY_RULES.minLength, DEFAULT_KEY_RULES.maxLength),
        DEFAULT_KEY_RULES.minLength,
      ),
      maxLength: part(
        () => integer(keys.maxLength ?? DEFAULT_KEY_RULES.maxLength, `${path}.keys.maxLength`, DEFAULT_KEY_RULES.minLength, DEFAULT_KEY_RULES.maxLength),
        DEFAULT_KEY_RULES.maxLength,
      ),
      minEntropyBits: part(
        () => integer(keys.minEntropyBits ?? DEFAULT_KEY_RULES.minEntropyBits, `${path}.keys.minEntropyBits`, MIN_ENTROPY_BITS_FLOOR, 1024),
        DEFAULT_KEY_RULES.minEntropyBits,
      ),
    },
    lease: { default: formatDuration(leaseDefault), max: formatDuration(leaseMax) },
    retention: part(() => retention(o.retention ?? {}, `${path}.retention`), retention({}, `${path}.retention`)),
    maxActivePerPrincipal: part(() => integer(o.maxActivePerPrincipal ?? 1000, `${path}.maxActivePerPrincipal`, 1, 1_000_000), 1000),
    snapshot: {
      headerAllowlist: part(() => strings(snapshot.headerAllowlist ?? DEFAULT_HEADER_ALLOWLIST, `${path}.snapshot.headerAllowlist`, true).sort(), []),
      maxBodyBytes: part(() => integer(snapshot.maxBodyBytes ?? MIB, `${path}.snapshot.maxBodyBytes`, 0, 16 * MIB), MIB),
      ...(Object.fromEntries(
        SNAPSHOT_BOUND_RANGES.map(([name, max]) => [
          name,
          part(() => integer(snapshot[name] ?? DEFAULT_SNAPSHOT_BOUNDS[name], `${path}.snapshot.${name}`, 1, max), DEFAULT_SNAPSHOT_BOUNDS[name]),
        ]),
      ) as unknown as SnapshotBounds),
    },
  };
  if (problems.length === 1) throw problems[0]!;
  if (problems.length > 1) {
    refuse("INVALID_POLICY", `${path} has ${problems.length} problems:\n  - ${problems.map((p) => p.message).join("\n  - ")}`, {
      path: String(problems[0]!.metadata.path ?? path),
    });
  }
  return document;
}

/** The fingerprint settings: what identifies a request, and the body's field schema in json mode. */
function fingerprintRules(input: unknown, path: string): PolicyDocument["fingerprint"] {
  const fp = object(input, path);
  allowOnly(fp, path, ["mode", "queryParameters", "headers", "maxBodyBytes", "maxDepth", "schema"]);
  const mode = fp.mode ?? "raw";
  if (mode !== "raw" && mode !== "json") invalid(`${path}.mode`, 'must be "raw" or "json"');
  const fingerprint: PolicyDocument["fingerprint"] = {
    mode,
    queryParameters: strings(fp.queryParameters ?? [], `${path}.queryParameters`, false).sort(),
    headers: strings(fp.headers ?? [], `${path}.headers`, true).sort(),
    maxBodyBytes: integer(fp.maxBodyBytes ?? MIB, `${path}.maxBodyBytes`, 0, 16 * MIB),
  };
  if (mode === "json") {
    fingerprint.maxDepth = integer(fp.maxDepth ?? 32, `${path}.maxDepth`, 1, 256);
    if (fp.schema === undefined) invalid(`${path}.schema`, "is required in json mode: the field schema of the body");
    fingerprint.schema = fieldSchema(fp.schema, `${path}.schema`, 1, fingerprint.maxDepth);
  } else {
    if (fp.schema !== undefined) invalid(`${path}.schema`, 'is only meaningful with mode "json"');
    if (fp.maxDepth !== undefined) invalid(`${path}.maxDepth`, 'is only meaningful with mode "json"');
  }
  return fingerprint;
}

function retention(input: unknown, path: string): PolicyDocument["retention"] {
  const r = object(input, path);
  allowOnly(r, path, ["keep", "clientRetryWindow", "queueBacklogWindow", "reconciliationWindow", "backupRestoreWindow", "tombstoneReuse"]);
  const window = (name: string, fallback: string) => duration(r[name] ?? fallback, `${path}.${name}`, 0, 3650 * 86_400_000);
  const clientRetry = window("clientRetryWindow", "24h");
  const queueBacklog = window("queueBacklogWindow", "1h");
  const reconciliation = window("reconciliationWindow", "24h");
  const backupRestore = window("backupRestoreWindow", "24h");
  const keep = duration(r.keep ?? "72h", `${path}.keep`, 1000, 3650 * 86_400_000);
  // A record must outlive every way the same request can come back: a client
  // still retrying (after waiting in a queue), a reconciliation, a restore.
  const needed = Math.max(clientRetry + queueBacklog, reconciliation, backupRestore);
  if (keep < needed) {
    invalid(
      `${path}.keep`,
      `is ${formatDuration(keep)}, shorter than the windows it must cover (${formatDuration(needed)}: the longest of ` +
        "clientRetryWindow + queueBacklogWindow, reconciliationWindow, backupRestoreWindow)",
    );
  }
  const reuse = object(r.tombstoneReuse ?? {}, `${path}.tombstoneReuse`);
  allowOnly(reuse, `${path}.tombstoneReuse`, ["allowed", "horizon"]);
  const allowed = boolean(reuse.allowed ?? false, `${path}.tombstoneReuse.allowed`);
  const horizon = duration(reuse.horizon ?? "0s", `${path}.tombstoneReuse.horizon`, 0, 36500 * 86_400_000);
  if (allowed && horizon < needed) {
    invalid(`${path}.tombstoneReuse.horizon`, `must be at least ${formatDuration(needed)} (the windows retention covers) when reuse is allowed`);
  }
  return {
    keep: formatDuration(keep),
    clientRetryWindow: formatDuration(clientRetry),
    queueBacklogWindow: formatDuration(queueBacklog),
    reconciliationWindow: formatDuration(reconciliation),
    backupRestoreWindow: formatDuration(backupRestore),
    tombstoneReuse: { allowed, horizon: formatDuration(horizon) },
  };
}

function fieldSchema(input: unknown, path: string, depth: number, maxDepth: number): FieldSchema {
  const s = object(input, path);
  allowOnly(s, path, ["type", "nullable", "nullEqualsAbsent", "fingerprint", "required", "scale", "properties", "items", "set"]);
  const type = s.type;
  if (typeof type !== "string" || !FIELD_TYPES.includes(type as FieldType)) invalid(`${path}.type`, `must be one of ${FIELD_TYPES.join(", ")}`);
  const only = (field: string, forType: FieldType) => {
    if (s[field] !== undefined && type !== forType) invalid(`${path}.${field}`, `is only meaningful for type ${forType}`);
  };
  only("scale", "decimal");
  only("properties", "object");
  only("items", "array");
  only("set", "array");
  const schema: FieldSchema = { type: type as FieldType };
  // Only non-default flags are kept, so that equal schemas have one form.
  if (boolean(s.nullable ?? false, `${path}.nullable`)) schema.nullable = true;
  if (boolean(s.nullEqualsAbsent ?? false, `${path}.nullEqualsAbsent`)) {
    if (!schema.nullable) invalid(`${path}.nullEqualsAbsent`, "needs nullable: true");
    schema.nullEqualsAbsent = true;
  }
  if (!boolean(s.fingerprint ?? true, `${path}.fingerprint`)) schema.fingerprint = false;
  if (boolean(s.required ?? false, `${path}.required`)) schema.required = true;
  if (type === "decimal") {
    const scale = s.scale ?? "significant";
    if (scale !== "significant" && scale !== "normalized") invalid(`${path}.scale`, 'must be "significant" or "normalized"');
    if (scale === "normalized") schema.scale = "normalized";
  }
  if (type === "object" || type === "array") {
    if (depth >= maxDepth) invalid(path, `nests deeper than fingerprint.maxDepth (${maxDepth})`);
  }
  if (type === "object") {
    const properties = object(s.properties ?? {}, `${path}.properties`);
    schema.properties = {};
    for (const name of Object.keys(properties).sort()) {
      if (name.length === 0) invalid(`${path}.properties`, "has an empty member name");
      schema.properties[name] = fieldSchema(properties[name], `${path}.properties.${name}`, depth + 1, maxDepth);
    }
  }
  if (type === "array") {
    if (s.items === undefined) invalid(`${path}.items`, "is required for type array");
    schema.items = fieldSchema(s.items, `${path}.items`, depth + 1, maxDepth);
    if (boolean(s.set ?? false, `${path}.set`)) schema.set = true;
  }
  return schema;
}

/**
 * The document the registry stored, read under today's rules. Revisions are
 * never rewritten in the database, so one published by an older release may
 * predate a rule that changed since; it is brought up to date here, on every
 * read, so that every replica applies the same rules and a deployment that
 * declares the same revision again (IDEM_OPERATIONS, or the embedded default
 * at every `npm start`) finds it equal rather than refused as changed:
 *
 * - `keys.minEntropyBits` was once measured by another estimate (length times
 *   the Shannon entropy of the key's characters), whose default and least
 *   value were 24. A stored value below today's floor can only come from it,
 *   and means "the default": it becomes today's default. Larger values were
 *   chosen to be stricter than that default and are kept as they are.
 *
 * - the snapshot bounds besides `maxBodyBytes` did not exist: a revision
 *   without them gets today's defaults, as it would had it been published
 *   now.
 *
 * Returns `stored` itself when nothing changed.
 */
export function storedPolicyDocument(stored: PolicyDocument): PolicyDocument {
  let document = stored;
  if (document.keys.minEntropyBits < MIN_ENTROPY_BITS_FLOOR) {
    document = { ...document, keys: { ...document.keys, minEntropyBits: DEFAULT_KEY_RULES.minEntropyBits } };
  }
  if (SNAPSHOT_BOUND_RANGES.some(([name]) => document.snapshot[name] === undefined)) {
    document = { ...document, snapshot: { ...DEFAULT_SNAPSHOT_BOUNDS, ...document.snapshot } };
  }
  return document;
}

/** SHA-256 of a document's canonical JSON (keys sorted): equal rules, equal digest. */
export function policyDigest(document: PolicyDocument): Uint8Array {
  return new Uint8Array(createHash("sha256").update(stableJson(document)).digest());
}

function stableJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(stableJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>).filter(([, v]) => v !== undefined);
    entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${stableJson(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

const UNITS: ReadonlyArray<[string, number]> = [
  ["d", 86_400_000],
  ["h", 3_600_000],
  ["m", 60_000],
  ["s", 1000],
  ["ms", 1],
];

/** Milliseconds of a duration written as `<integer><unit>`, unit one of ms, s, m, h, d. */
export function parseDuration(text: string): number | undefined {
  const match = /^(\d{1,12})(ms|s|m|h|d)$/.exec(text);
  if (!match) return undefined;
  return Number(match[1]) * UNITS.find(([unit]) => unit === match[2])![1];
}

/** The canonical text of a duration: its largest exact unit (`90000` → `90s`, `3600000` → `1h`). */
export function formatDuration(ms: number): string {
  if (ms === 0) return "0s";
  const [unit, size] = UNITS.find(([, size]) => ms % size === 0)!;
  return `${ms / size}${unit}`;
}

function duration(value: unknown, path: string, min: number, max: number): number {
  const ms = typeof value === "string" ? parseDuration(value) : undefined;
  if (ms === undefined) invalid(path, 'must be a duration such as "30s", "15m", "72h" or "7d"');
  if (ms < min || ms > max) invalid(path, `must be from ${formatDuration(min)} to ${formatDuration(max)}`);
  return ms;
}

function invalid(path: string, problem: string): never {
  refuse("INVALID_POLICY", `${path} ${problem}`, { path });
}

function guard(path: string, check: () => void): void {
  try {
    check();
  } catch (error) {
    invalid(path, `is invalid: ${(error as Error).message}`);
  }
}

function object(value: unknown, path: string): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) invalid(path, "must be an object");
  return value as Record<string, unknown>;
}

function allowOnly(o: Record<string, unknown>, path: string, known: readonly string[]): void {
  for (const key of Object.keys(o)) {
    if (!known.includes(key)) invalid(`${path}.${key}`, `is not a known setting (known: ${known.join(", ")})`);
  }
}

function string(value: unknown, path: string): string {
  if (typeof value !== "string" || value.length === 0) invalid(path, "must be a non-empty string");
  return value;
}

function strings(value: unknown, path: string, lowerCase: boolean): string[] {
  if (!Array.isArray(value)) invalid(path, "must be an array of strings");
  const seen = new Set<string>();
  return value.map((item, i) => {
    const s = string(item, `${path}[${i}]`);
    const normalized = lowerCase ? s.toLowerCase() : s;
    if (seen.has(normalized)) invalid(path, `lists '${s}' twice`);
    seen.add(normalized);
    return normalized;
  });
}

function integer(value: unknown, path: string, min: number, max: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    invalid(path, `must be an integer from ${min} to ${max}`);
  }
  return value;
}

function boolean(value: unknown, path: string): boolean {
  if (typeof value !== "boolean") invalid(path, "must be true or false");
  return value;
}
