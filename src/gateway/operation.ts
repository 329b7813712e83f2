import { NO_FAULTS, type FaultHooks } from "../fault-hooks.js";
import {
  check,
  checkInput,
  effectOptions,
  handlerResponse,
  effectStatus,
  func,
  nonEmptyString,
  optional,
  outcome as outcomeRule,
  shape,
  snapshot as snapshotRule,
  string,
  wholeNumber,
  type CallForm,
} from "./arguments.js";
import { isLeaseLost, LeaseLostError, toCoordinatorError } from "./errors.js";
import { outcomeForStatus, snapshotOf, toHttpResponse } from "./http.js";
import type { Clock } from "../clock.js";
import { LeaseKeeper } from "./lease.js";
import type { EffectStatus, Outcome } from "../contract/words.js";
import type {
  BusinessTransaction,
  ColocatedCompletion,
  EffectAttempt,
  GatewayLogger,
  HandlerResponse,
  LifecycleCalls,
  OpenTransaction,
  OperationRef,
  ResponseSnapshot,
} from "./types.js";

/** How `effect()` learns what a call's result and failures mean. */
export interface EffectOptions<T> {
  /** The downstream system's reference (e.g. a charge id) in the result, stored with the attempt. */
  handle?: (result: T) => string | undefined;
  /**
   * Whether an error of the call means the downstream system definitely did
   * nothing (the attempt becomes NO_EFFECT). Default: `isDefiniteFailure`
   * (a `DefiniteFailure`); anything else is INDETERMINATE.
   */
  isDefinite?: (error: unknown) => boolean;
  /**
   * Send the CONFIRMED resolution of a call that succeeded with the
   * operation's Complete (in its transaction) instead of right after the
   * call: one RPC and one commit fewer per effect. Until Complete the
   * registry holds the attempt as PENDING; should this process die first,
   * recovery replays it with its downstream key, as after a crash right after
   * the call. Abandon and Release send it first. Default false.
   */
  resolveWithComplete?: boolean;
}

/**
 * What this owner knows of its effects: the latest status of each effect
 * (every attempt of one effect shares one downstream key, so the latest
 * speaks for all), and whether a registration's outcome is unknown.
 */
class EffectLedger {
  /** Every attempt this owner knows of, by attempt number (unique within an operation). */
  private readonly attempts = new Map<number, { effect: string; status: EffectStatus }>();
  private registrationUnknown = false;

  constructor(attempts: readonly EffectAttempt[] = []) {
    for (const a of attempts) this.set(a.effect, a.attemptNumber, a.status);
  }

  set(effect: string, attemptNumber: number, status: EffectStatus): void {
    this.attempts.set(attemptNumber, { effect, status });
  }

  markRegistrationUnknown(): void {
    this.registrationUnknown = true;
  }

  /**
   * Some effect may have happened: an attempt, any attempt, is not NO_EFFECT
   * (a later attempt never takes back an earlier one), or a registration's
   * outcome is unknown.
   */
  get possible(): boolean {
    return this.registrationUnknown || [...this.attempts.values()].some((a) => a.status !== "NO_EFFECT");
  }

  /** Some effect's latest attempt is not resolved: Complete would be refused (UNRESOLVED_EFFECTS). */
  get unresolved(): boolean {
    const latest = new Map<string, EffectStatus>();
    for (const [, a] of [...this.attempts].sort(([x], [y]) => x - y)) latest.set(a.effect, a.status);
    return this.registrationUnknown || [...latest.values()].some((status) => status === "PENDING" || status === "INDETERMINATE");
  }

  get attempted(): boolean {
    return this.registrationUnknown || this.attempts.size > 0;
  }
}

/** What the context's public calls take, and the positional form `resolve` had before idempotency-gateway 0.1.0. */
export const CONTEXT_FORMS = {
  effect: { name: "ctx.effect", takes: "(name, provider, fn(downstreamKey), options?: { handle?, isDefinite?, resolveWithComplete? })" },
  resolve: { name: "ctx.resolve", takes: "one object { attemptNumber, status, providerHandle? }", earlier: "resolve(attemptNumber, status, providerHandle)" },
  transaction: { name: "ctx.transaction", takes: "(work(tx), options?: { outcome? })" },
  complete: { name: "ctx.complete", takes: "(outcome, snapshot)" },
} satisfies Record<string, CallForm>;

/** What a downstream system said of one attempt: `resolve()`'s input. */
export interface AttemptResolution {
  attemptNumber: number;
  status: Exclude<EffectStatus, "PENDING">;
  /** The downstream system's reference (e.g. a charge id). */
  providerHandle?: string;
}

export interface OwnedOperationInit {
  /** Where the lifecycle's calls go: the coordinator's client, or co-located mode's own (ColocatedCompletion.lifecycle). */
  calls: LifecycleCalls;
  /** A local-only route's transaction, holding the record since Reserve: every call runs in it, and it commits with the terminal state. */
  open?: OpenTransaction;
  colocated: ColocatedCompletion | undefined;
  ref: OperationRef;
  generation: number;
  /** False when this process does not own the record (shadow mode without ACCEPTED, or no key). */
  owned: boolean;
  attempts?: readonly EffectAttempt[];
  /** Attempts registered with Reserve for the route's declared effects, not yet used by `effect()`. */
  declared?: readonly EffectAttempt[];
  isDefinite: (error: unknown) => boolean;
  logger: GatewayLogger;
  /** Key for effects of an operation this process does not own (shadow mode). */
  unownedKey?: (effect: string) => string;
  /** Fault tests' hooks (src/fault-hooks.ts); none by default. */
  hooks?: FaultHooks;
}

/**
 * The owner of one operation at one generation: registers effects before
 * their downstream calls, resolves them after, keeps the lease, and knows
 * whether anything may have happened. The handler context and the recovery
 * context are both one.
 */
export abstract class OwnedOperation {
  readonly ref: OperationRef;
  readonly generation: number;
  readonly owned: boolean;
  protected readonly calls: LifecycleCalls;
  protected readonly colocated: ColocatedCompletion | undefined;
  /** A local-only route's open transaction, until it commits or rolls back. */
  private open: OpenTransaction | undefined;
  /** True for a local-only route's owner: the record and everything it did commit together or roll back together. */
  readonly localOnly: boolean;
  protected readonly logger: GatewayLogger;
  protected readonly ledger: EffectLedger;
  private keeper: LeaseKeeper | undefined;
  private readonly isDefinite: (error: unknown) => boolean;
  private readonly unownedKey: ((effect: string) => string) | undefined;
  private readonly hooks: FaultHooks;
  private readonly abort = new AbortController();
  private lostReason: string | undefined;
  /** Set once a co-located transaction committed the terminal state. */
  completedWithin: { outcome: Outcome; snapshot: ResponseSnapshot } | undefined;
  /** Resolutions held for Complete, not yet sent: CONFIRMED ones (EffectOptions.resolveWithComplete). */
  private held: Array<{ attemptNumber: number; status: "CONFIRMED" | "NO_EFFECT"; providerHandle: string; effect: string }> = [];
  /** Declared effects' attempts (registered with Reserve) that `effect()` has not used yet, by effect name. */
  private readonly declared: Map<string, EffectAttempt>;

  constructor(init: OwnedOperationInit) {
    this.calls = init.calls;
    this.open = init.open;
    this.localOnly = init.open !== undefined;
    this.colocated = init.colocated;
    this.ref = init.ref;
    this.generation = init.generation;
    this.owned = init.owned;
    this.ledger = new EffectLedger(init.attempts);
    this.declared = new Map((init.declared ?? []).map((attempt) => [attempt.effect, attempt]));
    this.isDefinite = init.isDefinite;
    this.logger = init.logger;
    this.unownedKey = init.unownedKey;
    this.hooks = init.hooks ?? NO_FAULTS;
  }

  /** The operation id the coordinator minted (empty when there is none). */
  get operationId(): string {
    return this.ref.operationId;
  }

  /** True once this owner may start no new effect: its lease was lost. */
  get lost(): boolean {
    return this.lostReason !== undefined;
  }

  /** Aborted when the lease is lost: pass it to long downstream work. */
  get signal(): AbortSignal {
    return this.abort.signal;
  }

  /** True when an effect may have happened (an attempt was registered and not resolved NO_EFFECT). */
  get effectPossible(): boolean {
    return this.ledger.possible;
  }

  /** True when some effect's outcome is still unknown (PENDING or INDETERMINATE). */
  get effectsUnresolved(): boolean {
    return this.ledger.unresolved;
  }

  /** Lease renewals so far. */
  get leaseRenewals(): number {
    return this.keeper?.renewals ?? 0;
  }

  /** Marks the lease lost: effect() refuses from now on, and `signal` aborts. */
  markLost(reason: string): void {
    if (this.lostReason !== undefined) return;
    this.lostReason = reason;
    this.keeper?.stop();
    this.abort.abort(new LeaseLostError(`the lease of operation ${this.ref.operationId} was lost (${reason})`, reason));
  }

  /**
   * @internal Starts renewing this owner's lease, granted until `expiresAt`,
   * asking for `leaseMs` each time (the gateway after Reserve, the recovery
   * worker after Claim). A renewal that shows the lease lost marks this
   * owner lost.
   */
  keepLease(lease: { leaseMs: number | undefined; expiresAt: Date | undefined; clock?: Clock }): void {
    this.keeper?.stop();
    this.keeper = new LeaseKeeper({
      client: this.calls,
      ref: this.ref,
      generation: this.generation,
      leaseMs: lease.leaseMs,
      expiresAt: lease.expiresAt,
      onLost: (reason) => this.markLost(reason),
      logger: this.logger,
      ...(lease.clock ? { clock: lease.clock } : {}),
    });
    this.keeper.start();
  }

  /** Stops renewing the lease (the owner is done, one way or another). */
  stopLease(): void {
    this.keeper?.stop();
  }

  /**
   * Runs one downstream call as a registered effect: RecordEffectAttempt
   * first (which returns the stable downstream key), then `fn(downstreamKey)`
   * (send the key to the downstream system as its idempotency key), then
   * ResolveEffectAttempt: CONFIRMED with the handle `options.handle` extracts,
   * or, when `fn` throws, NO_EFFECT if the error is definite and
   * INDETERMINATE otherwise; the error is rethrown. Refuses with
   * LeaseLostError, before calling anything, once the lease is lost.
   */
  async effect<T>(name: string, provider: string, fn: (downstreamKey: string) => Promise<T>, options: EffectOptions<T> = {}): Promise<T> {
    check(CONTEXT_FORMS.effect, name, "name", nonEmptyString);
    check(CONTEXT_FORMS.effect, provider, "provider", nonEmptyString);
    check(CONTEXT_FORMS.effect, fn, "fn", func);
    check(CONTEXT_FORMS.effect, options, "options", effectOptions);
    if (!this.owned) {
      // Shadow mode without ownership: nothing to register; the service runs as it did before.
      return fn(this.unownedKey?.(name) ?? name);
    }
    if (this.lostReason !== undefined) {
      throw new LeaseLostError(`operation ${this.ref.operationId} lost its lease (${this.lostReason}); no new effect may start`, this.lostReason);
    }
    // Registered with Reserve: its first call needs no RecordEffectAttempt.
    const declared = this.declared.get(name);
    if (declared) {
      this.declared.delete(name);
      this.ledger.set(name, declared.attemptNumber, "PENDING");
      return this.callRegistered(declared, fn, options);
    }
    let attempt: EffectAttempt;
    try {
      attempt = await this.calls.recordEffectAttempt({ ref: this.ref, generation: this.generation, effect: name, provider });
    } catch (error) {
      const failure = toCoordinatorError(error);
      if (isLeaseLost(failure)) {
        this.markLost(failure.reason);
        throw new LeaseLostError(`operation ${this.ref.operationId} may start no new effect: ${failure.message}`, failure.reason);
      }
      // Lost in transit: the attempt may have been written. Count it as a
      // possible effect, so that nothing releases the record as if nothing happened.
      if (failure.unreachable) this.ledger.markRegistrationUnknown();
      throw failure;
    }
    this.ledger.set(name, attempt.attemptNumber, "PENDING");
    return this.callRegistered(attempt, fn, options);
  }

  /** Calls `fn` for a registered attempt and resolves the attempt with what happened. */
  protected async callRegistered<T>(attempt: EffectAttempt, fn: (downstreamKey: string) => Promise<T>, options: EffectOptions<T>): Promise<T> {
    let result: T;
    try {
      result = await fn(attempt.downstreamKey);
    } catch (error) {
      const definite = (options.isDefinite ?? this.isDefinite)(error);
      await this.resolveQuietly(attempt, definite ? "NO_EFFECT" : "INDETERMINATE", "");
      throw error;
    }
    await this.hooks.reached("gateway.effect.after-call");
    const providerHandle = options.handle?.(result) ?? "";
    if (options.resolveWithComplete) {
      this.held.push({ attemptNumber: attempt.attemptNumber, status: "CONFIRMED", providerHandle, effect: attempt.effect });
      this.ledger.set(attempt.effect, attempt.attemptNumber, "CONFIRMED");
    } else {
      await this.resolveQuietly(attempt, "CONFIRMED", providerHandle);
    }
    return result;
  }

  /**
   * The resolutions not sent yet, which Complete carries: the held ones, and
   * NO_EFFECT for each declared effect the handler did not call (it called
   * nothing downstream).
   */
  private unsent(): Array<{ attemptNumber: number; status: "CONFIRMED" | "NO_EFFECT"; providerHandle: string; effect: string }> {
    const unused = [...this.declared.values()].map(({ attemptNumber, effect }) => ({ attemptNumber, status: "NO_EFFECT" as const, providerHandle: "", effect }));
    return [...this.held, ...unused];
  }

  /** The unsent resolutions as Complete takes them. */
  private unsentForComplete(): Array<{ attemptNumber: number; status: "CONFIRMED" | "NO_EFFECT"; providerHandle: string }> {
    return this.unsent().map(({ attemptNumber, status, providerHandle }) => ({ attemptNumber, status, providerHandle }));
  }

  /** Forgets the unsent resolutions: the Complete that carried them committed, or they were sent on their own. */
  private sent(): void {
    this.held = [];
    this.declared.clear();
  }

  /** Sends the unsent resolutions on their own (before Abandon or Release: recovery should know what happened). */
  private async sendUnsent(): Promise<void> {
    const unsent = this.unsent();
    this.sent();
    for (const { attemptNumber, status, providerHandle, effect } of unsent) {
      await this.resolveQuietly({ attemptNumber, effect }, status, providerHandle);
    }
  }

  /**
   * Resolves an attempt; a failure is logged, not thrown: the downstream call
   * already happened (or not) whatever the registry heard, and an attempt
   * left PENDING only means the operation cannot complete until someone
   * resolves it (the recovery worker).
   */
  private async resolveQuietly(attempt: Pick<EffectAttempt, "attemptNumber" | "effect">, status: Exclude<EffectStatus, "PENDING">, providerHandle: string): Promise<void> {
    try {
      await this.resolveAttempt({ attemptNumber: attempt.attemptNumber, status, providerHandle }, attempt.effect);
    } catch (error) {
      this.logger.warn(
        { operationId: this.ref.operationId, attempt: attempt.attemptNumber, status, error: (error as Error).message },
        "could not resolve an effect attempt; the operation is left to recovery",
      );
    }
  }

  /** ResolveEffectAttempt for one of this operation's attempts (e.g. after asking the downstream system by handle or downstream key). */
  async resolve(attempt: AttemptResolution): Promise<EffectAttempt> {
    checkInput(CONTEXT_FORMS.resolve, attempt, { attemptNumber: wholeNumber(1), status: effectStatus, providerHandle: optional(string) });
    return this.resolveAttempt(attempt, undefined);
  }

  /** ResolveEffectAttempt, recorded in the ledger under `effect` (known before the answer) or the answer's. */
  protected async resolveAttempt(attempt: AttemptResolution, effect: string | undefined): Promise<EffectAttempt> {
    const resolved = await this.calls.resolveEffectAttempt({ ref: this.ref, generation: this.generation, ...attempt });
    this.ledger.set(effect ?? resolved.effect, attempt.attemptNumber, resolved.status);
    return resolved;
  }

  /**
   * Co-located mode: runs `work` in one transaction of the service's own
   * database (the registry's), and completes the operation inside that same
   * transaction with the response `work` returns: the business rows, their
   * outbox rows and the terminal state commit together or not at all.
   * The outcome follows the response's status (2xx/3xx SUCCEEDED; 4xx
   * REJECTED, or FAILED_FINAL after an effect; 5xx FAILED_FINAL after an
   * effect, otherwise no completion, and the gateway releases) unless
   * `options.outcome` says otherwise. Send the returned response as is.
   */
  async transaction<R extends HandlerResponse>(work: (tx: BusinessTransaction) => Promise<R>, options: { outcome?: Outcome } = {}): Promise<R> {
    check(CONTEXT_FORMS.transaction, work, "work", func);
    check(CONTEXT_FORMS.transaction, options, "options", shape({ outcome: optional(outcomeRule) }));
    if (this.localOnly) return this.inOpenTransaction(work, options);
    const colocated = this.colocated;
    if (!colocated) throw new Error("transaction() needs co-located mode: give the gateway (or worker) a `colocated` ColocatedRegistry (idempotency-coordinator/colocated)");
    let completed: { outcome: Outcome; snapshot: ResponseSnapshot } | undefined;
    const response = await colocated.transaction(async (tx) => {
      const result = await work(tx);
      if (!this.owned) return result;
      check(CONTEXT_FORMS.transaction, result, "the response work returned", handlerResponse);
      const http = toHttpResponse(result);
      const outcome = options.outcome ?? outcomeForStatus(http.status, this.ledger.possible);
      if (outcome === "release") return result;
      const snapshot = snapshotOf(http);
      // The last statement of the transaction: with its COMMIT when the registry can.
      const complete = colocated.completeAndCommit?.bind(colocated) ?? colocated.complete.bind(colocated);
      await complete(tx, { ref: this.ref, generation: this.generation, outcome, snapshot, resolutions: this.unsentForComplete() });
      completed = { outcome, snapshot };
      return result;
    });
    if (completed) {
      this.sent();
      this.completedWithin = completed;
      this.stopLease();
    }
    return response;
  }

  /**
   * A local-only route's `transaction()`: `work` runs in the transaction
   * that holds the record since Reserve, the operation completes in it, and
   * it commits; a failure, or an outcome that would release the record,
   * rolls all of it back (no record is left; the retry runs anew).
   */
  private async inOpenTransaction<R extends HandlerResponse>(work: (tx: BusinessTransaction) => Promise<R>, options: { outcome?: Outcome }): Promise<R> {
    const open = this.open;
    if (!open)
      throw new Error(
        `the transaction of operation ${this.ref.operationId} (a localOnly route) already ${this.completedWithin ? "committed" : "rolled back"}: call ctx.transaction() once`,
      );
    let result: R;
    let http;
    try {
      result = await work(open.tx);
      check(CONTEXT_FORMS.transaction, result, "the response work returned", handlerResponse);
      http = toHttpResponse(result);
    } catch (error) {
      await this.rollBack();
      throw error;
    }
    const outcome = options.outcome ?? outcomeForStatus(http.status, this.ledger.possible);
    if (outcome === "release") {
      await this.rollBack();
      return result;
    }
    await this.complete(outcome, snapshotOf(http));
    return result;
  }

  /** Ends a local-only route's open transaction with ROLLBACK: nothing of the request is kept. */
  private async rollBack(): Promise<void> {
    const open = this.open;
    this.open = undefined;
    this.sent();
    await open?.rollback();
  }

  /**
   * Complete with the held resolutions (idempotent: an identical repeat
   * succeeds), over RPC or co-located; a local-only route's inside its open
   * transaction, which then commits (and rolls back if Complete is refused).
   */
  async complete(outcome: Outcome, snapshot: ResponseSnapshot): Promise<void> {
    check(CONTEXT_FORMS.complete, outcome, "outcome", outcomeRule);
    check(CONTEXT_FORMS.complete, snapshot, "snapshot", snapshotRule);
    const open = this.open;
    if (this.localOnly && !open) throw new Error(`the transaction of operation ${this.ref.operationId} (a localOnly route) already ended`);
    try {
      await this.calls.complete({ ref: this.ref, generation: this.generation, outcome, snapshot, resolutions: this.unsentForComplete() });
      if (open) {
        this.open = undefined;
        await open.commit();
      }
    } catch (error) {
      if (this.open) await this.rollBack();
      throw error;
    }
    this.sent();
    if (open) this.completedWithin = { outcome, snapshot };
  }

  /** Release: back to RESERVED, the next identical retry takes it over; a local-only route's transaction rolls back instead. */
  async release(): Promise<void> {
    if (this.localOnly) return this.rollBack();
    await this.sendUnsent();
    await this.calls.release({ ref: this.ref, generation: this.generation });
  }

  /**
   * Abandon: this owner will not finish; recovery may start now (knowing
   * what the held resolutions say). A local-only route's transaction rolls
   * back instead: its effects were local, and roll back with it.
   */
  async abandon(): Promise<void> {
    if (this.localOnly) return this.rollBack();
    await this.sendUnsent();
    await this.calls.abandon({ ref: this.ref, generation: this.generation });
  }
}
