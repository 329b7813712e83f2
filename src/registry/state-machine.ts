import { IdempotencyError, refuse, type Reason } from "../contract/errors.js";
import { FINGERPRINT_SCHEME, fingerprint } from "../contract/fingerprint.js";
import type { OperationPolicy } from "../policy/operations.js";
import type { ClaimMode, EffectStatus, Outcome, RecordState } from "../contract/words.js";
import type { EffectResolution, RequestIdentity, StoredAttempt, StoredRecord } from "./types.js";

/**
 * The rules of the contract's section 3, as pure functions over a record read
 * under its row lock (or, for Reserve, read and then written with a fenced
 * compare-and-set). Each either returns what to do or throws the refusal.
 */

const TERMINAL: ReadonlySet<RecordState> = new Set(["SUCCEEDED", "FAILED_FINAL", "REJECTED"]);

export function isTerminal(state: RecordState): boolean {
  return TERMINAL.has(state);
}

/** Whether someone holds a lease that has not ended, in database time. */
export function leaseLive(record: StoredRecord): boolean {
  return record.leaseExpiresAt !== null && record.leaseExpiresAt.getTime() > record.dbNow.getTime();
}

/**
 * What the attempts say.
 * - possible: some effect may have happened: any attempt, of any effect, is
 *   not NO_EFFECT. Every attempt counts, because a later attempt can never
 *   take back what an earlier one may have done downstream (a NO_EFFECT
 *   answer to attempt 2 says nothing about the request attempt 1 sent).
 * - unresolved: some effect's latest attempt is still PENDING or
 *   INDETERMINATE. Here the latest attempt does speak for the effect: every
 *   attempt of one effect carries the same downstream key, so a definite
 *   answer to a retry with that key settles what the key did.
 */
export function effectFlags(attempts: readonly StoredAttempt[]): { possible: boolean; unresolved: boolean } {
  const latest = new Map<string, StoredAttempt>();
  let possible = false;
  for (const attempt of attempts) {
    if (attempt.status !== "NO_EFFECT") possible = true;
    const seen = latest.get(attempt.effect);
    if (!seen || seen.attemptNumber < attempt.attemptNumber) latest.set(attempt.effect, attempt);
  }
  const unresolved = [...latest.values()].some((a) => a.status === "PENDING" || a.status === "INDETERMINATE");
  return { possible, unresolved };
}

export type ReserveVerdict = { kind: "conflict" } | { kind: "expired" } | { kind: "replay" } | { kind: "in_progress" } | { kind: "takeover" } | { kind: "mark_unknown" };

/**
 * What an existing record means for a new Reserve. A different fingerprint is
 * a conflict in every state, checked first so that no other answer can leak
 * anything about the first request.
 */
export function reserveVerdict(record: StoredRecord, fingerprint: Uint8Array): ReserveVerdict {
  if (!Buffer.from(record.fingerprint).equals(fingerprint)) return { kind: "conflict" };
  if (record.tombstonedAt !== null) return { kind: "expired" };
  if (isTerminal(record.state)) return { kind: "replay" };
  if (record.state === "UNKNOWN" || leaseLive(record)) return { kind: "in_progress" };
  // The lease ended. Leases say who may act, never whether an effect happened:
  // with a possible effect, or once it has been UNKNOWN, the record is never executed again.
  return recoveryOnly(record) ? { kind: "mark_unknown" } : { kind: "takeover" };
}

/** What Reserve's read of its scope found. */
export type ScopeRead =
  /**
   * The scope's record; `inserted` when this request's statement made it.
   * `recordPolicy`: the policy revision the record lives under, once the
   * decision asked for it (needs_record_policy).
   */
  | { kind: "found"; record: StoredRecord; inserted: boolean; recordPolicy?: OperationPolicy }
  /** The insert found a record its snapshot does not show: one committed after the snapshot was taken (the insert waited for it). */
  | { kind: "missed" }
  /** A read found no record. */
  | { kind: "absent" };

/** A Reserve as its decision sees it, judged under its operation's newest policy revision. */
export interface ReserveRequest {
  operation: string;
  /** What the request is (its parts, or a precomputed fingerprint): fingerprinted again under an older revision when its record lives under one. */
  identity: RequestIdentity;
  /** Its fingerprint under the newest revision; undefined when that revision refuses it (`refusal`). */
  fingerprint: Uint8Array | undefined;
  /** Why the newest revision refuses it (REJUDGED): a record made under an older revision may overrule that. */
  refusal: IdempotencyError | undefined;
  /** Why the key rules refuse its key: a record made while they were looser overrules that. */
  keyRefusal: IdempotencyError | undefined;
  /** The newest revision. */
  schemaRevision: number;
  /** The acquisition id it minted: the record that carries it is its own, made by an earlier run whose COMMIT's answer was lost. */
  acquisitionId: string;
}

/** What Reserve does once it has judged the scope's record, each named by the record it acts on. */
export type ReserveOutcome =
  /** ACCEPTED: the request's own record. */
  | { kind: "accept"; record: StoredRecord }
  /** PAYLOAD_CONFLICT, logged on the record for operators (never with content). */
  | { kind: "conflict"; record: StoredRecord }
  | { kind: "expired"; record: StoredRecord }
  | { kind: "replay"; record: StoredRecord }
  | { kind: "in_progress"; record: StoredRecord }
  /** The lease ended with nothing possible: the request takes the record over at the next generation (a compare-and-set on the generation read). */
  | { kind: "takeover"; record: StoredRecord }
  /** The lease ended with a possible effect: the record becomes UNKNOWN (a compare-and-set), and the answer is IN_PROGRESS. */
  | { kind: "mark_unknown"; record: StoredRecord }
  /** A tombstone whose policy allows reuse, past its horizon: a new operation in its place (a compare-and-set). */
  | { kind: "recycle"; record: StoredRecord };

/** What Reserve does with what it read: an outcome, or first a read the decision needs. */
export type ReserveAction =
  | ReserveOutcome
  /** The insert missed a record committed after its snapshot: read the scope anew, and decide again. */
  | { kind: "read_again" }
  /** A tombstone, or a record of another revision: decide again with the policy revision it lives under. */
  | { kind: "needs_record_policy"; record: StoredRecord };

/**
 * Reserve's decision on what its scope holds. A record the request made is
 * accepted; any other is judged under the revision it was made under, so
 * that publishing new rules never refuses a genuine retry: a request the
 * newest revision refuses (payload, or key rules) is refused only when no
 * record overrules it. Refusals are thrown.
 */
export function reserveAction(read: ScopeRead, request: ReserveRequest): ReserveAction {
  if (read.kind === "missed") return { kind: "read_again" };
  // Nothing there, and nothing may be made: the request was refused, or the operation drains.
  if (read.kind === "absent") refuseNew(request);
  const { record, inserted, recordPolicy } = read;
  if (inserted || record.acquisitionId === request.acquisitionId) return { kind: "accept", record };
  const sameRevision = record.schemaRevision === request.schemaRevision;
  if (record.tombstonedAt === null && sameRevision) {
    if (request.refusal) throw request.refusal;
    return { ...reserveVerdict(record, request.fingerprint!), record };
  }
  if (!recordPolicy) return { kind: "needs_record_policy", record };
  if (record.tombstonedAt !== null && tombstoneReusable(record, recordPolicy)) {
    // The scope starts afresh, as a new record would: only for a request that may make one.
    const pending = request.keyRefusal ?? request.refusal;
    if (pending) throw pending;
    return { kind: "recycle", record };
  }
  if (sameRevision && request.refusal) throw request.refusal;
  const underItsRevision = sameRevision ? request.fingerprint : fingerprintUnder(request.identity, recordPolicy);
  return underItsRevision ? { ...reserveVerdict(record, underItsRevision), record } : { kind: "conflict", record };
}

function refuseNew(request: ReserveRequest): never {
  const pending = request.keyRefusal ?? request.refusal;
  if (pending) throw pending;
  refuse("OPERATION_DRAINING", `operation ${request.operation} is draining: it accepts no new requests`);
}

/** Whether a tombstone's scope may be reused now: its policy allows it (old effects cannot reappear) and the horizon passed. */
function tombstoneReusable(record: StoredRecord, policy: OperationPolicy): boolean {
  const { allowed, horizonMs } = policy.retention.tombstoneReuse;
  return allowed && record.tombstonedAt!.getTime() + horizonMs <= record.dbNow.getTime();
}

/** Refusals of a request under the newest revision that a record of an older revision may overrule (keys: see ReserveRequest). */
export const REJUDGED: ReadonlySet<Reason> = new Set(["INVALID_PAYLOAD", "SCHEMA_REVISION_MISMATCH"]);

/** The fingerprint of a Reserve under a revision: computed from the request parts, or checked as precomputed. */
export function requestFingerprint(request: RequestIdentity, policy: OperationPolicy): Uint8Array {
  const rules = policy.fingerprint;
  if (request.kind === "parts") return fingerprint(request.parts, rules);
  const { scheme, schemaRevision, digest } = request;
  if (scheme !== FINGERPRINT_SCHEME) {
    refuse("UNSUPPORTED_FINGERPRINT_SCHEME", `fingerprint.scheme must be ${FINGERPRINT_SCHEME}`);
  }
  if (schemaRevision !== rules.schemaRevision) {
    refuse("SCHEMA_REVISION_MISMATCH", `fingerprint computed under schema revision ${schemaRevision}; compute it under revision ${rules.schemaRevision}`, {
      schema_revision: String(rules.schemaRevision),
    });
  }
  if (digest.byteLength !== 32) refuse("INVALID_REQUEST", "fingerprint.digest must be the 32-byte SHA-256 digest");
  return digest;
}

/**
 * The fingerprint of a request under the older revision its record was made
 * under, or undefined when the request is not valid under that revision (so
 * it cannot be the same request: a conflict).
 */
function fingerprintUnder(request: RequestIdentity, policy: OperationPolicy): Uint8Array | undefined {
  try {
    return requestFingerprint(request, policy);
  } catch (error) {
    if (error instanceof IdempotencyError && error.reason === "INVALID_PAYLOAD") return undefined;
    throw error;
  }
}

/**
 * Whether only recovery may act on the record: an effect may have happened,
 * or it has been UNKNOWN. UNKNOWN is for good: what an owner that lost track
 * says afterwards (its attempts resolved NO_EFFECT once the lease ended) does
 * not make it safe to run again. Only an operator's reconciliation reopens it.
 */
export function recoveryOnly(record: StoredRecord): boolean {
  return record.effectPossible || record.wentUnknown;
}

/** The hint for a request that finds an owner at work: from 250 ms, growing with the owner's time at it, at most 2 s. */
const OWNER_HINT_MS = { min: 250, max: 2000 };
/** The longest hint for a record awaiting recovery. */
const RECOVERY_HINT_MAX_MS = 60_000;

/**
 * When a request that found this unfinished record should come back
 * (Retry-After), from what is actually expected rather than from the lease:
 * - an owner at work: about as long again as it has been at it since the
 *   record last changed, from 250 ms to 2 s, and never past its lease's
 *   end (then the retry may take over). Most owners answer well within
 *   their lease, which only bounds a silent one;
 * - UNKNOWN: the recovery cadence (the recoverer's interval), growing to a
 *   quarter of the time the record has waited, at most a minute (or the
 *   cadence, when it is longer: sooner than that nothing changes): a record
 *   that recovery has not settled for long needs a person, not more retries.
 */
export function retryAfterMs(record: StoredRecord, recoveryCadenceMs: number): number {
  const sinceChange = Math.max(0, record.dbNow.getTime() - record.updatedAt.getTime());
  if (record.state === "UNKNOWN") {
    return Math.round(Math.max(recoveryCadenceMs, Math.min(sinceChange / 4, RECOVERY_HINT_MAX_MS)));
  }
  const atWork = Math.min(Math.max(sinceChange, OWNER_HINT_MS.min), OWNER_HINT_MS.max);
  const leaseLeft = record.leaseExpiresAt ? record.leaseExpiresAt.getTime() - record.dbNow.getTime() : atWork;
  return Math.round(Math.max(100, Math.min(atWork, leaseLeft)));
}

/**
 * How long a gateway may answer exact repeats of this replayed record from
 * its own cache (ReserveResponse.cacheable_for), or undefined: not at all.
 * Only a finished record of an enforced operation (a draining or shadowed
 * one is on its way to another answer), at most `maxAgeMs` (the operator's
 * bound on how late a mode change or rollback reaches a gateway), and never
 * past its retention: once that ends the sweep may make it a tombstone at
 * any moment, and its answer becomes EXPIRED. Counted from the database's
 * time of the read, which is later than the gateway sent its request.
 */
export function replayCacheableForMs(record: StoredRecord, mode: OperationPolicy["mode"], maxAgeMs: number): number | undefined {
  if (maxAgeMs <= 0 || mode !== "ENFORCE" || !isTerminal(record.state) || record.tombstonedAt !== null || !record.snapshot || !record.retainUntil) return undefined;
  const retainedMs = record.retainUntil.getTime() - record.dbNow.getTime();
  const cacheableMs = Math.floor(Math.min(maxAgeMs, retainedMs));
  return cacheableMs > 0 ? cacheableMs : undefined;
}

/** Refuses a write that names a generation other than the record's. */
export function requireGeneration(record: StoredRecord, generation: number): void {
  if (generation < record.generation) {
    refuse(
      "STALE_GENERATION",
      `generation ${generation} is not current (the record is at generation ${record.generation}): ` + "another owner took over; stop and do not repeat this write",
      { current_generation: String(record.generation) },
    );
  }
  if (generation > record.generation) {
    refuse(
      "STALE_GENERATION",
      `generation ${generation} was never granted: the record is at generation ${record.generation}. ` +
        "A generation comes from Reserve or Claim on this record: send the one you were given",
      { current_generation: String(record.generation) },
    );
  }
}

function refuseFinished(record: StoredRecord): never {
  refuse("INVALID_TRANSITION", `the operation already finished as ${record.state}; retries get its stored response`, {
    state: record.state,
  });
}

export type ClaimPlan = "own" | "renew" | "takeover" | "recover";

/** Which ownership a Claim gets, or why not. */
export function planClaim(record: StoredRecord, mode: ClaimMode, generation: number): ClaimPlan {
  requireGeneration(record, generation);
  if (isTerminal(record.state)) refuseFinished(record);
  switch (mode) {
    case "OWNER":
      if (record.state === "RESERVED" && record.wentUnknown) refuseWentUnknown(record, "claimed as its owner: claim it with RECOVER");
      if (record.state === "RESERVED") return "own";
      if (record.state === "EXECUTING") return "renew";
      return refuse(
        "INVALID_TRANSITION",
        "the record is UNKNOWN: the lease expired with a possible effect. You may still resolve your attempts " +
          "and Complete with your generation; otherwise a recovery worker claims it with RECOVER",
        { state: record.state },
      );
    case "TAKEOVER":
      if (record.state === "UNKNOWN") {
        refuse("INVALID_TRANSITION", "the record is UNKNOWN and is never executed again; claim it with RECOVER", {
          state: record.state,
        });
      }
      refuseLiveLease(record);
      if (record.effectPossible) {
        refuse("INVALID_TRANSITION", "an effect may have happened, so the record cannot be executed again; claim it with RECOVER", { state: record.state });
      }
      if (record.wentUnknown) refuseWentUnknown(record, "taken over: claim it with RECOVER");
      return "takeover";
    case "RECOVER":
      if (record.state === "UNKNOWN") return "recover";
      refuseLiveLease(record);
      if (!recoveryOnly(record)) {
        refuse("INVALID_TRANSITION", "no effect is possible, so there is nothing to recover; claim it with TAKEOVER", {
          state: record.state,
        });
      }
      return "recover";
  }
}

/** Refuses what would run a record again that has been UNKNOWN (`what`: "released", "taken over: …"). */
function refuseWentUnknown(record: StoredRecord, what: string): never {
  refuse(
    "INVALID_TRANSITION",
    `the record has been UNKNOWN, so it is never executed again and cannot be ${what}. ` + "Resolve its attempts and Complete it, or an operator reconciles it with evidence",
    { state: record.state },
  );
}

function refuseLiveLease(record: StoredRecord): void {
  if (leaseLive(record)) {
    refuse("LEASE_HELD", `another owner holds the lease until ${record.leaseExpiresAt!.toISOString()}; retry after it`, {
      lease_expires_at: record.leaseExpiresAt!.toISOString(),
    });
  }
}

/** Whether the holder of `generation` may extend its lease. */
export function checkRenew(record: StoredRecord, generation: number): void {
  requireGeneration(record, generation);
  if (isTerminal(record.state)) refuseFinished(record);
  if (record.state === "RESERVED" && record.leaseExpiresAt === null) {
    // Released: it waits for the next identical retry to take it over; a lease would keep that retry out.
    refuse("INVALID_TRANSITION", "the reservation was released; nothing holds it any more (Claim OWNER takes it again)", { state: record.state });
  }
  if (record.state === "UNKNOWN") {
    refuse(
      "LEASE_EXPIRED",
      "your lease expired with a possible effect and the record is UNKNOWN: it cannot be renewed, " + "but you may still resolve your attempts and Complete",
      { state: record.state },
    );
  }
}

/** Whether the holder of `generation` may register an attempt of `effect` now. */
export function checkRecordEffect(record: StoredRecord, attempts: readonly StoredAttempt[], generation: number, effect: string): void {
  requireGeneration(record, generation);
  if (isTerminal(record.state)) refuseFinished(record);
  if (record.state === "RESERVED") {
    refuse("INVALID_TRANSITION", "claim the operation (Claim OWNER, or Reserve with claim) before registering effects", {
      state: record.state,
    });
  }
  if (record.state === "UNKNOWN" || !leaseLive(record)) {
    refuse("LEASE_EXPIRED", "a new effect attempt needs a live lease: renew it first (RenewLease)", {
      state: record.state,
    });
  }
  // Recovery, and any generation after the record was UNKNOWN, only replays what was registered.
  if ((record.recovering || record.wentUnknown) && !attempts.some((a) => a.effect === effect)) {
    refuse(
      "NEW_EFFECT_IN_RECOVERY",
      `recovery may only replay effects already registered (${[...new Set(attempts.map((a) => a.effect))].join(", ")}), ` + "with their original downstream keys",
    );
  }
}

export type ResolvePlan = "resolve" | "unchanged";

/** Whether attempt `attempt` may take `status`. */
export function planResolve(record: StoredRecord, attempt: StoredAttempt | undefined, generation: number, status: EffectStatus, providerHandle: string): ResolvePlan {
  requireGeneration(record, generation);
  if (isTerminal(record.state)) refuseFinished(record);
  if (!attempt) refuse("ATTEMPT_NOT_FOUND", "no effect attempt with this number on the operation");
  if (attempt.status === "CONFIRMED" || attempt.status === "NO_EFFECT") {
    if (attempt.status === status && (providerHandle === "" || providerHandle === attempt.providerHandle)) {
      return "unchanged";
    }
    refuse("ATTEMPT_ALREADY_RESOLVED", `attempt ${attempt.attemptNumber} was already resolved as ${attempt.status}`, {
      status: attempt.status,
    });
  }
  return "resolve";
}

/**
 * Complete's resolutions, on a record read under its lock: each judged as
 * ResolveEffectAttempt judges it, the attempts as they are once the ones
 * that change something (`changes`) are made, and for each change whether an
 * effect is possible once it is made (what ResolveEffectAttempt would set).
 * On a finished record (a repeat of the Complete that finished it) each must
 * be what is stored.
 */
export function planResolutions(
  record: StoredRecord,
  attempts: readonly StoredAttempt[],
  generation: number,
  resolutions: readonly EffectResolution[],
): { attempts: StoredAttempt[]; changes: Array<EffectResolution & { effectPossible: boolean }> } {
  if (isTerminal(record.state)) {
    for (const resolution of resolutions) {
      const attempt = attempts.find((a) => a.attemptNumber === resolution.attemptNumber);
      if (!attempt) refuse("ATTEMPT_NOT_FOUND", `no effect attempt ${resolution.attemptNumber} on the operation`);
      const same = attempt.status === resolution.status && (resolution.providerHandle === "" || resolution.providerHandle === attempt.providerHandle);
      if (!same) refuse("ATTEMPT_ALREADY_RESOLVED", `attempt ${attempt.attemptNumber} was already resolved as ${attempt.status}`, { status: attempt.status });
    }
    return { attempts: [...attempts], changes: [] };
  }
  let after = [...attempts];
  const changes: Array<EffectResolution & { effectPossible: boolean }> = [];
  for (const resolution of resolutions) {
    const attempt = after.find((a) => a.attemptNumber === resolution.attemptNumber);
    if (planResolve(record, attempt, generation, resolution.status, resolution.providerHandle) === "unchanged") continue;
    after = after.map((a) =>
      a.attemptNumber === resolution.attemptNumber ? { ...a, status: resolution.status, providerHandle: resolution.providerHandle || a.providerHandle } : a,
    );
    changes.push({ ...resolution, effectPossible: effectFlags(after).possible });
  }
  return { attempts: after, changes };
}

export type CompletePlan = "complete" | "repeat";

/** Whether the holder of `generation` may finish the operation with `outcome`. */
export function planComplete(record: StoredRecord, attempts: readonly StoredAttempt[], generation: number, outcome: Outcome, digest: Uint8Array): CompletePlan {
  if (isTerminal(record.state)) {
    const identical = record.state === outcome && Buffer.from(record.snapshot!.digest).equals(digest);
    if (identical && generation === record.generation) return "repeat";
    requireGeneration(record, generation);
    refuse("ALREADY_COMPLETED", `the operation already finished as ${record.state} with another snapshot`, {
      state: record.state,
    });
  }
  requireGeneration(record, generation);
  if (record.state === "RESERVED" && outcome !== "REJECTED") {
    refuse("INVALID_TRANSITION", "claim the operation before completing it with SUCCEEDED or FAILED_FINAL", {
      state: record.state,
    });
  }
  if (effectFlags(attempts).unresolved) {
    refuse("UNRESOLVED_EFFECTS", "an effect's latest attempt is still PENDING or INDETERMINATE: resolve it (ResolveEffectAttempt) before completing");
  }
  if (outcome === "REJECTED" && record.effectPossible) {
    refuse("EFFECT_POSSIBLE", "an effect happened or may have, so the operation cannot be REJECTED; use FAILED_FINAL");
  }
  return "complete";
}

export type ReleasePlan = "release" | "repeat";

/** Whether the holder of `generation` may hand the reservation back. */
export function planRelease(record: StoredRecord, generation: number): ReleasePlan {
  requireGeneration(record, generation);
  if (isTerminal(record.state)) refuseFinished(record);
  if (record.effectPossible) {
    refuse("EFFECT_POSSIBLE", "an effect happened or may have, so the reservation cannot be released");
  }
  if (record.wentUnknown) refuseWentUnknown(record, "released");
  if (record.state === "RESERVED" && record.leaseExpiresAt === null) return "repeat";
  return "release";
}

export type AbandonPlan = "release" | "unknown" | "repeat";

/**
 * What an owner's Abandon does: without a possible effect it is a Release;
 * with one (or on a record that has been UNKNOWN, held by recovery) the
 * record becomes UNKNOWN now rather than when the lease ends, because the
 * owner knows it will not finish and only recovery may.
 */
export function planAbandon(record: StoredRecord, generation: number): AbandonPlan {
  requireGeneration(record, generation);
  if (isTerminal(record.state)) refuseFinished(record);
  if (record.state === "UNKNOWN") return "repeat";
  if (recoveryOnly(record)) return "unknown";
  return planRelease(record, generation);
}
