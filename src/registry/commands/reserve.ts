import { randomUUID } from "node:crypto";
import { IdempotencyError, refuse } from "../../contract/errors.js";
import { validateKey } from "../../contract/keys.js";
import { scopeDigest, validateApiRevision, validateOperationName, validateSubject } from "../../contract/scope.js";
import type { OperationPolicy } from "../../policy/operations.js";
import { admit, admitCommitted, type Admission } from "../admission.js";
import { currentPolicy, laneOf, opened, policyOf, type RegistryContext } from "../context.js";
import { sqlState, type Db, type Queryable } from "../db.js";
import { uuidv7 } from "../ids.js";
import { appendEvent, firstRecord, grantLease, requireOperation, requireTenant } from "../shared.js";
import * as quotaStatements from "../statements/quota.js";
import * as recordStatements from "../statements/records.js";
import {
  REJUDGED,
  replayCacheableForMs,
  requestFingerprint,
  reserveAction,
  retryAfterMs,
  type ReserveAction,
  type ReserveOutcome,
  type ReserveRequest,
  type ScopeRead,
} from "../state-machine.js";
import type { Actor, ReserveInput, ReserveResult, StoredRecord } from "../types.js";
import { declaredEffects, registerDeclared, type DeclaredEffect } from "./effects.js";

/**
 * Reserve, the acceptance point: the request's scope gets its record, or the
 * request is answered from the one it has. What to do is decided by the
 * pure rules of state-machine.ts (reserveAction); this module reads what
 * they judge and carries out what they decide.
 */

/** How many times Reserve re-reads a record that changed under its compare-and-set before giving up. */
const RESERVE_ROUNDS = 5;

/** A Reserve once validated and judged under its operation's newest policy: what deciding and answering it takes. */
interface Judged {
  tenant: string;
  actor: Actor;
  policy: OperationPolicy;
  request: ReserveRequest;
  /** The record this request would make (with a zero fingerprint when the newest revision refuses it: then it makes none). */
  record: recordStatements.NewRecord;
  /** Its admission, when it may make a new record: not draining, its key and its payload accepted. */
  admission: Admission | undefined;
  declared: DeclaredEffect[];
  /** Its answer, with what the client is shown of `record`. */
  answer(decision: ReserveResult["decision"], record?: StoredRecord, retryAfterMs?: number): ReserveResult;
}

/**
 * The acceptance point. One guarded statement inserts the record or, when
 * the scope exists, returns it; the decision on an existing record that
 * needs a write (takeover, UNKNOWN) is a compare-and-set on the generation
 * it was read at, re-read and re-decided when it lost a race.
 *
 * Statements: the guarded insert, which also counts a new record against
 * its principal's quota; then a conflict logs itself (1 more), a takeover
 * is 1 more, and a scope committed concurrently after the insert's
 * snapshot is re-read (1 more). Each request is one transaction: BEGIN
 * with the tenant binding travels with the first statement, and COMMIT is
 * the second round trip.
 */
export async function reserve(context: RegistryContext, db: Db, input: ReserveInput, actor: Actor): Promise<ReserveResult> {
  const judged = await judge(context, input, actor);
  // A batch decides what needs no write beyond the new record's (a new scope,
  // a replay, an owner at work, an expired record); anything else it leaves
  // to `alone`, as does every request a batch could not take.
  const { admission } = judged;
  const result =
    context.reserves !== undefined && db.coalescible === true && admission && judged.declared.length === 0
      ? await context.reserves.submit(laneOf(db, judged.tenant, actor.caller), {
          db,
          tenant: judged.tenant,
          caller: actor.caller,
          admission,
          answer: (read) => answerShared(context, judged, read),
          alone: () => decideAlone(context, db, judged),
        })
      : await decideAlone(context, db, judged);
  if (result.decision === "ACCEPTED") await context.hooks.reached("registry.reserve.after-commit");
  return result;
}

/** Validates a Reserve and judges it under its operation's newest policy revision. */
async function judge(context: RegistryContext, input: ReserveInput, actor: Actor): Promise<Judged> {
  const subject = validateSubject(input.subject);
  validateOperationName(input.operation);
  validateApiRevision(input.apiRevision);
  requireTenant(actor, subject.tenant);
  requireOperation(actor, input.operation);
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
  const enforced = policy.mode !== "SHADOW";
  // Minted once, outside the retried work: a re-run after a lost COMMIT
  // recognizes its own record by these ids (and its declared effects' attempts by theirs).
  const acquisitionId = randomUUID();
  const declared = declaredEffects(input);
  const record: recordStatements.NewRecord = {
    scope: Buffer.from(scope),
    operationId: uuidv7(),
    principal: subject.principal,
    operation: input.operation,
    apiRevision: input.apiRevision,
    schemaRevision: policy.fingerprint.schemaRevision,
    fingerprint: Buffer.from(fp ?? new Uint8Array(32)),
    state: input.claim ? "EXECUTING" : "RESERVED",
    leaseMs: grantLease(policy, input.leaseMs),
    acquisitionId,
    writerEpoch: input.writerEpoch,
  };
  const insertable = policy.mode !== "DRAINING" && fp !== undefined && keyRefusal === undefined;
  return {
    tenant: subject.tenant,
    actor,
    policy,
    request: {
      operation: input.operation,
      identity: input.request,
      fingerprint: fp,
      refusal,
      keyRefusal,
      schemaRevision: policy.fingerprint.schemaRevision,
      acquisitionId,
    },
    record,
    admission: insertable ? { record, quota: policy.maxActivePerPrincipal } : undefined,
    declared,
    answer: (decision, stored, retryAfterMs) => {
      const cacheableForMs = decision === "REPLAY" && stored ? replayCacheableForMs(stored, policy.mode, context.answerCacheMaxAgeMs) : undefined;
      return {
        decision,
        ...(stored ? { record: opened(context, stored) } : {}),
        ...(retryAfterMs !== undefined ? { retryAfterMs } : {}),
        enforced,
        schemaRevision: stored?.schemaRevision ?? policy.fingerprint.schemaRevision,
        ...(cacheableForMs !== undefined ? { cacheableForMs } : {}),
      };
    },
  };
}

/**
 * A Reserve decided on its own. The common cases take one round trip with
 * their COMMIT, as a batch of one: a new record, or an existing one that
 * needs no write (the fast path, for a request that may make a record and
 * declares no effects: those are registered before the COMMIT). Anything
 * else (a conflict to log, a takeover, a tombstone, a record of another
 * revision, one committed after the insert's snapshot) is decided in a
 * transaction of its own, under compare-and-sets.
 */
async function decideAlone(context: RegistryContext, db: Db, judged: Judged): Promise<ReserveResult> {
  if (judged.admission && judged.declared.length === 0) {
    const reads = await withQuota(judged.policy, admitCommitted(db, judged.tenant, judged.actor.caller, [judged.admission]));
    const answered = answerShared(context, judged, reads(judged.admission));
    if (answered) return answered;
  }
  return withQuota(judged.policy, decideWithWrites(context, db, judged));
}

/**
 * The answer from what a shared transaction read (the fast path, or a batch:
 * transactions that write nothing but new records), when the decision needs
 * no other write and no other revision's rules; undefined: the request is
 * decided alone.
 */
function answerShared(context: RegistryContext, judged: Judged, read: ScopeRead): ReserveResult | undefined {
  const action = reserveAction(read, judged.request);
  return action.kind === "accept" ? judged.answer("ACCEPTED", action.record) : answerUnwritten(context, judged, action);
}

/** The answer of a decision that writes nothing (a replay, an owner at work, an expired record), or undefined. */
function answerUnwritten(context: RegistryContext, judged: Judged, action: ReserveAction): ReserveResult | undefined {
  switch (action.kind) {
    case "replay":
      return judged.answer("REPLAY", action.record);
    case "expired":
      return judged.answer("EXPIRED", action.record);
    case "in_progress":
      return judged.answer("IN_PROGRESS", action.record, retryAfterMs(action.record, context.recoveryCadenceMs));
    default:
      return undefined;
  }
}

/**
 * The decision in a transaction that may write: the scope read (by the
 * guarded insert when the request may make a record), decided, and carried
 * out; a compare-and-set that lost to another writer has the scope read and
 * decided again, up to RESERVE_ROUNDS times.
 */
function decideWithWrites(context: RegistryContext, db: Db, judged: Judged): Promise<ReserveResult> {
  const { tenant, actor, admission } = judged;
  return db.transaction(
    tenant,
    async (q): Promise<ReserveResult> => {
      for (let round = 0; round < RESERVE_ROUNDS; round++) {
        const read = admission ? await admit(q, tenant, actor.caller, admission) : await readScope(q, judged);
        const answered = await carryOut(context, q, judged, await settle(context, q, judged, read));
        if (answered) return answered;
      }
      refuse("REGISTRY_BUSY", "the record kept changing while deciding; nothing was decided, retry with backoff");
    },
    "reserve",
  );
}

/** The scope's record as a new statement's snapshot shows it. */
async function readScope(q: Queryable, { tenant, record }: Judged): Promise<ScopeRead> {
  const found = await firstRecord(recordStatements.findByScope, q, { tenant, scope: record.scope });
  return found ? { kind: "found", record: found, inserted: false } : { kind: "absent" };
}

/**
 * The decision's outcome, once it has what it asks for: the scope read anew
 * (the insert's snapshot missed a record), the policy revision the record
 * lives under. Each is asked for at most once: a read anew finds a record
 * or none, and a decision given the record's policy decides.
 */
async function settle(context: RegistryContext, q: Queryable, judged: Judged, read: ScopeRead): Promise<ReserveOutcome> {
  for (;;) {
    const action = reserveAction(read, judged.request);
    if (action.kind === "read_again") read = await readScope(q, judged);
    else if (action.kind === "needs_record_policy") read = { kind: "found", record: action.record, inserted: false, recordPolicy: await policyOf(context, action.record) };
    else return action;
  }
}

/** Carries a decision out: its answer, or undefined when its compare-and-set lost (someone else moved the record first). */
async function carryOut(context: RegistryContext, q: Queryable, judged: Judged, outcome: ReserveOutcome): Promise<ReserveResult | undefined> {
  const { actor, record: made, declared } = judged;
  /** ACCEPTED, with the declared effects registered on the record (in this transaction). */
  const accepted = async (record: StoredRecord, takenOver = false): Promise<ReserveResult> => {
    const registered = await registerDeclared(q, record, declared, actor);
    return { ...judged.answer("ACCEPTED", registered.record), ...(takenOver ? { takenOver } : {}), ...(declared.length > 0 ? { attempts: registered.attempts } : {}) };
  };
  const { record } = outcome;
  // What every compare-and-set is fenced by: the record as it was read.
  const seen = { tenant: record.tenant, scope: Buffer.from(record.scope), generation: record.generation };
  const ownership = { state: made.state, leaseMs: made.leaseMs, acquisitionId: made.acquisitionId, writerEpoch: made.writerEpoch, caller: actor.caller };
  switch (outcome.kind) {
    case "accept":
      return accepted(record);
    case "replay":
    case "expired":
    case "in_progress":
      return answerUnwritten(context, judged, outcome);
    case "conflict":
      // Logged for operators (a key reused for another request is a client bug or an attack), never with content.
      await appendEvent(q, record, { kind: "CONFLICT", caller: actor.caller, state: record.state });
      return judged.answer("PAYLOAD_CONFLICT");
    case "takeover": {
      const taken = await firstRecord(recordStatements.takeOverByScope, q, { ...seen, ...ownership });
      return taken ? accepted(taken, true) : undefined;
    }
    case "mark_unknown": {
      const unknown = await firstRecord(recordStatements.markUnknownByScope, q, { ...seen, caller: actor.caller });
      return unknown ? judged.answer("IN_PROGRESS", unknown, retryAfterMs(unknown, context.recoveryCadenceMs)) : undefined;
    }
    case "recycle": {
      // The policy says old effects cannot reappear and the horizon passed:
      // the scope starts afresh, and one racing reservation wins it. Unfinished
      // again, it counts against the quota like a new record (the statement fails over it).
      const recycled = await firstRecord(recordStatements.recycleByScope, q, {
        ...seen,
        ...ownership,
        operationId: made.operationId,
        schemaRevision: made.schemaRevision,
        fingerprint: made.fingerprint,
        previousOperationId: record.operationId,
        quota: judged.policy.maxActivePerPrincipal,
      });
      if (!recycled) return undefined;
      return accepted(recycled);
    }
  }
}

/** Turns the quota count's failure (IDQ01: nothing was committed) into the QUOTA_EXCEEDED refusal. */
async function withQuota<T>(policy: OperationPolicy, work: Promise<T>): Promise<T> {
  try {
    return await work;
  } catch (error) {
    if (sqlState(error) === quotaStatements.QUOTA_EXCEEDED_SQLSTATE) {
      refuse("QUOTA_EXCEEDED", `this principal already has ${policy.maxActivePerPrincipal} unfinished ${policy.operation} operations; finish some first`, {
        limit: String(policy.maxActivePerPrincipal),
      });
    }
    throw error;
  }
}
