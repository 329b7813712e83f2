import { refuse } from "../contract/errors.js";
import { DEFAULT_KEY_RULES, MIN_ENTROPY_BITS_FLOOR } from "../contract/keys.js";
import type { FingerprintRules } from "../contract/fingerprint.js";
import type { KeyRules } from "../contract/keys.js";
import type { SnapshotRules } from "../contract/snapshot.js";
import { vocabulary, type WordsOf } from "../contract/words.js";
import { OperationModeSchema, type OperationMode as ProtoOperationMode } from "../gen/idempotency/v1/admin_pb.js";
import { parseDuration, parsePolicyDocument, type PolicyDocument } from "./document.js";

/** How the coordinator treats an operation during rollout and rollback: ENFORCE, SHADOW or DRAINING. */
export type OperationMode = WordsOf<typeof ProtoOperationMode>;
/** The operation modes and their numbers on the wire (src/contract/words.ts). */
export const OPERATION_MODES = vocabulary<OperationMode, ProtoOperationMode>(OperationModeSchema);

/** The operational switches of an operation, changed by operators (not part of a policy revision). */
export interface OperationControl {
  /** ENFORCE, SHADOW (decide and record, `enforced=false`) or DRAINING (no new acceptance). */
  mode: OperationMode;
  /** Writers deployed with an older writer epoch are refused (rollback fence). */
  writerEpoch: number;
}

export const DEFAULT_CONTROL: Readonly<OperationControl> = Object.freeze({ mode: "ENFORCE", writerEpoch: 0 });

/** One schema revision of an operation's rules, as the registry applies them, with the operation's switches. */
export interface OperationPolicy extends OperationControl {
  operation: string;
  apiRevision: number;
  /** Includes the schema revision. */
  fingerprint: FingerprintRules;
  keys: KeyRules;
  lease: { defaultMs: number; maxMs: number };
  retention: {
    /** How long a finished record keeps its snapshot. */
    keepMs: number;
    tombstoneReuse: { allowed: boolean; horizonMs: number };
  };
  /** Most unfinished records one principal may hold for this operation. */
  maxActivePerPrincipal: number;
  snapshot: SnapshotRules;
}

/** Where the registry finds an operation's rules. */
export interface PolicySource {
  /** The newest published revision, or undefined when the operation is not declared at this API revision. */
  current(operation: string, apiRevision: number): Promise<OperationPolicy | undefined>;
  /** One published revision (a record fingerprinted under an older one is judged under it). */
  revision(operation: string, apiRevision: number, schemaRevision: number): Promise<OperationPolicy | undefined>;
}

/** The rules a validated document describes, under the operation's current switches. */
export function toOperationPolicy(document: PolicyDocument, control: OperationControl = DEFAULT_CONTROL): OperationPolicy {
  const ms = (text: string) => parseDuration(text)!;
  const fp = document.fingerprint;
  return {
    operation: document.operation,
    apiRevision: document.apiRevision,
    mode: control.mode,
    writerEpoch: control.writerEpoch,
    fingerprint: {
      schemaRevision: document.schemaRevision,
      queryParameters: fp.queryParameters,
      headers: fp.headers,
      maxBodyBytes: fp.maxBodyBytes,
      payload: fp.mode === "json" ? { mode: "json", json: { root: fp.schema!, maxDepth: fp.maxDepth!, maxBytes: fp.maxBodyBytes } } : { mode: "raw" },
    },
    keys: { ...document.keys },
    lease: { defaultMs: ms(document.lease.default), maxMs: ms(document.lease.max) },
    retention: {
      keepMs: ms(document.retention.keep),
      tombstoneReuse: { allowed: document.retention.tombstoneReuse.allowed, horizonMs: ms(document.retention.tombstoneReuse.horizon) },
    },
    maxActivePerPrincipal: document.maxActivePerPrincipal,
    snapshot: { ...document.snapshot },
  };
}

/**
 * A JSON array of policy documents (IDEM_OPERATIONS), each validated, none
 * declared twice. A deployment may declare its revisions as an older release
 * printed them (`idemctl policy get` wrote every setting, `minEntropyBits: 24`
 * among them): a minEntropyBits that only the older key estimate allowed (24
 * to 63) reads as today's default, as it does in a stored revision
 * (`storedPolicyDocument`), so that the deployment still starts; `notice`
 * receives a line saying so, to be warned at boot.
 */
export function parsePolicyDocuments(input: unknown, notice: (line: string) => void = () => {}): PolicyDocument[] {
  if (!Array.isArray(input)) refuse("INVALID_POLICY", "operations must be a JSON array of policy documents");
  const documents = input.map((entry, index) => parsePolicyDocument(withOlderKeyFloorRead(entry, `operations[${index}]`, notice), `operations[${index}]`));
  const seen = new Set<string>();
  for (const d of documents) {
    const key = `${d.operation}@${d.apiRevision}#${d.schemaRevision}`;
    if (seen.has(key)) refuse("INVALID_POLICY", `operations: ${d.operation} API revision ${d.apiRevision} schema revision ${d.schemaRevision} is declared twice`);
    seen.add(key);
  }
  return documents;
}

/** The older key estimate's default and least minEntropyBits (docs/policies.md, "Key entropy"). */
const OLDER_ESTIMATE_MIN_ENTROPY_BITS = 24;

/** `entry` without a minEntropyBits of the older key estimate (see parsePolicyDocuments). */
function withOlderKeyFloorRead(entry: unknown, path: string, notice: (line: string) => void): unknown {
  if (typeof entry !== "object" || entry === null) return entry;
  const keys = (entry as { keys?: unknown }).keys;
  if (typeof keys !== "object" || keys === null) return entry;
  const { minEntropyBits, ...rest } = keys as Record<string, unknown>;
  if (typeof minEntropyBits !== "number" || !Number.isInteger(minEntropyBits) || minEntropyBits < OLDER_ESTIMATE_MIN_ENTROPY_BITS || minEntropyBits >= MIN_ENTROPY_BITS_FLOOR) {
    return entry;
  }
  notice(
    `${path}.keys.minEntropyBits is ${minEntropyBits}, a value of the older key estimate: applying today's default, ` +
      `${DEFAULT_KEY_RULES.minEntropyBits} (docs/policies.md, "Key entropy"); remove the setting, or set 64 to 1024`,
  );
  return { ...entry, keys: rest };
}

/** Published revisions grouped by operation, oldest first. */
export class RevisionIndex {
  private readonly byOperation = new Map<string, OperationPolicy[]>();

  constructor(policies: Iterable<OperationPolicy>) {
    for (const policy of policies) {
      const key = operationKey(policy.operation, policy.apiRevision);
      const list = this.byOperation.get(key) ?? [];
      list.push(policy);
      this.byOperation.set(key, list);
    }
    for (const list of this.byOperation.values()) list.sort((a, b) => a.fingerprint.schemaRevision - b.fingerprint.schemaRevision);
  }

  has(operation: string, apiRevision: number): boolean {
    return this.byOperation.has(operationKey(operation, apiRevision));
  }

  current(operation: string, apiRevision: number): OperationPolicy | undefined {
    return this.byOperation.get(operationKey(operation, apiRevision))?.at(-1);
  }

  revision(operation: string, apiRevision: number, schemaRevision: number): OperationPolicy | undefined {
    return this.byOperation.get(operationKey(operation, apiRevision))?.find((p) => p.fingerprint.schemaRevision === schemaRevision);
  }
}

/** How an operation at an API revision is keyed in maps. */
export const operationKey = (operation: string, apiRevision: number) => `${operation}@${apiRevision}`;

/**
 * Policies held in memory and fixed for the life of the object: for tests and
 * for services embedding the registry in-process.
 */
export class StaticPolicies implements PolicySource {
  private readonly index: RevisionIndex;

  constructor(policies: readonly OperationPolicy[]) {
    this.index = new RevisionIndex(policies);
  }

  current(operation: string, apiRevision: number): Promise<OperationPolicy | undefined> {
    return Promise.resolve(this.index.current(operation, apiRevision));
  }

  revision(operation: string, apiRevision: number, schemaRevision: number): Promise<OperationPolicy | undefined> {
    return Promise.resolve(this.index.revision(operation, apiRevision, schemaRevision));
  }
}
