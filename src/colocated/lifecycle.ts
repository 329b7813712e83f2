import { refuse } from "../contract/errors.js";
import { CONTRACT_VERSION } from "../contract/scope.js";
import { toCoordinatorError } from "../gateway/errors.js";
import type {
  CompleteInput,
  CompleteResult,
  EffectAttempt,
  HandOverResult,
  LifecycleCalls,
  OwnedRef,
  RecordEffectAttemptInput,
  RenewLeaseInput,
  ReserveResult,
  ResolveEffectAttemptInput,
  ResponseSnapshot,
} from "../gateway/types.js";
import { CommitUnknownError, type Db } from "../registry/db.js";
import type { Registry } from "../registry/registry.js";
import type { Actor, CompleteInput as RegistryCompleteInput, ReserveResult as RegistryReserveResult, StoredAttempt } from "../registry/types.js";
import { RecordWatch, waitBudgetMs, waitForOwner } from "../server/owner-wait.js";

/**
 * The lifecycle of an operation in the service's own process: each call the
 * gateway would send the coordinator (CoordinatorClient), made by the
 * registry's own commands on the service's connections, with the same
 * inputs, answers and refusals (thrown as CoordinatorError with the wire's
 * reasons). No rule is decided here: this module only translates between
 * the gateway's types and the registry's, as the coordinator's handlers
 * translate between the wire and the registry.
 */

/** What the calls share: the registry, who acts, and the waits for an owner of this process. */
export interface LocalLifecycle {
  registry: Registry;
  actor: Actor;
  /** Reserves of this process waiting for an owner, woken when this process commits a change of their record. */
  watch: RecordWatch;
}

/**
 * The lifecycle calls on `db`: the service's pool, where each call is a
 * transaction of its own that commits (`commits`), or an open transaction,
 * whose changes commit later with it.
 */
export function lifecycleOn(db: Db, { registry, actor, watch }: LocalLifecycle, commits: boolean): LifecycleCalls {
  /** A change committed here: this process's waiters on the record decide again now. */
  const changed = (ref: { tenant: string; operationId: string }) => {
    if (commits) watch.changed(ref.tenant, ref.operationId);
  };
  return {
    reserve: (input) =>
      refusedAsCoordinator(async () => {
        if (input.waitForOwnerMs !== undefined && input.waitForOwnerMs < 0) refuse("INVALID_REQUEST", "waitForOwnerMs must not be negative");
        const reserve = {
          subject: input.subject,
          operation: input.operation,
          apiRevision: input.apiRevision,
          idempotencyKey: input.idempotencyKey,
          request: { kind: "parts" as const, parts: input.parts },
          claim: input.claim ?? false,
          ...(input.leaseMs !== undefined ? { leaseMs: input.leaseMs } : {}),
          writerEpoch: input.writerEpoch ?? 0,
          effects: input.effects ?? [],
        };
        const decide = () => registry.reserve(db, reserve, actor);
        let result = await decide();
        const budgetMs = waitBudgetMs(input.waitForOwnerMs, undefined);
        if (budgetMs > 0) {
          result = await waitForOwner(result, {
            tenant: input.subject.tenant,
            caller: actor.caller,
            budgetMs,
            watch,
            signal: new AbortController().signal,
            decide,
            moved: (record) => registry.ownerMoved(db, record),
          });
        }
        return reserveResult(result);
      }),
    renewLease: ({ ref, generation, leaseMs }: RenewLeaseInput) =>
      refusedAsCoordinator(async () => {
        const record = await registry.renewLease(db, { ref, generation, ...(leaseMs !== undefined ? { leaseMs } : {}) }, actor);
        return record.leaseExpiresAt ?? undefined;
      }),
    recordEffectAttempt: ({ ref, generation, effect, provider }: RecordEffectAttemptInput) =>
      refusedAsCoordinator(async () => effectAttempt(await registry.recordEffectAttempt(db, { ref, generation, effect, provider }, actor))),
    resolveEffectAttempt: ({ ref, generation, attemptNumber, status, providerHandle }: ResolveEffectAttemptInput) =>
      refusedAsCoordinator(async () =>
        effectAttempt(await registry.resolveEffectAttempt(db, { ref, generation, attemptNumber, status, providerHandle: providerHandle ?? "" }, actor)),
      ),
    complete: (input: CompleteInput) =>
      refusedAsCoordinator(async () => {
        const record = await registry.complete(db, registryComplete(input), actor);
        changed(input.ref);
        return completeResult(record);
      }),
    release: (input: OwnedRef) => refusedAsCoordinator(async () => handOver(await registry.release(db, input, actor), changed)),
    abandon: (input: OwnedRef) => refusedAsCoordinator(async () => handOver(await registry.abandon(db, input, actor), changed)),
  };
}

/**
 * Runs a call, throwing its refusal as the gateway's CoordinatorError, with
 * the reason the wire would carry; a COMMIT whose outcome is unknown stays
 * CommitUnknownError (re-read before acting).
 */
export async function refusedAsCoordinator<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    throw error instanceof CommitUnknownError ? error : toCoordinatorError(error);
  }
}

/** Complete's input as the registry takes it. */
export function registryComplete({ ref, generation, outcome, snapshot, resolutions }: CompleteInput): RegistryCompleteInput {
  return {
    ref,
    generation,
    outcome,
    snapshot: responseFields(snapshot),
    resolutions: (resolutions ?? []).map((r) => ({ attemptNumber: r.attemptNumber, status: r.status, providerHandle: r.providerHandle ?? "" })),
  };
}

/** Complete's answer, as the coordinator gives it. */
export function completeResult(record: Awaited<ReturnType<Registry["complete"]>>): CompleteResult {
  return { state: record.state, snapshotDigest: record.snapshot?.digest ?? new Uint8Array(), ...(record.completedAt ? { completedAt: record.completedAt } : {}) };
}

/** Reserve's answer, as the coordinator gives it: the generation to the owner only, the snapshot on REPLAY only. */
function reserveResult(result: RegistryReserveResult): ReserveResult {
  const { record } = result;
  const snapshot = result.decision === "REPLAY" ? record?.snapshot : undefined;
  return {
    decision: result.decision,
    operationId: record?.operationId ?? "",
    ...(record ? { state: record.state } : {}),
    generation: result.decision === "ACCEPTED" && record ? record.generation : 0,
    ...(record?.leaseExpiresAt ? { leaseExpiresAt: record.leaseExpiresAt } : {}),
    ...(result.retryAfterMs !== undefined ? { retryAfterMs: result.retryAfterMs } : {}),
    ...(snapshot
      ? {
          snapshot: { ...responseFields(snapshot), digest: snapshot.digest },
        }
      : {}),
    enforced: result.enforced,
    schemaRevision: result.schemaRevision,
    contractVersion: CONTRACT_VERSION,
    ...(result.attempts && result.attempts.length > 0 ? { attempts: result.attempts.map(effectAttempt) } : {}),
  };
}

function effectAttempt(attempt: StoredAttempt): EffectAttempt {
  return {
    attemptNumber: attempt.attemptNumber,
    effect: attempt.effect,
    provider: attempt.provider,
    downstreamKey: attempt.downstreamKey,
    status: attempt.status,
    providerHandle: attempt.providerHandle,
    generation: attempt.generation,
    createdAt: attempt.createdAt,
    ...(attempt.resolvedAt ? { resolvedAt: attempt.resolvedAt } : {}),
  };
}

function handOver(
  record: { tenant: string; operationId: string; state: HandOverResult["state"]; generation: number },
  changed: (ref: { tenant: string; operationId: string }) => void,
): HandOverResult {
  changed(record);
  return { state: record.state, generation: record.generation };
}

/** The stored response's fields a snapshot carries both ways (its digest aside). */
function responseFields<S extends Pick<ResponseSnapshot, "statusCode" | "mediaType" | "location" | "businessVersion" | "headers" | "body">>(snapshot: S) {
  return {
    statusCode: snapshot.statusCode,
    mediaType: snapshot.mediaType,
    location: snapshot.location,
    businessVersion: snapshot.businessVersion,
    headers: snapshot.headers,
    body: snapshot.body,
  };
}
