/**
 * The gateway SDK's recovery worker (`idempotency-gateway/recovery`):
 * settles UNKNOWN records with a resolver per operation. See docs/adopting.md,
 * section 4.
 */
import type { FaultHooks } from "../fault-hooks.js";
import type { CoordinatorClient } from "./client.js";
import {
  check,
  checkOptions,
  colocatedCompletion,
  coordinatorClient,
  effectOptions,
  func,
  handlerResponse,
  logger as loggerRule,
  nonEmptyString,
  object,
  optional,
  outcome as outcomeRule,
  positiveNumber,
  rule,
  string,
  wholeNumber,
  type CallForm,
} from "./arguments.js";
import { isDefiniteFailure, LeaseLostError, toCoordinatorError } from "./errors.js";
import { outcomeForStatus, snapshotOf, toHttpResponse } from "./http.js";
import { OwnedOperation, type AttemptResolution, type EffectOptions, type OwnedOperationInit } from "./operation.js";
import {
  loggerOf,
  type BusinessTransaction,
  type ColocatedCompletion,
  type EffectAttempt,
  type GatewayLogger,
  type HandlerResponse,
  type OperationRecord,
  type ResponseSnapshot,
  type SdkLogger,
} from "./types.js";
import type { ClaimMode, Outcome } from "../contract/words.js";

/**
 * Settles one operation whose owner went away with a possible effect. It
 * may query the downstream system (by provider handle or downstream key),
 * replay an effect already registered with its ORIGINAL downstream key,
 * resolve attempts, and complete with the response retries will get. It may
 * not start a new kind of effect. Returning without completing leaves the
 * record to a later pass.
 */
export type RecoveryResolver = (ctx: RecoveryContext) => Promise<void>;

/** What happened to one record in a pass. */
export type RecoveryEvent =
  | { kind: "claimed"; operationId: string; operation: string; mode: ClaimMode; generation: number }
  | { kind: "completed"; operationId: string; operation: string; outcome: Outcome }
  | { kind: "released"; operationId: string; operation: string }
  | { kind: "skipped"; operationId: string; operation: string; reason: string }
  | { kind: "left"; operationId: string; operation: string; reason: string }
  | { kind: "failed"; operationId: string; operation: string; error: string };

export interface RecoverySummary {
  listed: number;
  claimed: number;
  completed: number;
  released: number;
  skipped: number;
  /** Claimed but not settled (the resolver returned without completing, or its effect is still unknown). */
  left: number;
  failed: number;
}

export interface RecoveryWorkerOptions {
  /** A coordinator client with a worker-role token. */
  client: CoordinatorClient;
  /** One resolver per operation this worker settles; it lists only these operations. */
  resolvers: Record<string, RecoveryResolver>;
  /** Only this tenant (default: every tenant the token is granted). */
  tenant?: string;
  /** Co-located mode: `ctx.transaction()` completes inside the service's transaction (a `ColocatedRegistry`). */
  colocated?: ColocatedCompletion;
  /** Pause between passes of `start()` (default 5000 ms). */
  pollIntervalMs?: number;
  /** Records per ListRecoverable page (default 50). */
  pageSize?: number;
  /** Lease to hold while resolving (default: the policy's). */
  leaseMs?: number;
  writerEpoch?: number;
  isDefinite?: (error: unknown) => boolean;
  /** Where warnings go (a failed pass or recovery), and progress when it has `info`; default `console` (GatewayLogger). */
  logger?: GatewayLogger;
  /** Called for every record's progress. */
  onProgress?: (event: RecoveryEvent) => void;
  /** Fault tests' hooks at exact steps (src/fault-hooks.ts); none by default. */
  hooks?: FaultHooks;
}

/** The worker's client: a coordinator client that also lists recoverable records. */
const withListing = (value: unknown, at: string) =>
  coordinatorClient(value, at) ?? (typeof (value as { listRecoverable?: unknown }).listRecoverable === "function" ? undefined : `${at} must be a CoordinatorClient`);

const WORKER_FORM: CallForm = {
  name: "new RecoveryWorker",
  takes:
    "one object { client, resolvers: { [operation]: async (ctx) => … }, tenant?, colocated?, pollIntervalMs?, pageSize?, leaseMs?, writerEpoch?, isDefinite?, logger?, onProgress? }",
};
const RECOVERY_FORMS = {
  replay: { name: "ctx.replay", takes: "(effect, fn(downstreamKey), options?: { handle?, isDefinite?, resolveWithComplete? })" },
  completeWith: { name: "ctx.completeWith", takes: "(response: { status, headers?, json? | body? }, outcome?)" },
  latestAttempt: { name: "ctx.latestAttempt", takes: "(effect)" },
} satisfies Record<string, CallForm>;

/** Refusals of Claim meaning another worker (or the owner, or a client's retry) got there first. */
const SOMEONE_ELSE: ReadonlySet<string> = new Set(["STALE_GENERATION", "LEASE_HELD", "INVALID_TRANSITION", "NOT_FOUND"]);

/**
 * The recovery worker: polls ListRecoverable for its operations, claims
 * each record with the mode the coordinator says (RECOVER for UNKNOWN records
 * or ended leases with a possible effect; TAKEOVER when nothing can have
 * happened) at the record's generation, and then:
 * - TAKEOVER: releases it (nothing happened; the client's retry runs it);
 * - RECOVER: calls the operation's resolver with the record, its effect
 *   attempts and helpers, renewing the lease while it runs.
 * Several workers may run: a claim lost to another (STALE_GENERATION,
 * LEASE_HELD) is skipped.
 */
export class RecoveryWorker {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<RecoverySummary> | undefined;
  private stopped = true;
  /** Set by stop(): a pass in progress ends after its current record. */
  private stopRequested = false;
  private readonly logger: SdkLogger;

  constructor(private readonly options: RecoveryWorkerOptions) {
    checkOptions(WORKER_FORM, options, {
      client: withListing,
      resolvers: rule("an object of one resolver function per operation", (v) => typeof v === "object" && v !== null && Object.values(v).every((r) => typeof r === "function")),
      tenant: optional(nonEmptyString),
      colocated: optional(colocatedCompletion),
      pollIntervalMs: optional(positiveNumber),
      pageSize: optional(wholeNumber(1)),
      leaseMs: optional(positiveNumber),
      writerEpoch: optional(wholeNumber(0)),
      isDefinite: optional(func),
      logger: optional(loggerRule),
      onProgress: optional(func),
      hooks: optional(object),
    });
    this.logger = loggerOf(options.logger);
  }

  /** Polls every `pollIntervalMs` until `stop()`. */
  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.stopRequested = false;
    const tick = async () => {
      if (this.stopped) return;
      await this.runOnce().catch((error: unknown) => this.logger.warn({ error: (error as Error).message }, "recovery pass failed"));
      if (!this.stopped) {
        this.timer = setTimeout(() => void tick(), this.options.pollIntervalMs ?? 5000);
        this.timer.unref();
      }
    };
    void tick();
  }

  /** Stops polling and waits for the pass in progress. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.stopRequested = true;
    clearTimeout(this.timer);
    await this.running?.catch(() => undefined);
  }

  /** One pass over every page of recoverable records (passes never overlap). */
  runOnce(): Promise<RecoverySummary> {
    this.running ??= this.pass().finally(() => (this.running = undefined));
    return this.running;
  }

  private async pass(): Promise<RecoverySummary> {
    const summary: RecoverySummary = { listed: 0, claimed: 0, completed: 0, released: 0, skipped: 0, left: 0, failed: 0 };
    const operations = Object.keys(this.options.resolvers);
    if (operations.length === 0) return summary;
    let pageToken = "";
    do {
      const page = await this.options.client.listRecoverable({
        ...(this.options.tenant ? { tenant: this.options.tenant } : {}),
        operations,
        pageSize: this.options.pageSize ?? 50,
        pageToken,
      });
      summary.listed += page.records.length;
      for (const { record, claimMode } of page.records) {
        if (this.stopRequested) break;
        await this.recover(record, claimMode, summary);
      }
      pageToken = page.nextPageToken;
    } while (pageToken !== "" && !this.stopRequested);
    return summary;
  }

  private async recover(record: OperationRecord, mode: ClaimMode, summary: RecoverySummary): Promise<void> {
    const { client } = this.options;
    const base = { operationId: record.operationId, operation: record.operation };
    const resolver = this.options.resolvers[record.operation];
    if (!resolver) {
      summary.skipped++;
      return this.progress({ kind: "skipped", ...base, reason: "no resolver for this operation" });
    }
    const ref = { tenant: record.subject.tenant, operationId: record.operationId };
    let claimed;
    try {
      claimed = await client.claim({
        ref,
        mode,
        generation: record.generation,
        ...(this.options.leaseMs !== undefined ? { leaseMs: this.options.leaseMs } : {}),
        writerEpoch: this.options.writerEpoch ?? 0,
      });
    } catch (error) {
      const failure = toCoordinatorError(error);
      if (failure.reason !== undefined && SOMEONE_ELSE.has(failure.reason)) {
        summary.skipped++;
        return this.progress({ kind: "skipped", ...base, reason: failure.reason });
      }
      summary.failed++;
      return this.progress({ kind: "failed", ...base, error: failure.message });
    }
    summary.claimed++;
    this.progress({ kind: "claimed", ...base, mode, generation: claimed.generation });

    const ctx = new RecoveryContext(
      {
        calls: client,
        colocated: this.options.colocated,
        ref,
        generation: claimed.generation,
        owned: true,
        attempts: claimed.effectAttempts,
        isDefinite: this.options.isDefinite ?? isDefiniteFailure,
        logger: this.logger,
        ...(this.options.hooks ? { hooks: this.options.hooks } : {}),
      },
      { ...record, generation: claimed.generation, recovering: claimed.recovering, effectAttempts: claimed.effectAttempts },
      mode,
    );
    ctx.keepLease({ leaseMs: this.options.leaseMs, expiresAt: claimed.leaseExpiresAt });
    try {
      if (mode === "TAKEOVER") {
        // Nothing can have happened downstream: hand it back for the client's retry to run.
        await ctx.release();
      } else {
        await resolver(ctx);
      }
    } catch (error) {
      summary.failed++;
      this.logger.warn({ ...base, error: (error as Error).message }, "recovery of an operation failed; a later pass retries it");
      return this.progress({ kind: "failed", ...base, error: (error as Error).message });
    } finally {
      ctx.stopLease();
    }
    if (ctx.outcome) {
      summary.completed++;
      this.progress({ kind: "completed", ...base, outcome: ctx.outcome });
    } else if (ctx.released) {
      summary.released++;
      this.progress({ kind: "released", ...base });
    } else {
      summary.left++;
      this.progress({ kind: "left", ...base, reason: ctx.effectsUnresolved ? "an effect is still unresolved" : "the resolver did not complete" });
    }
  }

  private progress(event: RecoveryEvent): void {
    this.logger.info({ ...event }, `recovery: ${event.kind}`);
    try {
      this.options.onProgress?.(event);
    } catch {
      // A progress callback never breaks recovery.
    }
  }
}

/**
 * What a resolver gets: the record (with its effect attempts, downstream keys
 * and handles), the recovery ownership (generation, lease) and the helpers.
 */
export class RecoveryContext extends OwnedOperation {
  /** How the record was claimed (a resolver only sees RECOVER). */
  outcome: Outcome | undefined;
  released = false;

  constructor(
    init: OwnedOperationInit,
    /** The record as claimed: its generation is this worker's. */
    readonly record: OperationRecord,
    readonly claimMode: ClaimMode,
  ) {
    super(init);
  }

  /** Every effect attempt so far, in registration order. */
  get attempts(): EffectAttempt[] {
    return this.record.effectAttempts;
  }

  /** The latest attempt of an effect (every attempt of it carries the same downstream key). */
  latestAttempt(effect: string): EffectAttempt | undefined {
    check(RECOVERY_FORMS.latestAttempt, effect, "effect", string);
    return this.record.effectAttempts.filter((a) => a.effect === effect).at(-1);
  }

  /**
   * Calls the downstream system again for an effect that was already
   * registered, with its ORIGINAL downstream key (RecordEffectAttempt with the
   * same effect name gives the same key; a new effect name is refused with
   * NEW_EFFECT_IN_RECOVERY), then resolves the new attempt like `effect()`.
   */
  async replay<T>(effect: string, fn: (downstreamKey: string) => Promise<T>, options: EffectOptions<T> = {}): Promise<T> {
    check(RECOVERY_FORMS.replay, effect, "effect", nonEmptyString);
    check(RECOVERY_FORMS.replay, fn, "fn", func);
    check(RECOVERY_FORMS.replay, options, "options", effectOptions);
    const registered = this.latestAttempt(effect);
    if (!registered) throw new Error(`effect ${effect} was never registered on operation ${this.operationId}; recovery may only replay registered effects`);
    return this.effect(effect, registered.provider, fn, options);
  }

  /**
   * Every resolution (`resolve()` after querying the downstream system by
   * handle or downstream key, or `replay()`'s) also updates the record the
   * resolver reads.
   */
  protected override async resolveAttempt(attempt: AttemptResolution, effect: string | undefined): Promise<EffectAttempt> {
    const resolved = await super.resolveAttempt(attempt, effect);
    this.record.effectAttempts = this.record.effectAttempts.map((a) => (a.attemptNumber === attempt.attemptNumber ? resolved : a));
    return resolved;
  }

  /**
   * Completes with the response every retry will get (build it as the
   * handler would have). The outcome follows the status unless given. A
   * record claimed with RECOVER has been UNKNOWN and never runs again, so a
   * 5xx with nothing possible finishes it as FAILED_FINAL rather than
   * handing it back; a record taken over (TAKEOVER) is released then.
   */
  async completeWith(response: HandlerResponse, outcome?: Outcome): Promise<void> {
    check(RECOVERY_FORMS.completeWith, response, "response", handlerResponse);
    check(RECOVERY_FORMS.completeWith, outcome, "outcome", optional(outcomeRule));
    const http = toHttpResponse(response);
    const chosen = outcome ?? outcomeForStatus(http.status, this.effectPossible);
    if (chosen === "release" && this.claimMode === "RECOVER") {
      await this.complete("FAILED_FINAL", snapshotOf(http));
      return;
    }
    if (chosen === "release") {
      await this.release();
      return;
    }
    await this.complete(chosen, snapshotOf(http));
  }

  override async complete(outcome: Outcome, snapshot: ResponseSnapshot): Promise<void> {
    await super.complete(outcome, snapshot);
    this.outcome = outcome;
  }

  override async release(): Promise<void> {
    await super.release();
    this.released = true;
  }

  override async transaction<R extends HandlerResponse>(work: (tx: BusinessTransaction) => Promise<R>, options?: { outcome?: Outcome }): Promise<R> {
    const response = await super.transaction(work, options);
    if (this.completedWithin) this.outcome = this.completedWithin.outcome;
    return response;
  }

  /** Throws LeaseLostError when the lease is gone (check before long work). */
  ensureOwned(): void {
    if (this.lost) throw new LeaseLostError(`recovery of ${this.operationId} lost its lease`, undefined);
  }
}
