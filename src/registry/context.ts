import { refuse } from "../contract/errors.js";
import { snapshotDigest, type Snapshot } from "../contract/snapshot.js";
import { openBody, sealBody, type SnapshotKeyring } from "../crypto/sealing.js";
import type { FaultHooks } from "../fault-hooks.js";
import type { OperationPolicy, PolicySource } from "../policy/operations.js";
import type { Coalescer } from "./coalescer.js";
import type { Db, TransactionOptions } from "./db.js";
import type { CompleteItem } from "./commands/complete.js";
import type { ReserveItem } from "./batching.js";
import type { RecordIdentities } from "./identities.js";
import type { SnapshotColumns } from "./statements/records.js";
import type { ReserveResult, StoredRecord } from "./types.js";

/**
 * What the registry's commands, batches and reads share, set once by the
 * Registry: where the operations' rules come from, the key ring of stored
 * bodies, the fault hooks, and the coalescers of concurrent Reserves and
 * Completes with the options of their shared transactions.
 */
export interface RegistryContext {
  /** Where the operations' rules come from (the policy cache). */
  readonly policies: PolicySource;
  /** Seals stored response bodies at rest; without one they are stored as they are. */
  readonly keyring: SnapshotKeyring | undefined;
  /** How often recovery looks at UNKNOWN records: the Retry-After of a request that finds one. */
  readonly recoveryCadenceMs: number;
  /** Longest a gateway may answer exact repeats of a replay from its cache (IDEM_ANSWER_CACHE_MAX_AGE_MS); 0: never. */
  readonly answerCacheMaxAgeMs: number;
  /** Fault tests' hooks at exact steps (src/fault-hooks.ts). */
  readonly hooks: FaultHooks;
  /** The policy revisions of the records recently handed to an owner, for Complete in one round trip. */
  readonly identities: RecordIdentities;
  /** Concurrent Reserves of one lane sharing a transaction; undefined when coalescing is off. */
  readonly reserves: Coalescer<ReserveItem, ReserveResult> | undefined;
  /** Concurrent Completes of one lane sharing a transaction; undefined when coalescing is off. */
  readonly completes: Coalescer<CompleteItem, StoredRecord> | undefined;
  /** How a batch's shared transaction differs: its short wait for row locks. */
  readonly batchTransaction: TransactionOptions;
}

/** The newest revision of an operation's policy, or UNKNOWN_OPERATION. */
export async function currentPolicy(context: RegistryContext, operation: string, apiRevision: number): Promise<OperationPolicy> {
  const policy = await context.policies.current(operation, apiRevision);
  if (!policy) {
    refuse("UNKNOWN_OPERATION", `operation ${operation} at API revision ${apiRevision} has no published policy; publish one (idemctl policy apply)`);
  }
  return policy;
}

/** The policy revision a record lives under (its fingerprint's), with the operation's current switches. */
export async function policyOf(context: RegistryContext, record: StoredRecord): Promise<OperationPolicy> {
  const policy = await context.policies.revision(record.operation, record.apiRevision, record.schemaRevision);
  if (!policy) {
    throw new Error(`policy ${record.operation}@${record.apiRevision} revision ${record.schemaRevision} of a stored record is missing`);
  }
  return policy;
}

/** A record with its response body opened (plaintext), for answers that show it. */
export function opened<T extends { record: StoredRecord }>(context: RegistryContext, view: T): T;
export function opened(context: RegistryContext, record: StoredRecord): StoredRecord;
export function opened(context: RegistryContext, subject: StoredRecord | { record: StoredRecord }): StoredRecord | { record: StoredRecord };
export function opened(context: RegistryContext, subject: StoredRecord | { record: StoredRecord }): StoredRecord | { record: StoredRecord } {
  if ("record" in subject) return { ...subject, record: opened(context, subject.record) };
  const { snapshot } = subject;
  if (!snapshot?.keyId || subject.tombstonedAt !== null) return subject;
  const body = openBody(snapshot.body, snapshot.keyId, context.keyring, subject.tenant, subject.operationId);
  return { ...subject, snapshot: { ...snapshot, body, keyId: null } };
}

/** A stored snapshot as its columns hold it; the body sealed when a key ring is configured. */
export function snapshotColumns(
  context: RegistryContext,
  record: Pick<StoredRecord, "tenant" | "operationId">,
  snapshot: Snapshot,
  digest = snapshotDigest(snapshot),
): Omit<SnapshotColumns, "outcome" | "keepMs"> {
  const sealed = context.keyring ? sealBody(snapshot.body, context.keyring, record.tenant, record.operationId) : undefined;
  return {
    snapshotStatus: snapshot.statusCode,
    snapshotMediaType: snapshot.mediaType,
    snapshotLocation: snapshot.location,
    snapshotBusinessVersion: snapshot.businessVersion,
    snapshotHeaders: JSON.stringify(snapshot.headers),
    snapshotBody: sealed?.sealed ?? Buffer.from(snapshot.body),
    snapshotDigest: Buffer.from(digest),
    snapshotKeyId: sealed?.keyId ?? null,
  };
}

/** Ids of Dbs, so that one lane never mixes two databases. */
const dbIds = new WeakMap<Db, number>();
let nextDbId = 0;

/** The lane of a request: its database, tenant and caller, what one batch transaction is bound to and logs. */
export function laneOf(db: Db, tenant: string, caller: string): string {
  let id = dbIds.get(db);
  if (id === undefined) dbIds.set(db, (id = nextDbId++));
  return JSON.stringify([id, tenant, caller]);
}
