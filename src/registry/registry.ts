import type { SnapshotKeyring } from "../crypto/sealing.js";
import { NO_FAULTS, type FaultHooks } from "../fault-hooks.js";
import type { OperationPolicy, PolicySource } from "../policy/operations.js";
import { completeBatch, DEFAULT_BATCH_LOCK_WAIT_MS, reserveBatch, type ReserveItem } from "./batching.js";
import { Coalescer } from "./coalescer.js";
import { claim, renewLease } from "./commands/claim.js";
import { complete, type CompleteItem } from "./commands/complete.js";
import { recordEffectAttempt, resolveEffectAttempt } from "./commands/effects.js";
import { lookupById, lookupByScope, ownerMoved } from "./commands/lookup.js";
import { reconcile } from "./commands/reconcile.js";
import { abandon, release } from "./commands/release.js";
import { reserve } from "./commands/reserve.js";
import { currentPolicy, opened, type RegistryContext } from "./context.js";
import type { Db } from "./db.js";
import { RecordIdentities } from "./identities.js";
import * as jobs from "./jobs.js";
import type { Actor, ClaimInput, ClaimResult, ReserveInput, ReserveResult, StoredRecord } from "./types.js";
import * as views from "./views.js";

/**
 * The registry: the state machine of the contract over PostgreSQL, and the
 * only way to the records, the event log and the jobs that keep them. It
 * decides with the pure rules of state-machine.ts and sends the statements of
 * statements/; it assembles no SQL. It holds no connection of its own: every
 * call takes a Db, which is either the coordinator's pools or a transaction
 * of an embedding business service (co-located mode).
 *
 * It is the one entry point, and does none of the work itself: it holds
 * what the work shares (RegistryContext: policies, key ring, hooks,
 * coalescers) and hands each call to its module: a command of commands/,
 * the coalesced paths of batching.ts, the reads of views.ts, the jobs of
 * jobs.ts.
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
    /**
     * Longest a gateway may answer exact repeats of a replayed record from
     * its own cache (IDEM_ANSWER_CACHE_MAX_AGE_MS). Default 0: every repeat is asked.
     */
    answerCacheMaxAgeMs?: number;
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
      answerCacheMaxAgeMs: options.answerCacheMaxAgeMs ?? 0,
      hooks: options.hooks ?? NO_FAULTS,
      identities: new RecordIdentities(),
      reserves: batched
        ? new Coalescer<ReserveItem, ReserveResult>({ ...coalesce, runAlone: (item) => item.alone(), runBatch: (items) => reserveBatch(this.context, items) })
        : undefined,
      completes: batched
        ? new Coalescer<CompleteItem, StoredRecord>({ ...coalesce, runAlone: (item) => item.alone(), runBatch: (items) => completeBatch(this.context, items) })
        : undefined,
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

  /** A command of commands/ as the Registry's: its calls get the registry's context first. */
  private withContext<Args extends unknown[], Result>(command: (context: RegistryContext, ...args: Args) => Result): (...args: Args) => Result {
    return (...args) => command(this.context, ...args);
  }

  // The commands (commands/), each given the context it needs; the records Reserve and Claim hand to
  // an owner are remembered, so that their Complete can go out in one round trip (identities.ts).
  readonly reserve = async (db: Db, input: ReserveInput, actor: Actor): Promise<ReserveResult> => {
    const result = await reserve(this.context, db, input, actor);
    if (result.decision === "ACCEPTED" && result.record) this.context.identities.remember(result.record);
    return result;
  };
  readonly claim = async (db: Db, input: ClaimInput, actor: Actor): Promise<ClaimResult> => {
    const result = await claim(this.context, db, input, actor);
    this.context.identities.remember(result.record);
    return result;
  };
  readonly renewLease = this.withContext(renewLease);
  readonly complete = this.withContext(complete);
  readonly reconcile = this.withContext(reconcile);
  readonly lookupById = this.withContext(lookupById);
  readonly lookupByScope = this.withContext(lookupByScope);

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
