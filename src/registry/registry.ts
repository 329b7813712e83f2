import { randomUUID } from "node:crypto";
import { IdempotencyError, refuse } from "../contract/errors.js";
import { NO_FAULTS, type FaultHooks } from "../fault-hooks.js";
import { validateKey } from "../contract/keys.js";
import { type ScopeInput, scopeDigest, validateApiRevision, validateOperationName, validateSubject } from "../contract/scope.js";
import type { OperationPolicy, PolicySource } from "../policy/operations.js";
import { commitTogether, isLockWaitEnded, sqlState, type Db, type Queryable } from "./db.js";
import { uuidv7 } from "./ids.js";
import type { SnapshotKeyring } from "../crypto/sealing.js";
import { toAttempt, toRecord } from "./rows.js";
import { currentPolicy, laneOf, opened, policyOf, type RegistryContext } from "./context.js";
import { appendEvent, firstRecord, grantLease, refuseNotFound, REJUDGED, requestFingerprint, requireTenant } from "./shared.js";
import { pipelined } from "./statement.js";
import { claim, renewLease } from "./commands/claim.js";
import { complete, finishColumns, type CompleteItem } from "./commands/complete.js";
import { declaredEffects, recordEffectAttempt, registerDeclared, resolveEffectAttempt } from "./commands/effects.js";
import { lookupById, lookupByScope, ownerMoved } from "./commands/lookup.js";
import { reconcile } from "./commands/reconcile.js";
import { abandon, release } from "./commands/release.js";
import * as jobs from "./jobs.js";
import * as views from "./views.js";
import { Coalescer } from "./coalescer.js";
import * as batchStatements from "./statements/batches.js";
import * as quotaStatements from "./statements/quota.js";
import * as recordStatements from "./statements/records.js";
import { reserveVerdict, retryAfterMs } from "./state-machine.js";
import type {
  Actor,
  ClaimInput,
  ClaimResult,
  CompleteInput,
  LookupByIdInput,
  ReconcileInput,
  RecordView,
  RenewLeaseInput,
  RequestIdentity,
  ReserveInput,
  ReserveResult,
  StoredRecord,
} from "./types.js";

/** The default longest wait of a batch's shared transaction for a row lock before its requests are decided alone. */
export const DEFAULT_BATCH_LOCK_WAIT_MS = 50;
/** How many times Reserve re-reads a record that changed under its compare-and-set before giving up. */
const RESERVE_ROUNDS = 5;
/**
 * The registry: the state machine of the contract over PostgreSQL, and the
 * only way to the records, the event log and the jobs that keep them. It
 * decides with the pure rules of state-machine.ts and sends the statements of
 * statements/; it assembles no SQL. It holds no connection of its own: every
 * call takes a Db, which is either the coordinator's pools or a transaction
 * of an embedding business service (co-located mode).
 */
export class Registry {
  private readonly context: RegistryContext;

  constructor(options: {
    /** Where the operations' rules come from (the policy cache). */
    policies: PolicySource;
    /** Seals stored response bodies at rest; without one they are stored as they are. */
    keyring?: SnapshotKeyring;
    /** How often recovery looks at UNKNOWN records (the recoverer's interval): the Retry-After of a request that finds one. Default 1 s. */
    recoveryCadenceMs?: number;
    /** Fault tests' hooks at exact steps (src/fault-hooks.ts); none by default. */
    hooks?: FaultHooks;
    /**
     * Concurrent Reserves (and Completes) of one tenant and caller share a
     * transaction and its COMMIT (Coalescer): at most `maxInFlight` at a time
     * per tenant and caller, up to `maxBatch` requests each. Off when absent
     * (and always for a Db inside a caller's own transaction, co-located mode).
     * A shared transaction waits at most `lockWaitMs` (default 50) for a row
     * lock: one request blocked behind another writer's lock must not hold
     * its neighbours, so past it every request of the batch is decided alone,
     * each at its own pace, as its unary call would be.
     */
    coalesce?: { maxBatch: number; maxInFlight: number; lockWaitMs?: number };
  }) {
    const { lockWaitMs = DEFAULT_BATCH_LOCK_WAIT_MS, ...coalesce } = options.coalesce ?? { maxBatch: 1, maxInFlight: 1 };
    const batched = coalesce.maxBatch >= 2;
    this.context = {
      policies: options.policies,
      keyring: options.keyring,
      recoveryCadenceMs: options.recoveryCadenceMs ?? 1000,
      hooks: options.hooks ?? NO_FAULTS,
      reserves: batched ? new Coalescer<ReserveItem, ReserveResult>({ ...coalesce, runAlone: (item) => item.alone(), runBatch: (items) => this.reserveBatch(items) }) : undefined,
      completes: batched ? new Coalescer<CompleteItem, StoredRecord>({ ...coalesce, runAlone: (item) => item.alone(), runBatch: (items) => this.completeBatch(items) }) : undefined,
      batchTransaction: { lockTimeoutMs: lockWaitMs },
    };
  }

  /** A record with its response body opened (plaintext), for answers that show it. */
  opened<T extends { record: StoredRecord }>(view: T): T;
  opened(record: StoredRecord): StoredRecord;
  opened(subject: StoredRecord | { record: StoredRecord }): StoredRecord | { record: StoredRecord } {
    return opened(this.context, subject);
  }

  /** The newest revision of an operation's policy, or UNKNOWN_OPERATION. */
  policy(operation: string, apiRevision: number): Promise<OperationPolicy> {
    return currentPolicy(this.context, operation, apiRevision);
  }

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
  async reserve(db: Db, input: ReserveInput, actor: Actor): Promise<ReserveResult> {
    const subject = validateSubject(input.subject);
    validateOperationName(input.operation);
    validateApiRevision(input.apiRevision);
    requireTenant(actor, subject.tenant);
    if (!actor.mayOperate(input.operation)) {
      refuse("PERMISSION_DENIED", `this caller is not granted operation ${input.operation}`);
    }
    const policy = await currentPolicy(this.context, input.operation, input.apiRevision);
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
      ...(record ? { record: opened(this.context, record) } : {}),
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
      if (verdict.kind === "in_progress") return answer("IN_PROGRESS", record, retryAfterMs(record, this.context.recoveryCadenceMs));
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

            if (record.tombstonedAt !== null && (await this.reusable(record))) {
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
            const recordFp = sameRevision ? fp! : await this.fingerprintUnder(record, input.request);
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
                return answer("IN_PROGRESS", record, retryAfterMs(record, this.context.recoveryCadenceMs));
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
                if (unknown) return answer("IN_PROGRESS", unknown, retryAfterMs(unknown, this.context.recoveryCadenceMs));
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
    const batchable = this.context.reserves !== undefined && db.coalescible === true && insertable && declared.length === 0;
    const result = batchable
      ? await this.context.reserves.submit(laneOf(db, subject.tenant, actor.caller), {
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
    if (result.decision === "ACCEPTED") await this.context.hooks.reached("registry.reserve.after-commit");
    return result;
  }

  /**
   * Reserves of one tenant and caller in one transaction: one guarded insert
   * for all their scopes, with the quota gates and counts behind it in the
   * same round trip, then one COMMIT. Each request is answered from its own
   * row by the same rules as alone; a request the batch cannot decide
   * without a write of its own (a conflict to log, a takeover, a tombstone,
   * a record committed after the statement's snapshot, a second request of
   * the same scope) is decided alone once the batch has committed. When a
   * principal's new records would pass its quota, the batch rolls back and
   * every request is decided alone, in the exact order of the gate. So is
   * every request when the batch waited for a row lock past its short lock
   * wait (another writer holding a principal's gate row or a scope): the
   * requests that are not behind that lock are answered at their own pace.
   */
  private reserveBatch(items: ReserveItem[]): Array<Promise<ReserveResult>> {
    const { db, tenant, caller } = items[0]!;
    const [batch] = partitionDistinct(items, (item) => item.record.scope.toString("hex"));
    const made = { tenant, scopes: batch.map((i) => i.record.scope), acquisitionIds: batch.map((i) => i.record.acquisitionId), quotas: batch.map((i) => i.quota) };
    // One round trip with the COMMIT: a principal over its quota fails the count, and the batch rolls back.
    const shared = commitTogether(
      db,
      tenant,
      [(q) => batchStatements.insertOrFindMany.run(q, { tenant, caller, ...columnsOf(batch.map((i) => i.record)) }), (q) => batchStatements.countActiveMany.run(q, made)],
      // Named as a lone Reserve's: a reservation transaction, whatever it carries (metrics, the launch gate's latency line).
      "reserve",
      this.context.batchTransaction,
    ).then(([inserted]) => {
      const found = new Map(inserted!.rows.map((row) => [(row.scope as Buffer).toString("hex"), { record: toRecord(row), inserted: row.inserted === true }]));
      const decided = new Map<ReserveItem, ReserveResult | undefined>();
      for (const item of batch) {
        const hit = found.get(item.record.scope.toString("hex"));
        if (!hit) continue;
        decided.set(item, hit.inserted || hit.record.acquisitionId === item.record.acquisitionId ? item.accepted(hit.record) : item.decideFound(hit.record));
      }
      return decided;
    });
    return items.map((item) => answerFromBatch(shared, item, (decided) => decided.get(item)));
  }

  /** Whether a tombstone's scope may be reused now: its policy allows it and the horizon passed. */
  private async reusable(record: StoredRecord): Promise<boolean> {
    const { allowed, horizonMs } = (await policyOf(this.context, record)).retention.tombstoneReuse;
    return allowed && record.tombstonedAt!.getTime() + horizonMs <= record.dbNow.getTime();
  }

  /**
   * The fingerprint of a request under the older revision its record was made
   * under, or undefined when the request is not valid under that revision (so
   * it cannot be the same request: a conflict).
   */
  private async fingerprintUnder(record: StoredRecord, request: RequestIdentity): Promise<Uint8Array | undefined> {
    const policy = await policyOf(this.context, record);
    try {
      return requestFingerprint(request, policy);
    } catch (error) {
      if (error instanceof IdempotencyError && error.reason === "INVALID_PAYLOAD") return undefined;
      throw error;
    }
  }

  /**
   * Completes of one tenant and caller in one transaction: their records
   * locked (in one order) with their attempts in one round trip, each decided
   * by the same rules as alone, the finished ones written by one statement,
   * then one COMMIT. A refused request is answered with its refusal and
   * writes nothing; its neighbours are not affected. A second Complete of the
   * same operation is decided alone once the batch has committed, and so is
   * every request when the batch waited for a record's lock past its short
   * lock wait (another writer holding it).
   */
  private completeBatch(items: CompleteItem[]): Array<Promise<StoredRecord>> {
    const { db, actor } = items[0]!;
    const tenant = items[0]!.input.ref.tenant;
    const [batch] = partitionDistinct(items, (item) => item.input.ref.operationId);
    const shared = db.transaction(
      tenant,
      async (q, commitWith) => {
        const operationIds = batch.map((i) => i.input.ref.operationId);
        const [locked, attemptRows] = await pipelined<[{ rows: Record<string, unknown>[] }, { rows: Record<string, unknown>[] }]>([
          batchStatements.lockRecords.run(q, { tenant, operationIds }),
          batchStatements.loadAttemptsMany.run(q, { tenant, operationIds }),
        ]);
        const records = new Map(locked.rows.map((row) => [row.operation_id as string, toRecord(row)]));
        const attempts = groupBy(attemptRows.rows, (row) => row.operation_id as string, toAttempt);
        const plans = await Promise.allSettled(
          batch.map(async ({ input }) => {
            const record = records.get(input.ref.operationId);
            if (!record || !actor.mayOperate(record.operation)) refuseNotFound();
            return { record, columns: await finishColumns(this.context, record, attempts.get(record.operationId) ?? [], input), outcome: input.outcome };
          }),
        );
        const finishing = plans.flatMap((plan) => (plan.status === "fulfilled" && plan.value.columns ? [{ ...plan.value, columns: plan.value.columns }] : []));
        const finished = new Map<string, StoredRecord>();
        if (finishing.length > 0) {
          for (let i = 0; i < finishing.length; i++) await this.context.hooks.reached("registry.complete.before-commit");
          // The terminal states go out with COMMIT. Under the locks every fenced update matches; were one not to,
          // the requests are decided again alone (a finished record is then an identical repeat).
          const [written] = await commitWith([(q) => batchStatements.finishMany.run(q, { tenant, caller: actor.caller, ...finishesOf(finishing) })]);
          for (const row of written!.rows) finished.set(row.operation_id as string, toRecord(row));
          if (finished.size !== finishing.length) throw new Error(`finishMany changed ${finished.size} of the ${finishing.length} records it had locked`);
        }
        return new Map(
          batch.map((item, i): [CompleteItem, PromiseSettledResult<StoredRecord>] => {
            const plan = plans[i]!;
            if (plan.status === "rejected") return [item, plan];
            const { record } = plan.value;
            return [item, { status: "fulfilled", value: opened(this.context, finished.get(record.operationId) ?? record) }];
          }),
        );
      },
      "complete",
      this.context.batchTransaction,
    );
    return items.map((item) =>
      answerFromBatch(shared, item, (decided) => {
        const outcome = decided.get(item);
        if (!outcome) return undefined;
        return outcome.status === "fulfilled" ? outcome.value : Promise.reject(outcome.reason as Error);
      }),
    );
  }

  /** Takes ownership for execution (OWNER, TAKEOVER or RECOVER): commands/claim.ts. */
  claim(db: Db, input: ClaimInput, actor: Actor): Promise<ClaimResult> {
    return claim(this.context, db, input, actor);
  }

  /** Extends the lease of the generation the caller holds: commands/claim.ts. */
  renewLease(db: Db, input: RenewLeaseInput, actor: Actor): Promise<StoredRecord> {
    return renewLease(this.context, db, input, actor);
  }

  /** Finishes the operation and stores the snapshot to replay: commands/complete.ts. */
  complete(db: Db, input: CompleteInput, actor: Actor): Promise<StoredRecord> {
    return complete(this.context, db, input, actor);
  }

  /** An operator settles or reopens an UNKNOWN record: commands/reconcile.ts. */
  reconcile(db: Db, input: ReconcileInput, actor: Actor): Promise<StoredRecord> {
    return reconcile(this.context, db, input, actor);
  }

  /** Reads a record by id: commands/lookup.ts. */
  lookupById(db: Db, input: LookupByIdInput, actor: Actor): Promise<RecordView> {
    return lookupById(this.context, db, input, actor);
  }

  /** Reads the record a request with this scope would meet: commands/lookup.ts. */
  lookupByScope(db: Db, input: ScopeInput, actor: Actor): Promise<RecordView> {
    return lookupByScope(this.context, db, input, actor);
  }

  // The commands that need none of the context: effect attempts (commands/effects.ts), Release and
  // Abandon (commands/release.ts), and a waiting Reserve's recheck (commands/lookup.ts).
  readonly recordEffectAttempt = recordEffectAttempt;
  readonly resolveEffectAttempt = resolveEffectAttempt;
  readonly release = release;
  readonly abandon = abandon;
  readonly ownerMoved = ownerMoved;

  // The reads of recovery workers, operators and the console (views.ts): they decide nothing and need no context.
  readonly listRecoverable = views.listRecoverable;
  readonly listRecords = views.listRecords;
  readonly census = views.census;
  readonly readEvents = views.readEvents;
  readonly recentEvents = views.recentEvents;
  readonly newestRecords = views.newestRecords;
  readonly recordsById = views.recordsById;
  readonly unknownQueue = views.unknownQueue;
  readonly recordHistory = views.recordHistory;
  readonly eventSeries = views.eventSeries;

  // The background jobs (jobs.ts): their leases, the recoverer's pass and the retention sweep.
  readonly holdJobLease = jobs.holdJobLease;
  readonly releaseJobLease = jobs.releaseJobLease;
  readonly recoverExpiredLeases = jobs.recoverExpiredLeases;
  readonly sweepRetention = jobs.sweepRetention;
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

/** A failure that decided nothing for any request of a batch (the registry busy or unreachable): each gets it, to retry. */
function isUndecided(error: unknown): boolean {
  return error instanceof IdempotencyError && (error.reason === "REGISTRY_BUSY" || error.reason === "REGISTRY_UNAVAILABLE");
}

/** The first request of each key, and the ones whose key came earlier. */
function partitionDistinct<T>(items: readonly T[], key: (item: T) => string): [T[], T[]] {
  const seen = new Set<string>();
  const first: T[] = [];
  const again: T[] = [];
  for (const item of items) {
    const k = key(item);
    (seen.has(k) ? again : first).push(item);
    seen.add(k);
  }
  return [first, again];
}

/**
 * One request's answer from its batch's shared transaction: what the batch
 * decided for it (`pick`), or, when it decided nothing for it, the request
 * decided alone once the batch is over. A failure that decided nothing for
 * any request (the registry busy or unreachable) is every request's answer,
 * to retry; but when the batch only waited too long for a row lock, or
 * failed any other way, each request is decided alone.
 */
function answerFromBatch<Decided, Answer>(
  shared: Promise<Decided>,
  item: { alone: () => Promise<Answer> },
  pick: (decided: Decided) => Answer | Promise<Answer> | undefined,
): Promise<Answer> {
  return shared.then(
    (decided) => pick(decided) ?? item.alone(),
    (error: unknown) => (isUndecided(error) && !isLockWaitEnded(error) ? Promise.reject(error as Error) : item.alone()),
  );
}

function groupBy<R, V>(rows: readonly R[], key: (row: R) => string, value: (row: R) => V): Map<string, V[]> {
  const groups = new Map<string, V[]>();
  for (const row of rows) {
    const k = key(row);
    const group = groups.get(k);
    if (group) group.push(value(row));
    else groups.set(k, [value(row)]);
  }
  return groups;
}

/** The batch insert's arrays, one element per new record. */
function columnsOf(records: ReadonlyArray<batchStatements.NewRecord>): Omit<batchStatements.NewRecords, "tenant" | "caller"> {
  return {
    scopes: records.map((r) => r.scope),
    operationIds: records.map((r) => r.operationId),
    principals: records.map((r) => r.principal),
    operations: records.map((r) => r.operation),
    apiRevisions: records.map((r) => r.apiRevision),
    schemaRevisions: records.map((r) => r.schemaRevision),
    fingerprints: records.map((r) => r.fingerprint),
    states: records.map((r) => r.state),
    leaseMs: records.map((r) => r.leaseMs),
    acquisitionIds: records.map((r) => r.acquisitionId),
    writerEpochs: records.map((r) => r.writerEpoch),
  };
}

/** The batch finish's arrays, one element per record to finish. */
function finishesOf(
  finishing: ReadonlyArray<{ record: StoredRecord; columns: recordStatements.SnapshotColumns; outcome: string }>,
): Omit<batchStatements.Finishes, "tenant" | "caller"> {
  return {
    operationIds: finishing.map((f) => f.record.operationId),
    generations: finishing.map((f) => f.record.generation),
    outcomes: finishing.map((f) => f.columns.outcome),
    keepMs: finishing.map((f) => f.columns.keepMs),
    snapshotStatuses: finishing.map((f) => f.columns.snapshotStatus),
    snapshotMediaTypes: finishing.map((f) => f.columns.snapshotMediaType),
    snapshotLocations: finishing.map((f) => f.columns.snapshotLocation),
    snapshotBusinessVersions: finishing.map((f) => f.columns.snapshotBusinessVersion),
    snapshotHeaders: finishing.map((f) => f.columns.snapshotHeaders),
    snapshotBodies: finishing.map((f) => f.columns.snapshotBody),
    snapshotDigests: finishing.map((f) => f.columns.snapshotDigest),
    snapshotKeyIds: finishing.map((f) => f.columns.snapshotKeyId),
    eventDetails: finishing.map((f) => JSON.stringify({ outcome: f.outcome })),
  };
}
