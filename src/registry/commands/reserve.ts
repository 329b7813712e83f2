import { randomUUID } from "node:crypto";
import { IdempotencyError, refuse } from "../../contract/errors.js";
import { validateKey } from "../../contract/keys.js";
import { scopeDigest, validateApiRevision, validateOperationName, validateSubject } from "../../contract/scope.js";
import type { OperationPolicy } from "../../policy/operations.js";
import { currentPolicy, laneOf, opened, policyOf, type RegistryContext } from "../context.js";
import { commitTogether, sqlState, type Db, type Queryable } from "../db.js";
import { uuidv7 } from "../ids.js";
import { toRecord } from "../rows.js";
import { appendEvent, firstRecord, grantLease, REJUDGED, requestFingerprint, requireTenant } from "../shared.js";
import { pipelined } from "../statement.js";
import * as batchStatements from "../statements/batches.js";
import * as quotaStatements from "../statements/quota.js";
import * as recordStatements from "../statements/records.js";
import { reserveVerdict, retryAfterMs } from "../state-machine.js";
import type { Actor, RequestIdentity, ReserveInput, ReserveResult, StoredRecord } from "../types.js";
import { declaredEffects, registerDeclared } from "./effects.js";

/**
 * Reserve: the acceptance point, where a request's scope gets its record or
 * meets the one it has.
 */

/** How many times Reserve re-reads a record that changed under its compare-and-set before giving up. */
const RESERVE_ROUNDS = 5;

/**
 * The acceptance point. One guarded statement inserts the record or, when
 * the scope exists, returns it; the decision on an existing record that
 * needs a write (takeover, UNKNOWN) is a compare-and-set on the generation
 * it was read at, re-read and re-decided when it lost a race.
 *
 * Statements: the guarded insert, and behind it the principal's quota gate
 * and count (which do nothing unless the insert made a record), pipelined
 * into one round trip; then a conflict logs itself (1 more), a takeover
 * is 1 more, and a scope committed concurrently after the insert's
 * snapshot is re-read (1 more). Each request is one transaction: BEGIN
 * with the tenant binding travels with the first statements, and COMMIT is
 * the second round trip.
 */
export async function reserve(context: RegistryContext, db: Db, input: ReserveInput, actor: Actor): Promise<ReserveResult> {
  const subject = validateSubject(input.subject);
  validateOperationName(input.operation);
  validateApiRevision(input.apiRevision);
  requireTenant(actor, subject.tenant);
  if (!actor.mayOperate(input.operation)) {
    refuse("PERMISSION_DENIED", `this caller is not granted operation ${input.operation}`);
  }
  const policy = await currentPolicy(context, input.operation, input.apiRevision);
  if (input.writerEpoch < policy.writerEpoch) {
    refuse("STALE_WRITER_EPOCH", `writer epoch ${input.writerEpoch} is older than the operation's epoch ${policy.writerEpoch}: this deployment was rolled back; stop writing`, {
      writer_epoch: String(policy.writerEpoch),
    });
  }
  const scope = scopeDigest(input);
  // Judged under the newest revision. A request that fails it may still be a
  // genuine retry of a record made under an older revision: it is then judged
  // under that one, so that publishing new rules never refuses a retry.
  let fp: Uint8Array | undefined;
  let refusal: IdempotencyError | undefined;
  // The key rules say which keys may make a new record. A key they refuse
  // may still name a record made while they were looser (an older release's
  // estimate, a lower minEntropyBits): a retry is judged against that
  // record, because refusing it could lead the client to send the request
  // again under a new key, and run it twice.
  let keyRefusal: IdempotencyError | undefined;
  try {
    validateKey(input.idempotencyKey, policy.keys);
  } catch (error) {
    if (!(error instanceof IdempotencyError) || error.reason !== "INVALID_KEY") throw error;
    keyRefusal = error;
  }
  try {
    fp = requestFingerprint(input.request, policy);
  } catch (error) {
    if (!(error instanceof IdempotencyError) || !REJUDGED.has(error.reason)) throw error;
    refusal = error;
  }
  const leaseMs = grantLease(policy, input.leaseMs);
  const enforced = policy.mode !== "SHADOW";
  // Minted once, outside the retried work: a re-run after a lost COMMIT
  // recognizes its own record by these ids (and its declared effects' attempts by theirs).
  const operationId = uuidv7();
  const acquisitionId = randomUUID();
  const declared = declaredEffects(input);
  const state = input.claim ? "EXECUTING" : "RESERVED";
  const answer = (decision: ReserveResult["decision"], record?: StoredRecord, retryAfterMs?: number): ReserveResult => ({
    decision,
    ...(record ? { record: opened(context, record) } : {}),
    ...(retryAfterMs !== undefined ? { retryAfterMs } : {}),
    enforced,
    schemaRevision: record?.schemaRevision ?? policy.fingerprint.schemaRevision,
  });

  // The new record this request would make, when it may make one.
  const insertable = policy.mode !== "DRAINING" && fp !== undefined && keyRefusal === undefined;
  const newRecord: batchStatements.NewRecord = {
    scope: Buffer.from(scope),
    operationId,
    principal: subject.principal,
    operation: input.operation,
    apiRevision: input.apiRevision,
    schemaRevision: policy.fingerprint.schemaRevision,
    fingerprint: Buffer.from(fp ?? new Uint8Array(32)),
    state,
    leaseMs,
    acquisitionId,
    writerEpoch: input.writerEpoch,
  };
  /** The answer from someone else's record when it needs no write (a replay, an owner at work, an expired record), or undefined. */
  const decideFound = (record: StoredRecord): ReserveResult | undefined => {
    if (record.tombstonedAt !== null || record.schemaRevision !== policy.fingerprint.schemaRevision) return undefined;
    const verdict = reserveVerdict(record, fp!);
    if (verdict.kind === "replay") return answer("REPLAY", record);
    if (verdict.kind === "expired") return answer("EXPIRED", record);
    if (verdict.kind === "in_progress") return answer("IN_PROGRESS", record, retryAfterMs(record, context.recoveryCadenceMs));
    return undefined;
  };
  // The common cases in one round trip with their COMMIT: a new record, or
  // an existing one that needs no write. Anything else (a conflict to log,
  // a takeover, a tombstone, a record committed after the insert's
  // snapshot) is decided in a transaction of its own below.
  const alone = async (): Promise<ReserveResult> => {
    // The fast path commits with its insert; declared effects are registered before that commit.
    if (insertable && declared.length === 0) {
      const found = await withQuota(policy, insertOrFindCommitted(db, subject.tenant, actor.caller, newRecord, policy.maxActivePerPrincipal));
      if (found && (found.inserted || found.record.acquisitionId === acquisitionId)) return answer("ACCEPTED", found.record);
      const answered = found && decideFound(found.record);
      if (answered) return answered;
    }
    return withQuota(policy, decideWithWrites());
  };
  const decideWithWrites = () =>
    db.transaction(
      subject.tenant,
      async (q): Promise<ReserveResult> => {
        /** ACCEPTED, with the declared effects registered on the record (in this transaction). */
        const accepted = async (record: StoredRecord, takenOver = false): Promise<ReserveResult> => {
          const registered = await registerDeclared(q, record, declared, actor);
          return { ...answer("ACCEPTED", registered.record), ...(takenOver ? { takenOver } : {}), ...(declared.length > 0 ? { attempts: registered.attempts } : {}) };
        };
        for (let round = 0; round < RESERVE_ROUNDS; round++) {
          let found: { record: StoredRecord; inserted: boolean } | undefined;
          if (insertable) {
            const admitted = await insertOrFind(q, {
              tenant: subject.tenant,
              scope,
              operationId,
              principal: subject.principal,
              operation: input.operation,
              apiRevision: input.apiRevision,
              schemaRevision: policy.fingerprint.schemaRevision,
              fingerprint: fp!,
              state,
              leaseMs,
              acquisitionId,
              writerEpoch: input.writerEpoch,
              caller: actor.caller,
              quota: policy.maxActivePerPrincipal,
            });
            // Refused before COMMIT: the new record and its event roll back.
            if (admitted?.inserted && admitted.active > policy.maxActivePerPrincipal) refuseQuota(policy);
            found = admitted;
          }
          // The statement's snapshot predates a record committed concurrently
          // (the insert waited for it and found the conflict): read it anew.
          found ??= await findByScope(q, subject.tenant, scope);
          if (!found) {
            const pending = keyRefusal ?? refusal;
            if (pending) throw pending;
            refuse("OPERATION_DRAINING", `operation ${input.operation} is draining: it accepts no new requests`);
          }
          const { record, inserted } = found;
          if (inserted || record.acquisitionId === acquisitionId) return accepted(record);
          // What every compare-and-set below is fenced by: the record as it was read.
          const seen = { tenant: record.tenant, scope: Buffer.from(record.scope), generation: record.generation };

          if (record.tombstonedAt !== null && (await reusable(context, record))) {
            // The policy says old effects cannot reappear and the horizon passed:
            // the scope starts afresh, and one racing reservation wins it.
            const pending = keyRefusal ?? refusal;
            if (pending) throw pending;
            const recycled = await firstRecord(recordStatements.recycleByScope, q, {
              ...seen,
              operationId,
              schemaRevision: policy.fingerprint.schemaRevision,
              fingerprint: Buffer.from(fp!),
              state,
              leaseMs,
              acquisitionId,
              writerEpoch: input.writerEpoch,
              previousOperationId: record.operationId,
              caller: actor.caller,
            });
            if (recycled) {
              // The recycled scope is unfinished again: it counts against the quota like a new record.
              const active = await countActiveUnderGate(q, {
                ...subject,
                operation: input.operation,
                apiRevision: input.apiRevision,
                scope,
                acquisitionId,
                quota: policy.maxActivePerPrincipal,
              });
              if (active > policy.maxActivePerPrincipal) refuseQuota(policy);
              return accepted(recycled);
            }
            continue;
          }
          const sameRevision = record.schemaRevision === policy.fingerprint.schemaRevision;
          if (sameRevision && refusal) throw refusal;
          const recordFp = sameRevision ? fp! : await fingerprintUnder(context, record, input.request);
          const verdict = recordFp ? reserveVerdict(record, recordFp) : ({ kind: "conflict" } as const);
          switch (verdict.kind) {
            case "conflict":
              // Logged for operators (a key reused for another request is a client bug or an attack), never with content.
              await appendEvent(q, record, { kind: "CONFLICT", caller: actor.caller, state: record.state });
              return answer("PAYLOAD_CONFLICT");
            case "expired":
              return answer("EXPIRED", record);
            case "replay":
              return answer("REPLAY", record);
            case "in_progress":
              return answer("IN_PROGRESS", record, retryAfterMs(record, context.recoveryCadenceMs));
            case "takeover": {
              const taken = await firstRecord(recordStatements.takeOverByScope, q, {
                ...seen,
                state,
                leaseMs,
                acquisitionId,
                writerEpoch: input.writerEpoch,
                caller: actor.caller,
              });
              if (taken) return accepted(taken, true);
              break; // someone else moved the record first: re-read and decide again
            }
            case "mark_unknown": {
              const unknown = await firstRecord(recordStatements.markUnknownByScope, q, { ...seen, caller: actor.caller });
              if (unknown) return answer("IN_PROGRESS", unknown, retryAfterMs(unknown, context.recoveryCadenceMs));
              break;
            }
          }
        }
        refuse("REGISTRY_BUSY", "the record kept changing while deciding; nothing was decided, retry with backoff");
      },
      "reserve",
    );
  // A batch decides what needs no write beyond the new record's (a new scope,
  // a replay, an owner at work, an expired record); anything else it leaves
  // to `alone`, as does every request a batch could not take.
  const batchable = context.reserves !== undefined && db.coalescible === true && insertable && declared.length === 0;
  const result = batchable
    ? await context.reserves.submit(laneOf(db, subject.tenant, actor.caller), {
        db,
        tenant: subject.tenant,
        caller: actor.caller,
        record: newRecord,
        quota: policy.maxActivePerPrincipal,
        accepted: (record) => answer("ACCEPTED", record),
        decideFound,
        alone,
      })
    : await alone();
  if (result.decision === "ACCEPTED") await context.hooks.reached("registry.reserve.after-commit");
  return result;
}

/** Whether a tombstone's scope may be reused now: its policy allows it and the horizon passed. */
async function reusable(context: RegistryContext, record: StoredRecord): Promise<boolean> {
  const { allowed, horizonMs } = (await policyOf(context, record)).retention.tombstoneReuse;
  return allowed && record.tombstonedAt!.getTime() + horizonMs <= record.dbNow.getTime();
}

/**
 * The fingerprint of a request under the older revision its record was made
 * under, or undefined when the request is not valid under that revision (so
 * it cannot be the same request: a conflict).
 */
async function fingerprintUnder(context: RegistryContext, record: StoredRecord, request: RequestIdentity): Promise<Uint8Array | undefined> {
  const policy = await policyOf(context, record);
  try {
    return requestFingerprint(request, policy);
  } catch (error) {
    if (error instanceof IdempotencyError && error.reason === "INVALID_PAYLOAD") return undefined;
    throw error;
  }
}

interface NewRecord {
  tenant: string;
  scope: Uint8Array;
  operationId: string;
  principal: string;
  operation: string;
  apiRevision: number;
  schemaRevision: number;
  fingerprint: Uint8Array;
  state: "RESERVED" | "EXECUTING";
  leaseMs: number;
  acquisitionId: string;
  writerEpoch: number;
  caller: string;
  quota: number;
}

/**
 * The guarded insert (statements/records.ts insertOrFind), and behind it the
 * new record counted against its principal's quota (countActiveUnderGate),
 * in the same round trip: the statements are pipelined and PostgreSQL runs
 * them in order. Returns the new record with the principal's unfinished
 * records counting it, the existing one, or nothing (existing but committed
 * after the insert's snapshot).
 */
async function insertOrFind(q: Queryable, r: NewRecord): Promise<{ record: StoredRecord; inserted: boolean; active: number } | undefined> {
  const { quota, ...values } = r;
  const [{ rows }, active] = await pipelined<[{ rows: Record<string, unknown>[] }, number]>([
    recordStatements.insertOrFind.run(q, { ...values, scope: Buffer.from(r.scope), fingerprint: Buffer.from(r.fingerprint) }),
    countActiveUnderGate(q, r),
  ]);
  const row = rows[0];
  return row ? { record: toRecord(row), inserted: row.inserted === true, active } : undefined;
}

/**
 * How many unfinished records the principal has, this transaction's new one
 * included, as its gate row counts them (0 when this transaction made no
 * record of `scope`); over the quota the statement fails (IDQ01). The
 * statement that made the record counted it and locked the gate row until
 * the transaction ends (migrations/000013), so each reservation counts every
 * record admitted before it: of any number of racing reservations, on any
 * number of coordinators, no more than the quota commit. Only new records of
 * one principal and operation wait for each other; replays and other
 * principals never touch the gate.
 */
async function countActiveUnderGate(
  q: Queryable,
  r: { tenant: string; principal: string; operation: string; apiRevision: number; scope: Uint8Array; acquisitionId: string; quota: number },
): Promise<number> {
  const subject = { tenant: r.tenant, principal: r.principal, operation: r.operation, apiRevision: r.apiRevision, scope: Buffer.from(r.scope), acquisitionId: r.acquisitionId };
  const { rows } = await quotaStatements.countActive.run(q, { ...subject, quota: r.quota });
  return rows[0]?.active ?? 0;
}

/**
 * The guarded insert with the quota count behind it, and COMMIT behind
 * them, in one round trip (commitTogether): returns the new record
 * or the existing one (or nothing: see insertOrFind). Over the quota the
 * count fails with IDQ01 and nothing is committed (withQuota refuses).
 */
async function insertOrFindCommitted(
  db: Db,
  tenant: string,
  caller: string,
  record: batchStatements.NewRecord,
  quota: number,
): Promise<{ record: StoredRecord; inserted: boolean } | undefined> {
  const subject = { tenant, principal: record.principal, operation: record.operation, apiRevision: record.apiRevision, scope: record.scope, acquisitionId: record.acquisitionId };
  const [inserted] = await commitTogether(
    db,
    tenant,
    [(q) => recordStatements.insertOrFind.run(q, { ...record, tenant, caller }), (q) => quotaStatements.countActive.run(q, { ...subject, quota })],
    "reserve",
  );
  const row = inserted!.rows[0];
  return row ? { record: toRecord(row), inserted: row.inserted === true } : undefined;
}

/** Turns the quota count's failure (IDQ01: nothing was committed) into the QUOTA_EXCEEDED refusal. */
async function withQuota<T>(policy: OperationPolicy, work: Promise<T>): Promise<T> {
  try {
    return await work;
  } catch (error) {
    if (sqlState(error) === quotaStatements.QUOTA_EXCEEDED_SQLSTATE) refuseQuota(policy);
    throw error;
  }
}

function refuseQuota(policy: OperationPolicy): never {
  refuse("QUOTA_EXCEEDED", `this principal already has ${policy.maxActivePerPrincipal} unfinished ${policy.operation} operations; finish some first`, {
    limit: String(policy.maxActivePerPrincipal),
  });
}

async function findByScope(q: Queryable, tenant: string, scope: Uint8Array): Promise<{ record: StoredRecord; inserted: false } | undefined> {
  const record = await firstRecord(recordStatements.findByScope, q, { tenant, scope: Buffer.from(scope) });
  return record ? { record, inserted: false } : undefined;
}

/** A Reserve waiting for a batch: what its new record would be, and how to answer from a row. */
export interface ReserveItem {
  db: Db;
  tenant: string;
  caller: string;
  record: batchStatements.NewRecord;
  /** The principal's quota of unfinished records under the request's policy. */
  quota: number;
  /** The answer when the row is this request's new record. */
  accepted: (record: StoredRecord) => ReserveResult;
  /** The answer from someone else's record when no write is needed, or undefined to decide alone. */
  decideFound: (record: StoredRecord) => ReserveResult | undefined;
  /** The request decided on its own, in its own transaction. */
  alone: () => Promise<ReserveResult>;
}
