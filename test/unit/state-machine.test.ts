import { describe, expect, it } from "vitest";
import { IdempotencyError, type Reason } from "../../src/contract/errors.js";
import { FINGERPRINT_SCHEME, fingerprint, type RequestParts } from "../../src/contract/fingerprint.js";
import { parsePolicyDocument } from "../../src/policy/document.js";
import { toOperationPolicy, type OperationPolicy } from "../../src/policy/operations.js";
import {
  checkRecordEffect,
  checkRenew,
  effectFlags,
  isTerminal,
  leaseLive,
  planAbandon,
  planClaim,
  planComplete,
  planRelease,
  planResolve,
  requireGeneration,
  reserveAction,
  replayCacheableForMs,
  reserveVerdict,
  retryAfterMs,
  type ReserveAction,
  type ReserveRequest,
  type ReserveVerdict,
  type ScopeRead,
} from "../../src/registry/state-machine.js";
import type { ClaimMode, EffectStatus, Outcome, RecordState } from "../../src/contract/words.js";
import type { StoredAttempt, StoredRecord } from "../../src/registry/types.js";
import { expectReason } from "../support/refusals.js";

/**
 * The rules of a record's life (docs/lifecycle.md) as the pure functions the
 * registry applies under a record's row lock. Every case is a row of a table:
 * the record as read (state, generation, lease, possible effect, recovering,
 * attempts) and what is asked, against the plan or the refusal (reason and
 * the metadata the client receives in ErrorInfo).
 */

/** The database's clock when the record was read: leases are judged against it, never against this process's clock. */
const NOW = new Date("2026-11-30T12:00:00.000Z");
const at = (offsetMs: number): Date => new Date(NOW.getTime() + offsetMs);

const FINGERPRINT = new Uint8Array(32).fill(0x5a);
const DIGEST = new Uint8Array(32).fill(0x3c);
const GENERATION = 3;

const STATES: readonly RecordState[] = ["RESERVED", "EXECUTING", "SUCCEEDED", "FAILED_FINAL", "REJECTED", "UNKNOWN"];
const TERMINAL_STATES = ["SUCCEEDED", "FAILED_FINAL", "REJECTED"] as const satisfies readonly Outcome[];
const MODES: readonly ClaimMode[] = ["OWNER", "TAKEOVER", "RECOVER"];

/** How the record's lease stands when it is read: held, ended, ending at the very instant of the read, or none (released or finished). */
type Lease = "live" | "ended" | "ends-now" | "none";

const LEASE_END: Record<Lease, Date | null> = {
  live: at(30_000),
  ended: at(-1_000),
  "ends-now": NOW,
  none: null,
};

type Shape = Partial<StoredRecord> & { lease?: Lease; tombstoned?: boolean };

/**
 * A record as the registry reads it. Defaults: EXECUTING at generation 3
 * with a live lease and no possible effect; a finished record has its
 * snapshot (digest DIGEST) and no lease, an UNKNOWN one an ended lease.
 */
function record(shape: Shape = {}): StoredRecord {
  const { state = "EXECUTING", tombstoned = false, lease: asked, ...fields } = shape;
  const finished = isTerminal(state);
  const lease = asked ?? (finished ? "none" : state === "UNKNOWN" ? "ended" : "live");
  return {
    tenant: "acme",
    scope: new Uint8Array(32).fill(0x11),
    operationId: "0190d8a0-7a1b-7c2d-8e3f-405162738495",
    principal: "alice",
    operation: "payments.create",
    apiRevision: 1,
    schemaRevision: 1,
    fingerprint: FINGERPRINT,
    state,
    generation: GENERATION,
    recovering: false,
    leaseExpiresAt: LEASE_END[lease],
    acquisitionId: "6f1c7c53-4b0e-4a8f-9a53-6f2d0e7b9c11",
    writerEpoch: 0,
    effectPossible: false,
    // Only a record that has been UNKNOWN is held by recovery (migrations/000015).
    wentUnknown: state === "UNKNOWN" || shape.recovering === true,
    snapshot: finished
      ? {
          statusCode: 201,
          mediaType: "application/json",
          location: "",
          businessVersion: "",
          headers: [],
          // A tombstone keeps the digest and drops the body.
          body: tombstoned ? new Uint8Array() : new TextEncoder().encode('{"id":"p_1"}'),
          digest: DIGEST,
          keyId: null,
        }
      : null,
    createdAt: at(-60_000),
    updatedAt: at(-1_000),
    completedAt: finished ? at(-1_000) : null,
    retainUntil: finished ? at(86_400_000) : null,
    tombstonedAt: tombstoned ? at(-500) : null,
    dbNow: NOW,
    ...fields,
  };
}

/** Attempt `attemptNumber` of `effect`, as stored. */
function attempt(effect: string, attemptNumber: number, status: EffectStatus, providerHandle = ""): StoredAttempt {
  return {
    attemptNumber,
    registrationId: null,
    effect,
    provider: "cards",
    downstreamKey: `dk_${effect}`,
    status,
    providerHandle,
    generation: GENERATION,
    createdAt: at(-10_000),
    resolvedAt: status === "PENDING" ? null : at(-5_000),
  };
}

/** What a rule decided: its plan (undefined for checks that only refuse), or its refusal. */
type Decided<T> = { plan: T } | { refused: Reason; metadata: Record<string, string> };

function decide<T>(rule: () => T): Decided<T> {
  try {
    return { plan: rule() };
  } catch (error) {
    if (!(error instanceof IdempotencyError)) throw error;
    // Every refusal tells the client what to do: never an empty message.
    expect(error.message.trim().length, `${error.reason} has a message`).toBeGreaterThan(0);
    return { refused: error.reason, metadata: { ...error.metadata } };
  }
}

const plan = <T>(value: T): Decided<T> => ({ plan: value });
const ALLOWED: Decided<void> = { plan: undefined };
const refused = (reason: Reason, metadata: Record<string, string> = {}): { refused: Reason; metadata: Record<string, string> } => ({ refused: reason, metadata });
const stale = refused("STALE_GENERATION", { current_generation: String(GENERATION) });
/** INVALID_TRANSITION, naming the state the record is in. */
const transition = (state: RecordState) => refused("INVALID_TRANSITION", { state });
const leaseHeld = refused("LEASE_HELD", { lease_expires_at: LEASE_END.live!.toISOString() });

describe("isTerminal", () => {
  it.each(STATES.map((state) => [state, TERMINAL_STATES.includes(state as Outcome)] as const))("says whether %s is finished: %s", (state, terminal) => {
    expect(isTerminal(state)).toBe(terminal);
  });
});

describe("leaseLive", () => {
  it.each([
    ["a lease ending after the read is live", record({ lease: "live" }), true],
    ["a lease ending 1 ms after the read is live", record({ leaseExpiresAt: at(1) }), true],
    ["a lease ending at the very instant of the read has ended", record({ lease: "ends-now" }), false],
    ["a lease that ended before the read has ended", record({ lease: "ended" }), false],
    ["no lease (released or finished) is not live", record({ state: "RESERVED", lease: "none" }), false],
    // Judged by the database's clock at the read: a lease far past this process's clock may still be live there.
    ["a lease is judged by the database's clock, not this process's", record({ leaseExpiresAt: new Date(2000, 0, 2), dbNow: new Date(2000, 0, 1) }), true],
  ] as const)("%s", (_name, stored, live) => {
    expect(leaseLive(stored)).toBe(live);
  });
});

describe("requireGeneration", () => {
  it.each([
    ["accepts the record's own generation", GENERATION, ALLOWED],
    ["refuses an older generation (someone took over since)", GENERATION - 1, stale],
    ["refuses a newer generation than the record has", GENERATION + 1, stale],
    ["refuses generation 0, which no owner ever holds", 0, stale],
  ] as const)("%s", (_name, generation, expected) => {
    expect(decide(() => requireGeneration(record(), generation))).toStrictEqual(expected);
  });
});

describe("reserveVerdict", () => {
  const other = new Uint8Array(FINGERPRINT);
  other[31] = 0x00;
  const verdict = (kind: ReserveVerdict["kind"]): ReserveVerdict => ({ kind });

  // A different request under the same key: a conflict whatever the record's state, so that no other answer reveals anything of the first request.
  const conflicts: Array<[string, StoredRecord, Uint8Array]> = [
    ...STATES.map((state): [string, StoredRecord, Uint8Array] => [`${state} with its usual lease`, record({ state }), other]),
    ...TERMINAL_STATES.map((state): [string, StoredRecord, Uint8Array] => [`a tombstoned ${state}`, record({ state, tombstoned: true }), other]),
    ["EXECUTING whose lease ended with a possible effect (same request: mark UNKNOWN)", record({ lease: "ended", effectPossible: true }), other],
    ["EXECUTING whose lease ended with nothing possible (same request: take over)", record({ lease: "ended" }), other],
    ["RESERVED released without a lease (same request: take over)", record({ state: "RESERVED", lease: "none" }), other],
    ["SUCCEEDED, asked with a prefix of its fingerprint", record({ state: "SUCCEEDED" }), FINGERPRINT.slice(0, 31)],
    ["SUCCEEDED, asked with its fingerprint and one more byte", record({ state: "SUCCEEDED" }), new Uint8Array([...FINGERPRINT, 0x5a])],
  ];

  it.each(conflicts)("answers conflict to a different fingerprint: %s", (_name, stored, fingerprint) => {
    expect(reserveVerdict(stored, fingerprint)).toStrictEqual(verdict("conflict"));
  });

  it.each([
    ["expired for a tombstoned SUCCEEDED record", record({ state: "SUCCEEDED", tombstoned: true }), "expired"],
    ["expired for a tombstoned FAILED_FINAL record", record({ state: "FAILED_FINAL", tombstoned: true }), "expired"],
    ["expired for a tombstoned REJECTED record", record({ state: "REJECTED", tombstoned: true }), "expired"],
    ["replay for SUCCEEDED", record({ state: "SUCCEEDED" }), "replay"],
    ["replay for FAILED_FINAL", record({ state: "FAILED_FINAL" }), "replay"],
    ["replay for REJECTED", record({ state: "REJECTED" }), "replay"],
    ["in_progress for UNKNOWN whose lease ended: it is never executed again", record({ state: "UNKNOWN", effectPossible: true }), "in_progress"],
    ["in_progress for UNKNOWN without a lease", record({ state: "UNKNOWN", effectPossible: true, lease: "none" }), "in_progress"],
    ["in_progress for UNKNOWN whose attempts all turned out NO_EFFECT", record({ state: "UNKNOWN", effectPossible: false }), "in_progress"],
    ["in_progress for EXECUTING with a live lease", record({ state: "EXECUTING", lease: "live" }), "in_progress"],
    ["in_progress for EXECUTING with a live lease and a possible effect", record({ state: "EXECUTING", lease: "live", effectPossible: true }), "in_progress"],
    ["in_progress for RESERVED with a live lease", record({ state: "RESERVED", lease: "live" }), "in_progress"],
    ["in_progress for a lease that ends 1 ms after the read", record({ leaseExpiresAt: at(1) }), "in_progress"],
    ["takeover for EXECUTING whose lease ended with nothing possible", record({ state: "EXECUTING", lease: "ended" }), "takeover"],
    ["takeover for EXECUTING whose lease ends at the instant of the read", record({ state: "EXECUTING", lease: "ends-now" }), "takeover"],
    ["takeover for RESERVED whose lease ended", record({ state: "RESERVED", lease: "ended" }), "takeover"],
    ["takeover for RESERVED released without a lease", record({ state: "RESERVED", lease: "none" }), "takeover"],
    ["mark_unknown for EXECUTING whose lease ended with a possible effect", record({ state: "EXECUTING", lease: "ended", effectPossible: true }), "mark_unknown"],
    ["mark_unknown for EXECUTING whose lease ends at the instant of the read with a possible effect", record({ lease: "ends-now", effectPossible: true }), "mark_unknown"],
    ["mark_unknown for a recovering EXECUTING record whose lease ended", record({ lease: "ended", effectPossible: true, recovering: true }), "mark_unknown"],
    ["mark_unknown for a recovering record whose lease ended with every attempt NO_EFFECT", record({ lease: "ended", recovering: true }), "mark_unknown"],
    ["mark_unknown for a record that went UNKNOWN before, whose lease ended", record({ lease: "ended", wentUnknown: true }), "mark_unknown"],
  ] as const)("answers the same request with %s", (_name, stored, kind) => {
    expect(reserveVerdict(stored, new Uint8Array(FINGERPRINT))).toStrictEqual(verdict(kind));
  });
});

describe("reserveAction", () => {
  /** The request's own acquisition id: a record carrying it is its own. */
  const MINE = "0b7e9d54-1c2f-4a3b-8d4e-5f60718293a4";
  const small: RequestParts = { method: "POST", path: "/v1/payments", query: "", mediaType: "application/json", headers: [], body: new TextEncoder().encode('{"a":1}') };
  const large: RequestParts = { ...small, body: new Uint8Array(64) };

  /** Revision 1 of the operation, which the records below live under: bodies of at most 16 bytes; `reuse`: tombstones reusable 2 days after they were made. */
  const revision1 = (reuse: boolean): OperationPolicy =>
    toOperationPolicy(
      parsePolicyDocument({
        operation: "payments.create",
        apiRevision: 1,
        schemaRevision: 1,
        fingerprint: { maxBodyBytes: 16 },
        retention: { tombstoneReuse: reuse ? { allowed: true, horizon: "2d" } : { allowed: false } },
      }),
    );
  const REUSABLE = revision1(true);
  const KEPT = revision1(false);
  /** The small request's fingerprint under revision 1. */
  const SMALL_UNDER_1 = fingerprint(small, KEPT.fingerprint);

  const keyRefused = new IdempotencyError("INVALID_KEY", "the key is too short");
  const payloadRefused = new IdempotencyError("INVALID_PAYLOAD", "the body is too large");

  /** A request judged under revision `schemaRevision` (default 1, the records' own), fingerprinted FINGERPRINT unless refused. */
  function request(overrides: Partial<ReserveRequest> = {}): ReserveRequest {
    return {
      operation: "payments.create",
      identity: { kind: "fingerprint", scheme: FINGERPRINT_SCHEME, schemaRevision: overrides.schemaRevision ?? 1, digest: FINGERPRINT },
      fingerprint: overrides.refusal ? undefined : FINGERPRINT,
      refusal: undefined,
      keyRefusal: undefined,
      schemaRevision: 1,
      acquisitionId: MINE,
      ...overrides,
    };
  }
  /** The same small request, as the newest revision 2 judges it: its parts, and what that revision makes of them. */
  const underRevision2 = (overrides: Partial<ReserveRequest> = {}): ReserveRequest =>
    request({ schemaRevision: 2, identity: { kind: "parts", parts: small }, fingerprint: new Uint8Array(32).fill(0x77), ...overrides });

  const found = (stored: StoredRecord, recordPolicy?: OperationPolicy): ScopeRead => ({
    kind: "found",
    record: stored,
    inserted: false,
    ...(recordPolicy ? { recordPolicy } : {}),
  });
  const acts = (kind: Exclude<ReserveAction["kind"], "read_again">, stored: StoredRecord): Decided<ReserveAction> => plan({ kind, record: stored });

  const other = new Uint8Array(FINGERPRINT);
  other[31] = 0x00;
  const finished = record({ state: "SUCCEEDED" });
  /** Tombstones, made 3 days (past the horizon of 2) or 500 ms before the read. */
  const DAYS_AGO_3 = at(-3 * 86_400_000);
  const oldTombstone = record({ state: "SUCCEEDED", tombstoned: true, tombstonedAt: DAYS_AGO_3 });
  const newTombstone = record({ state: "SUCCEEDED", tombstoned: true });
  /** A record of revision 1 met by requests judged under revision 2. */
  const older = (shape: Shape = {}) => record({ state: "SUCCEEDED", fingerprint: SMALL_UNDER_1, ...shape });

  const rows: Array<[string, ScopeRead, ReserveRequest, Decided<ReserveAction>]> = [
    // Nothing in the scope.
    ["reads again when the insert's snapshot missed a record committed after it", { kind: "missed" }, request(), plan({ kind: "read_again" })],
    ["refuses a request that may make no record, where none is, as its operation drains", { kind: "absent" }, request(), refused("OPERATION_DRAINING")],
    ["refuses a key the rules refuse, where no record overrules them", { kind: "absent" }, request({ keyRefusal: keyRefused }), refused("INVALID_KEY")],
    ["refuses a payload the newest revision refuses, where no record overrules it", { kind: "absent" }, request({ refusal: payloadRefused }), refused("INVALID_PAYLOAD")],
    ["refuses the key before the payload", { kind: "absent" }, request({ keyRefusal: keyRefused, refusal: payloadRefused }), refused("INVALID_KEY")],

    // The request's own record.
    ["accepts the record its insert made", { kind: "found", record: record({ state: "RESERVED" }), inserted: true }, request(), acts("accept", record({ state: "RESERVED" }))],
    [
      "accepts the record an earlier run made before its COMMIT's answer was lost (its acquisition id)",
      found(record({ acquisitionId: MINE })),
      request(),
      acts("accept", record({ acquisitionId: MINE })),
    ],

    // Someone else's record, of the request's revision: the verdict.
    ["answers a conflict to a different fingerprint", found(finished), request({ fingerprint: other }), acts("conflict", finished)],
    ["replays a finished record", found(finished), request(), acts("replay", finished)],
    ["answers in progress for an owner at work", found(record()), request(), acts("in_progress", record())],
    ["takes over a record whose lease ended with nothing possible", found(record({ lease: "ended" })), request(), acts("takeover", record({ lease: "ended" }))],
    [
      "marks a record whose lease ended with a possible effect UNKNOWN",
      found(record({ lease: "ended", effectPossible: true })),
      request(),
      acts("mark_unknown", record({ lease: "ended", effectPossible: true })),
    ],
    ["judges a key the rules now refuse against the record made while they were looser", found(finished), request({ keyRefusal: keyRefused }), acts("replay", finished)],
    ["refuses a payload the record's own revision refuses", found(finished), request({ refusal: payloadRefused }), refused("INVALID_PAYLOAD")],

    // A tombstone, or a record of another revision: judged under the policy revision it lives under.
    ["asks for the policy of a tombstone", found(oldTombstone), request(), plan({ kind: "needs_record_policy", record: oldTombstone })],
    ["asks for the policy of a record of an older revision", found(older()), underRevision2(), plan({ kind: "needs_record_policy", record: older() })],
    ["recycles a tombstone past its reuse horizon", found(oldTombstone, REUSABLE), request(), acts("recycle", oldTombstone)],
    [
      "recycles a reusable tombstone for another payload too: the scope starts afresh",
      found(oldTombstone, REUSABLE),
      request({ fingerprint: other }),
      acts("recycle", oldTombstone),
    ],
    [
      "recycles a reusable tombstone of an older revision",
      found(older({ tombstoned: true, tombstonedAt: DAYS_AGO_3 }), REUSABLE),
      underRevision2(),
      acts("recycle", older({ tombstoned: true, tombstonedAt: DAYS_AGO_3 })),
    ],
    ["refuses a key the rules refuse instead of recycling a tombstone", found(oldTombstone, REUSABLE), request({ keyRefusal: keyRefused }), refused("INVALID_KEY")],
    ["refuses a refused payload instead of recycling a tombstone", found(oldTombstone, REUSABLE), request({ refusal: payloadRefused }), refused("INVALID_PAYLOAD")],
    ["answers expired for a tombstone within its reuse horizon", found(newTombstone, REUSABLE), request(), acts("expired", newTombstone)],
    ["answers expired for a tombstone its policy never reuses", found(oldTombstone, KEPT), request(), acts("expired", oldTombstone)],
    ["answers a conflict to another payload for a tombstone kept", found(oldTombstone, KEPT), request({ fingerprint: other }), acts("conflict", oldTombstone)],
    ["replays a record of an older revision to the same request fingerprinted under that revision", found(older(), KEPT), underRevision2(), acts("replay", older())],
    [
      "replays a record of an older revision to a request the newest revision refuses",
      found(older(), KEPT),
      underRevision2({ fingerprint: undefined, refusal: payloadRefused }),
      acts("replay", older()),
    ],
    [
      "answers a conflict to a request that is another one under the record's revision",
      found(older({ fingerprint: other }), KEPT),
      underRevision2(),
      acts("conflict", older({ fingerprint: other })),
    ],
    [
      "answers a conflict to a request the record's revision refuses: it cannot be the same request",
      found(older(), KEPT),
      underRevision2({ identity: { kind: "parts", parts: large } }),
      acts("conflict", older()),
    ],
    [
      "refuses a fingerprint precomputed under the newest revision for a record of an older one",
      found(older(), KEPT),
      underRevision2({ identity: { kind: "fingerprint", scheme: FINGERPRINT_SCHEME, schemaRevision: 2, digest: FINGERPRINT } }),
      refused("SCHEMA_REVISION_MISMATCH", { schema_revision: "1" }),
    ],
  ];

  it.each(rows)("%s", (_name, read, asked, expected) => {
    expect(decide(() => reserveAction(read, asked))).toStrictEqual(expected);
  });

  it("never asks twice: given the record's policy, every found record is decided", () => {
    for (const stored of [oldTombstone, newTombstone, older(), older({ tombstoned: true }), finished]) {
      for (const policy of [REUSABLE, KEPT]) {
        const action = decide(() => reserveAction(found(stored, policy), underRevision2()));
        expect("plan" in action ? action.plan.kind : action.refused).not.toBe("needs_record_policy");
      }
    }
  });
});

describe("retryAfterMs", () => {
  const CADENCE = 1000;
  /** A record last changed `sinceChangeMs` before the read, whose lease has `leaseLeftMs` left (null: no lease). */
  const unfinished = (state: RecordState, sinceChangeMs: number, leaseLeftMs: number | null = 30_000) =>
    record({ state, updatedAt: at(-sinceChangeMs), leaseExpiresAt: leaseLeftMs === null ? null : at(leaseLeftMs) });

  it.each([
    ["250 ms (the floor) for an owner that just started", unfinished("EXECUTING", 0), 250],
    ["250 ms (the floor) for an owner at work for 100 ms", unfinished("EXECUTING", 100), 250],
    ["about as long again as the owner has been at it (800 ms)", unfinished("EXECUTING", 800), 800],
    ["just under the cap (1999 ms)", unfinished("EXECUTING", 1999), 1999],
    ["the cap, 2 s, at 2 s of work", unfinished("EXECUTING", 2000), 2000],
    ["the cap, 2 s, after ten minutes of work", unfinished("EXECUTING", 600_000), 2000],
    ["the lease's end when it comes before the hint (600 ms left)", unfinished("EXECUTING", 1500, 600), 600],
    ["the lease's end even under the 250 ms floor (150 ms left)", unfinished("EXECUTING", 0, 150), 150],
    ["100 ms (the floor) when the lease ends in 40 ms", unfinished("EXECUTING", 1500, 40), 100],
    ["100 ms (the floor) when the lease ends at the read", unfinished("EXECUTING", 1500, 0), 100],
    ["100 ms (the floor) when the lease ended 5 s ago", unfinished("EXECUTING", 1500, -5000), 100],
    ["the owner's hint for RESERVED with a live lease", unfinished("RESERVED", 700), 700],
    ["the owner's hint, uncapped by a lease, for RESERVED without one", unfinished("RESERVED", 1200, null), 1200],
    ["250 ms when the record seems to have changed after the read (clock step)", unfinished("EXECUTING", -5000), 250],
  ] as const)("for an owner at work: %s", (_name, stored, expected) => {
    expect(retryAfterMs(stored, CADENCE)).toBe(expected);
  });

  it.each([
    ["the cadence for a record that just became UNKNOWN", 0, CADENCE, CADENCE],
    ["the cadence while a quarter of the wait is shorter (3 s waited)", 3000, CADENCE, CADENCE],
    ["a quarter of the wait once it is longer than the cadence (10 s waited)", 10_000, CADENCE, 2500],
    ["a quarter of the wait rounded to whole milliseconds (10 002 ms waited)", 10_002, CADENCE, 2501],
    ["60 s, the cap, at four minutes of waiting", 240_000, CADENCE, 60_000],
    ["60 s, the cap, after a day of waiting", 86_400_000, CADENCE, 60_000],
    ["a slower recoverer's cadence (5 s) while a quarter of the wait is shorter", 8000, 5000, 5000],
    ["a quarter of the wait beyond a slower recoverer's cadence", 40_000, 5000, 10_000],
    ["the cadence even below the owners' 100 ms floor (50 ms recoverer)", 0, 50, 50],
  ] as const)("for an UNKNOWN record: %s", (_name, sinceChangeMs, cadence, expected) => {
    // The ended lease plays no part: only recovery, not an owner, will move the record.
    expect(retryAfterMs(unfinished("UNKNOWN", sinceChangeMs, -1000), cadence)).toBe(expected);
    expect(retryAfterMs(unfinished("UNKNOWN", sinceChangeMs, null), cadence)).toBe(expected);
  });
});

describe("replayCacheableForMs", () => {
  const MAX_AGE = 30_000;
  it.each([
    ["the operator's max-age for a SUCCEEDED record kept for a day", record({ state: "SUCCEEDED" }), "ENFORCE", MAX_AGE, MAX_AGE],
    ["the max-age for FAILED_FINAL", record({ state: "FAILED_FINAL" }), "ENFORCE", MAX_AGE, MAX_AGE],
    ["the max-age for REJECTED (a finished 4xx replays as any finished record)", record({ state: "REJECTED" }), "ENFORCE", MAX_AGE, MAX_AGE],
    ["the rest of the retention when it ends first (12.5 s left)", record({ state: "SUCCEEDED", retainUntil: at(12_500) }), "ENFORCE", MAX_AGE, 12_500],
    ["whole milliseconds of the retention left (999.7 ms)", record({ state: "SUCCEEDED", retainUntil: at(999.7) }), "ENFORCE", MAX_AGE, 999],
    ["nothing when the retention ends at the read", record({ state: "SUCCEEDED", retainUntil: NOW }), "ENFORCE", MAX_AGE, undefined],
    ["nothing when the retention ended and the sweep has not come yet", record({ state: "SUCCEEDED", retainUntil: at(-1) }), "ENFORCE", MAX_AGE, undefined],
    ["nothing under 1 ms of retention left", record({ state: "SUCCEEDED", retainUntil: at(0.5) }), "ENFORCE", MAX_AGE, undefined],
    ["nothing for a tombstone", record({ state: "SUCCEEDED", tombstoned: true }), "ENFORCE", MAX_AGE, undefined],
    ["nothing in SHADOW mode", record({ state: "SUCCEEDED" }), "SHADOW", MAX_AGE, undefined],
    ["nothing in DRAINING mode", record({ state: "SUCCEEDED" }), "DRAINING", MAX_AGE, undefined],
    ["nothing with a max-age of 0", record({ state: "SUCCEEDED" }), "ENFORCE", 0, undefined],
    ["nothing for a finished record without retention (never written so)", record({ state: "SUCCEEDED", retainUntil: null }), "ENFORCE", MAX_AGE, undefined],
    ...(["RESERVED", "EXECUTING", "UNKNOWN"] as const).map(
      (state) => [`nothing for ${state}`, record({ state, retainUntil: at(86_400_000) }), "ENFORCE", MAX_AGE, undefined] as const,
    ),
  ] as const)("%s", (_name, stored, mode, maxAgeMs, expected) => {
    expect(replayCacheableForMs(stored, mode, maxAgeMs)).toBe(expected);
  });
});

describe("effectFlags", () => {
  const A = "card.charge";
  const B = "email.send";
  it.each([
    ["no attempt at all: nothing possible, nothing unresolved", [], false, false],
    ["one NO_EFFECT attempt: nothing possible", [attempt(A, 1, "NO_EFFECT")], false, false],
    ["every attempt of every effect NO_EFFECT: nothing possible", [attempt(A, 1, "NO_EFFECT"), attempt(A, 2, "NO_EFFECT"), attempt(B, 3, "NO_EFFECT")], false, false],
    ["one PENDING attempt: possible and unresolved", [attempt(A, 1, "PENDING")], true, true],
    ["one INDETERMINATE attempt: possible and unresolved", [attempt(A, 1, "INDETERMINATE")], true, true],
    ["one CONFIRMED attempt: possible, resolved", [attempt(A, 1, "CONFIRMED")], true, false],
    ["CONFIRMED then NO_EFFECT of one effect: still possible, since attempt 1 may have acted", [attempt(A, 1, "CONFIRMED"), attempt(A, 2, "NO_EFFECT")], true, false],
    ["PENDING then NO_EFFECT of one effect: still possible, settled by the latest attempt", [attempt(A, 1, "PENDING"), attempt(A, 2, "NO_EFFECT")], true, false],
    ["INDETERMINATE then NO_EFFECT of one effect: still possible, settled by the latest attempt", [attempt(A, 1, "INDETERMINATE"), attempt(A, 2, "NO_EFFECT")], true, false],
    ["INDETERMINATE then CONFIRMED of one effect: possible, settled", [attempt(A, 1, "INDETERMINATE"), attempt(A, 2, "CONFIRMED")], true, false],
    ["NO_EFFECT then PENDING of one effect: possible and unresolved", [attempt(A, 1, "NO_EFFECT"), attempt(A, 2, "PENDING")], true, true],
    ["CONFIRMED then INDETERMINATE of one effect: unresolved by its latest attempt", [attempt(A, 1, "CONFIRMED"), attempt(A, 2, "INDETERMINATE")], true, true],
    ["the latest attempt is found by number, whatever the order read", [attempt(A, 2, "NO_EFFECT"), attempt(A, 1, "PENDING")], true, false],
    ["an effect still PENDING keeps the operation unresolved though another is CONFIRMED", [attempt(A, 1, "CONFIRMED"), attempt(B, 2, "PENDING")], true, true],
    ["an earlier effect's PENDING latest attempt is not hidden by a later effect's NO_EFFECT", [attempt(A, 1, "PENDING"), attempt(B, 2, "NO_EFFECT")], true, true],
    ["each effect settled by its own latest attempt", [attempt(A, 1, "NO_EFFECT"), attempt(B, 2, "INDETERMINATE"), attempt(B, 3, "NO_EFFECT")], true, false],
  ] as const)("%s", (_name, attempts, possible, unresolved) => {
    expect(effectFlags(attempts)).toStrictEqual({ possible, unresolved });
  });
});

describe("planClaim", () => {
  type Row = [name: string, stored: StoredRecord, mode: ClaimMode, generation: number, expected: Decided<string>];
  const rows: Row[] = [
    ...MODES.flatMap((mode): Row[] => [
      [`refuses ${mode} naming an older generation`, record(), mode, GENERATION - 1, stale],
      [`refuses ${mode} naming a newer generation`, record(), mode, GENERATION + 1, stale],
      // The generation is checked first: a fenced-out caller learns it is stale, not what became of the record.
      [`refuses ${mode} naming an older generation of a finished record as stale`, record({ state: "SUCCEEDED" }), mode, GENERATION - 1, stale],
      ...TERMINAL_STATES.map((state): Row => [`refuses ${mode} of a ${state} record`, record({ state }), mode, GENERATION, transition(state)]),
    ]),

    ["OWNER: owns a RESERVED record", record({ state: "RESERVED" }), "OWNER", GENERATION, plan("own")],
    ["OWNER: owns a RESERVED record whose owner released it", record({ state: "RESERVED", lease: "none" }), "OWNER", GENERATION, plan("own")],
    ["OWNER: renews an EXECUTING record with a live lease", record({ state: "EXECUTING" }), "OWNER", GENERATION, plan("renew")],
    ["OWNER: renews an EXECUTING record whose lease ended while nobody took over", record({ lease: "ended", effectPossible: true }), "OWNER", GENERATION, plan("renew")],
    ["OWNER: refuses an UNKNOWN record", record({ state: "UNKNOWN", effectPossible: true }), "OWNER", GENERATION, transition("UNKNOWN")],
    ["OWNER: refuses a RESERVED record that went UNKNOWN before", record({ state: "RESERVED", lease: "none", wentUnknown: true }), "OWNER", GENERATION, transition("RESERVED")],
    ["OWNER: renews a recovering record's lease", record({ recovering: true }), "OWNER", GENERATION, plan("renew")],

    ["TAKEOVER: refuses an UNKNOWN record (it needs RECOVER)", record({ state: "UNKNOWN", effectPossible: true }), "TAKEOVER", GENERATION, transition("UNKNOWN")],
    ["TAKEOVER: refuses an UNKNOWN record even when its attempts all turned out NO_EFFECT", record({ state: "UNKNOWN" }), "TAKEOVER", GENERATION, transition("UNKNOWN")],
    ["TAKEOVER: refuses an EXECUTING record whose lease is live, saying until when", record({ state: "EXECUTING" }), "TAKEOVER", GENERATION, leaseHeld],
    ["TAKEOVER: refuses a RESERVED record whose lease is live", record({ state: "RESERVED" }), "TAKEOVER", GENERATION, leaseHeld],
    ["TAKEOVER: refuses a live lease before looking at effects", record({ effectPossible: true }), "TAKEOVER", GENERATION, leaseHeld],
    ["TAKEOVER: refuses an ended lease with a possible effect", record({ lease: "ended", effectPossible: true }), "TAKEOVER", GENERATION, transition("EXECUTING")],
    ["TAKEOVER: takes over an ended lease with nothing possible", record({ lease: "ended" }), "TAKEOVER", GENERATION, plan("takeover")],
    [
      "TAKEOVER: refuses a recovering record whose lease ended with nothing possible",
      record({ lease: "ended", recovering: true }),
      "TAKEOVER",
      GENERATION,
      transition("EXECUTING"),
    ],
    ["TAKEOVER: refuses a record that went UNKNOWN before, whose lease ended", record({ lease: "ended", wentUnknown: true }), "TAKEOVER", GENERATION, transition("EXECUTING")],
    ["TAKEOVER: takes over a lease ending at the instant of the read", record({ lease: "ends-now" }), "TAKEOVER", GENERATION, plan("takeover")],
    ["TAKEOVER: takes over a RESERVED record whose lease ended", record({ state: "RESERVED", lease: "ended" }), "TAKEOVER", GENERATION, plan("takeover")],
    ["TAKEOVER: takes over a released RESERVED record", record({ state: "RESERVED", lease: "none" }), "TAKEOVER", GENERATION, plan("takeover")],

    ["RECOVER: recovers an UNKNOWN record", record({ state: "UNKNOWN", effectPossible: true }), "RECOVER", GENERATION, plan("recover")],
    ["RECOVER: recovers an UNKNOWN record whose attempts all turned out NO_EFFECT", record({ state: "UNKNOWN" }), "RECOVER", GENERATION, plan("recover")],
    [
      "RECOVER: recovers an ended lease with a possible effect before the recoverer marked it",
      record({ lease: "ended", effectPossible: true }),
      "RECOVER",
      GENERATION,
      plan("recover"),
    ],
    ["RECOVER: refuses a live lease with a possible effect, saying until when", record({ effectPossible: true }), "RECOVER", GENERATION, leaseHeld],
    ["RECOVER: recovers a recovering record whose lease ended with nothing possible", record({ lease: "ended", recovering: true }), "RECOVER", GENERATION, plan("recover")],
    ["RECOVER: refuses an ended lease with nothing possible (it needs TAKEOVER)", record({ lease: "ended" }), "RECOVER", GENERATION, transition("EXECUTING")],
    ["RECOVER: refuses a released RESERVED record with nothing possible", record({ state: "RESERVED", lease: "none" }), "RECOVER", GENERATION, transition("RESERVED")],
  ];

  it.each(rows)("%s", (_name, stored, mode, generation, expected) => {
    expect(decide(() => planClaim(stored, mode, generation))).toStrictEqual(expected);
  });
});

describe("checkRenew", () => {
  it.each([
    ["refuses an older generation", record(), GENERATION - 1, stale],
    ...TERMINAL_STATES.map((state) => [`refuses a ${state} record`, record({ state }), GENERATION, transition(state)] as const),
    ["refuses an UNKNOWN record with LEASE_EXPIRED", record({ state: "UNKNOWN", effectPossible: true }), GENERATION, refused("LEASE_EXPIRED", { state: "UNKNOWN" })],
    ["renews a live lease", record(), GENERATION, ALLOWED],
    ["renews an ended lease that nobody took over", record({ lease: "ended" }), GENERATION, ALLOWED],
    ["renews an ended lease with a possible effect that the recoverer has not marked yet", record({ lease: "ended", effectPossible: true }), GENERATION, ALLOWED],
    ["renews a RESERVED record's lease", record({ state: "RESERVED" }), GENERATION, ALLOWED],
    [
      "refuses a released record (RESERVED, no lease): a lease would keep the next retry from taking it over",
      record({ state: "RESERVED", lease: "none" }),
      GENERATION,
      transition("RESERVED"),
    ],
  ] as const)("%s", (_name, stored, generation, expected) => {
    expect(decide(() => checkRenew(stored, generation))).toStrictEqual(expected);
  });
});

describe("checkRecordEffect", () => {
  const A = "card.charge";
  const B = "email.send";
  it.each([
    ["refuses an older generation", record(), [], GENERATION - 1, A, stale],
    ...TERMINAL_STATES.map((state) => [`refuses a ${state} record`, record({ state }), [], GENERATION, A, transition(state)] as const),
    ["refuses a RESERVED record that was never claimed", record({ state: "RESERVED" }), [], GENERATION, A, transition("RESERVED")],
    [
      "refuses an UNKNOWN record with LEASE_EXPIRED",
      record({ state: "UNKNOWN", effectPossible: true }),
      [attempt(A, 1, "PENDING")],
      GENERATION,
      A,
      refused("LEASE_EXPIRED", { state: "UNKNOWN" }),
    ],
    ["refuses an ended lease with LEASE_EXPIRED", record({ lease: "ended" }), [], GENERATION, A, refused("LEASE_EXPIRED", { state: "EXECUTING" })],
    ["refuses a lease ending at the instant of the read", record({ lease: "ends-now" }), [], GENERATION, A, refused("LEASE_EXPIRED", { state: "EXECUTING" })],
    ["refuses an EXECUTING record without a lease", record({ lease: "none" }), [], GENERATION, A, refused("LEASE_EXPIRED", { state: "EXECUTING" })],
    ["lets the owner register its first effect", record(), [], GENERATION, A, ALLOWED],
    ["lets the owner register another attempt of an effect", record({ effectPossible: true }), [attempt(A, 1, "INDETERMINATE")], GENERATION, A, ALLOWED],
    ["lets the owner register a new effect beside registered ones", record({ effectPossible: true }), [attempt(A, 1, "CONFIRMED")], GENERATION, B, ALLOWED],
    ["lets recovery replay a registered effect", record({ recovering: true, effectPossible: true }), [attempt(A, 1, "INDETERMINATE")], GENERATION, A, ALLOWED],
    ["lets recovery replay an effect whose attempts were all NO_EFFECT", record({ recovering: true }), [attempt(A, 1, "NO_EFFECT")], GENERATION, A, ALLOWED],
    ["refuses recovery a new effect", record({ recovering: true, effectPossible: true }), [attempt(A, 1, "INDETERMINATE")], GENERATION, B, refused("NEW_EFFECT_IN_RECOVERY")],
    ["refuses recovery any effect when none was registered", record({ recovering: true }), [], GENERATION, A, refused("NEW_EFFECT_IN_RECOVERY")],
    [
      "refuses a new kind of effect on a record that went UNKNOWN before, even outside a recovery claim",
      record({ wentUnknown: true }),
      [attempt(A, 1, "NO_EFFECT")],
      GENERATION,
      B,
      refused("NEW_EFFECT_IN_RECOVERY"),
    ],
    [
      "refuses recovery an ended lease before judging the effect",
      record({ recovering: true, lease: "ended", effectPossible: true }),
      [attempt(A, 1, "PENDING")],
      GENERATION,
      B,
      refused("LEASE_EXPIRED", { state: "EXECUTING" }),
    ],
  ] as const)("%s", (_name, stored, attempts, generation, effect, expected) => {
    expect(decide(() => checkRecordEffect(stored, attempts, generation, effect))).toStrictEqual(expected);
  });

  it("names the effects recovery may replay when it refuses a new one", () => {
    const attempts = [attempt("card.charge", 1, "INDETERMINATE"), attempt("card.charge", 2, "NO_EFFECT"), attempt("ledger.post", 3, "CONFIRMED")];
    const refusal = expectReason(() => checkRecordEffect(record({ recovering: true, effectPossible: true }), attempts, GENERATION, "email.send"), "NEW_EFFECT_IN_RECOVERY");
    expect(refusal.message).toContain("(card.charge, ledger.post)");
  });
});

describe("planResolve", () => {
  type Row = [name: string, stored: StoredRecord, found: StoredAttempt | undefined, generation: number, status: EffectStatus, handle: string, expected: Decided<string>];
  const pending = attempt("card.charge", 1, "PENDING");
  const indeterminate = attempt("card.charge", 1, "INDETERMINATE");
  const confirmed = attempt("card.charge", 1, "CONFIRMED", "ch_1");
  const noEffect = attempt("card.charge", 1, "NO_EFFECT");
  const already = (status: EffectStatus) => refused("ATTEMPT_ALREADY_RESOLVED", { status });
  const live = record({ effectPossible: true });
  const rows: Row[] = [
    ["refuses an older generation", live, pending, GENERATION - 1, "CONFIRMED", "", stale],
    ...TERMINAL_STATES.map((state): Row => [`refuses on a ${state} record`, record({ state }), pending, GENERATION, "CONFIRMED", "", transition(state)]),
    ["refuses an attempt number the operation does not have", live, undefined, GENERATION, "CONFIRMED", "", refused("ATTEMPT_NOT_FOUND")],
    ...(["CONFIRMED", "NO_EFFECT", "INDETERMINATE"] as const).flatMap((status): Row[] => [
      [`resolves PENDING as ${status}`, live, pending, GENERATION, status, "", plan("resolve")],
      [`resolves INDETERMINATE as ${status}`, live, indeterminate, GENERATION, status, "", plan("resolve")],
    ]),
    [
      "resolves on an UNKNOWN record: the owner that lost its lease still tells the truth",
      record({ state: "UNKNOWN", effectPossible: true }),
      pending,
      GENERATION,
      "CONFIRMED",
      "ch_1",
      plan("resolve"),
    ],
    ["resolves with an ended lease: resolving needs no lease", record({ lease: "ended", effectPossible: true }), pending, GENERATION, "NO_EFFECT", "", plan("resolve")],
    ["leaves CONFIRMED unchanged when told CONFIRMED again without a handle", live, confirmed, GENERATION, "CONFIRMED", "", plan("unchanged")],
    ["leaves CONFIRMED unchanged when told CONFIRMED again with the same handle", live, confirmed, GENERATION, "CONFIRMED", "ch_1", plan("unchanged")],
    ["refuses CONFIRMED with another handle", live, confirmed, GENERATION, "CONFIRMED", "ch_2", already("CONFIRMED")],
    ["refuses CONFIRMED turned NO_EFFECT", live, confirmed, GENERATION, "NO_EFFECT", "", already("CONFIRMED")],
    ["refuses CONFIRMED turned INDETERMINATE", live, confirmed, GENERATION, "INDETERMINATE", "", already("CONFIRMED")],
    ["leaves NO_EFFECT unchanged when told NO_EFFECT again", record(), noEffect, GENERATION, "NO_EFFECT", "", plan("unchanged")],
    ["refuses NO_EFFECT turned CONFIRMED", record(), noEffect, GENERATION, "CONFIRMED", "ch_1", already("NO_EFFECT")],
    ["refuses NO_EFFECT given a handle it never had", record(), noEffect, GENERATION, "NO_EFFECT", "h_1", already("NO_EFFECT")],
  ];

  it.each(rows)("%s", (_name, stored, found, generation, status, handle, expected) => {
    expect(decide(() => planResolve(stored, found, generation, status, handle))).toStrictEqual(expected);
  });
});

describe("planComplete", () => {
  type Row = [name: string, stored: StoredRecord, attempts: StoredAttempt[], generation: number, outcome: Outcome, digest: Uint8Array, expected: Decided<string>];
  const A = "card.charge";
  const otherDigest = new Uint8Array(32).fill(0x01);
  const rows: Row[] = [
    ...TERMINAL_STATES.flatMap((state): Row[] => [
      [`repeats an identical Complete of a ${state} record`, record({ state }), [], GENERATION, state, new Uint8Array(DIGEST), plan("repeat")],
      [`refuses a ${state} record another snapshot with ALREADY_COMPLETED`, record({ state }), [], GENERATION, state, otherDigest, refused("ALREADY_COMPLETED", { state })],
    ]),
    [
      "refuses a SUCCEEDED record the same snapshot as FAILED_FINAL",
      record({ state: "SUCCEEDED" }),
      [],
      GENERATION,
      "FAILED_FINAL",
      DIGEST,
      refused("ALREADY_COMPLETED", { state: "SUCCEEDED" }),
    ],
    [
      "refuses a FAILED_FINAL record the same snapshot as REJECTED",
      record({ state: "FAILED_FINAL" }),
      [],
      GENERATION,
      "REJECTED",
      DIGEST,
      refused("ALREADY_COMPLETED", { state: "FAILED_FINAL" }),
    ],
    // A reconciled record is one generation on: the late owner's identical Complete is fenced out, not repeated.
    ["refuses an identical Complete naming an older generation as stale", record({ state: "SUCCEEDED" }), [], GENERATION - 1, "SUCCEEDED", DIGEST, stale],
    ["refuses a different Complete naming an older generation as stale", record({ state: "SUCCEEDED" }), [], GENERATION - 1, "SUCCEEDED", otherDigest, stale],
    [
      "repeats an identical Complete of a tombstoned record (its digest is kept)",
      record({ state: "SUCCEEDED", tombstoned: true }),
      [],
      GENERATION,
      "SUCCEEDED",
      DIGEST,
      plan("repeat"),
    ],

    ["refuses an older generation of an unfinished record", record(), [], GENERATION - 1, "SUCCEEDED", DIGEST, stale],
    ["refuses SUCCEEDED of a RESERVED record", record({ state: "RESERVED" }), [], GENERATION, "SUCCEEDED", DIGEST, transition("RESERVED")],
    ["refuses FAILED_FINAL of a RESERVED record", record({ state: "RESERVED" }), [], GENERATION, "FAILED_FINAL", DIGEST, transition("RESERVED")],
    ["completes a RESERVED record as REJECTED", record({ state: "RESERVED" }), [], GENERATION, "REJECTED", DIGEST, plan("complete")],
    ["completes a released RESERVED record as REJECTED", record({ state: "RESERVED", lease: "none" }), [], GENERATION, "REJECTED", DIGEST, plan("complete")],
    ["completes EXECUTING as SUCCEEDED without effects", record(), [], GENERATION, "SUCCEEDED", DIGEST, plan("complete")],
    ["completes EXECUTING as FAILED_FINAL without effects", record(), [], GENERATION, "FAILED_FINAL", DIGEST, plan("complete")],
    ["completes EXECUTING as REJECTED without effects", record(), [], GENERATION, "REJECTED", DIGEST, plan("complete")],
    [
      "completes EXECUTING as REJECTED when every attempt was NO_EFFECT",
      record(),
      [attempt(A, 1, "NO_EFFECT"), attempt(A, 2, "NO_EFFECT")],
      GENERATION,
      "REJECTED",
      DIGEST,
      plan("complete"),
    ],
    ["completes SUCCEEDED with a CONFIRMED effect", record({ effectPossible: true }), [attempt(A, 1, "CONFIRMED")], GENERATION, "SUCCEEDED", DIGEST, plan("complete")],
    [
      "completes SUCCEEDED once a later attempt settled an INDETERMINATE one",
      record({ effectPossible: true }),
      [attempt(A, 1, "INDETERMINATE"), attempt(A, 2, "CONFIRMED")],
      GENERATION,
      "SUCCEEDED",
      DIGEST,
      plan("complete"),
    ],
    [
      "completes after the lease ended: completing needs no lease",
      record({ lease: "ended", effectPossible: true }),
      [attempt(A, 1, "CONFIRMED")],
      GENERATION,
      "SUCCEEDED",
      DIGEST,
      plan("complete"),
    ],
    [
      "completes an UNKNOWN record: its owner may still finish it",
      record({ state: "UNKNOWN", effectPossible: true }),
      [attempt(A, 1, "CONFIRMED")],
      GENERATION,
      "SUCCEEDED",
      DIGEST,
      plan("complete"),
    ],
    [
      "completes an UNKNOWN record as FAILED_FINAL",
      record({ state: "UNKNOWN", effectPossible: true }),
      [attempt(A, 1, "CONFIRMED")],
      GENERATION,
      "FAILED_FINAL",
      DIGEST,
      plan("complete"),
    ],
    ["completes a recovering record", record({ recovering: true, effectPossible: true }), [attempt(A, 1, "CONFIRMED")], GENERATION, "SUCCEEDED", DIGEST, plan("complete")],
    [
      "refuses while an effect's latest attempt is PENDING",
      record({ effectPossible: true }),
      [attempt(A, 1, "PENDING")],
      GENERATION,
      "SUCCEEDED",
      DIGEST,
      refused("UNRESOLVED_EFFECTS"),
    ],
    [
      "refuses while an effect's latest attempt is INDETERMINATE",
      record({ effectPossible: true }),
      [attempt(A, 1, "CONFIRMED"), attempt(A, 2, "INDETERMINATE")],
      GENERATION,
      "FAILED_FINAL",
      DIGEST,
      refused("UNRESOLVED_EFFECTS"),
    ],
    [
      "refuses while another effect is unresolved",
      record({ effectPossible: true }),
      [attempt(A, 1, "CONFIRMED"), attempt("email.send", 2, "PENDING")],
      GENERATION,
      "SUCCEEDED",
      DIGEST,
      refused("UNRESOLVED_EFFECTS"),
    ],
    [
      "refuses an UNKNOWN record while an effect is unresolved",
      record({ state: "UNKNOWN", effectPossible: true }),
      [attempt(A, 1, "INDETERMINATE")],
      GENERATION,
      "FAILED_FINAL",
      DIGEST,
      refused("UNRESOLVED_EFFECTS"),
    ],
    [
      "refuses REJECTED with UNRESOLVED_EFFECTS before EFFECT_POSSIBLE",
      record({ effectPossible: true }),
      [attempt(A, 1, "PENDING")],
      GENERATION,
      "REJECTED",
      DIGEST,
      refused("UNRESOLVED_EFFECTS"),
    ],
    ["refuses REJECTED after a CONFIRMED effect", record({ effectPossible: true }), [attempt(A, 1, "CONFIRMED")], GENERATION, "REJECTED", DIGEST, refused("EFFECT_POSSIBLE")],
    [
      "refuses REJECTED though a later attempt was NO_EFFECT",
      record({ effectPossible: true }),
      [attempt(A, 1, "INDETERMINATE"), attempt(A, 2, "NO_EFFECT")],
      GENERATION,
      "REJECTED",
      DIGEST,
      refused("EFFECT_POSSIBLE"),
    ],
    [
      "refuses REJECTED of an UNKNOWN record",
      record({ state: "UNKNOWN", effectPossible: true }),
      [attempt(A, 1, "CONFIRMED")],
      GENERATION,
      "REJECTED",
      DIGEST,
      refused("EFFECT_POSSIBLE"),
    ],
  ];

  it.each(rows)("%s", (_name, stored, attempts, generation, outcome, digest, expected) => {
    expect(decide(() => planComplete(stored, attempts, generation, outcome, digest))).toStrictEqual(expected);
  });
});

describe("planRelease", () => {
  it.each([
    ["refuses an older generation", record(), GENERATION - 1, stale],
    ...TERMINAL_STATES.map((state) => [`refuses a ${state} record`, record({ state }), GENERATION, transition(state)] as const),
    ["refuses with a possible effect and a live lease", record({ effectPossible: true }), GENERATION, refused("EFFECT_POSSIBLE")],
    ["refuses with a possible effect after the lease ended", record({ lease: "ended", effectPossible: true }), GENERATION, refused("EFFECT_POSSIBLE")],
    ["refuses an UNKNOWN record with a possible effect", record({ state: "UNKNOWN", effectPossible: true }), GENERATION, refused("EFFECT_POSSIBLE")],
    ["releases EXECUTING with a live lease and nothing possible", record(), GENERATION, plan("release")],
    ["releases EXECUTING whose lease ended with nothing possible", record({ lease: "ended" }), GENERATION, plan("release")],
    ["releases RESERVED with a live lease", record({ state: "RESERVED" }), GENERATION, plan("release")],
    ["releases RESERVED whose lease ended", record({ state: "RESERVED", lease: "ended" }), GENERATION, plan("release")],
    ["refuses an UNKNOWN record whose attempts all turned out NO_EFFECT: UNKNOWN is for good", record({ state: "UNKNOWN" }), GENERATION, transition("UNKNOWN")],
    ["refuses a recovering record whose attempts all turned out NO_EFFECT", record({ recovering: true }), GENERATION, transition("EXECUTING")],
    ["repeats on a RESERVED record already released", record({ state: "RESERVED", lease: "none" }), GENERATION, plan("repeat")],
  ] as const)("%s", (_name, stored, generation, expected) => {
    expect(decide(() => planRelease(stored, generation))).toStrictEqual(expected);
  });
});

describe("planAbandon", () => {
  it.each([
    ["refuses an older generation", record({ effectPossible: true }), GENERATION - 1, stale],
    ["refuses an older generation of an UNKNOWN record", record({ state: "UNKNOWN", effectPossible: true }), GENERATION - 1, stale],
    ...TERMINAL_STATES.map((state) => [`refuses a ${state} record`, record({ state }), GENERATION, transition(state)] as const),
    ["makes EXECUTING with a possible effect UNKNOWN at once", record({ effectPossible: true }), GENERATION, plan("unknown")],
    ["makes EXECUTING whose lease ended with a possible effect UNKNOWN", record({ lease: "ended", effectPossible: true }), GENERATION, plan("unknown")],
    ["makes a recovering record with a possible effect UNKNOWN again", record({ recovering: true, effectPossible: true }), GENERATION, plan("unknown")],
    ["makes a recovering record UNKNOWN again when its attempts all turned out NO_EFFECT", record({ recovering: true }), GENERATION, plan("unknown")],
    ["repeats on an UNKNOWN record", record({ state: "UNKNOWN", effectPossible: true }), GENERATION, plan("repeat")],
    ["repeats on an UNKNOWN record whose attempts all turned out NO_EFFECT", record({ state: "UNKNOWN" }), GENERATION, plan("repeat")],
    ["releases EXECUTING with nothing possible", record(), GENERATION, plan("release")],
    ["releases EXECUTING whose lease ended with nothing possible", record({ lease: "ended" }), GENERATION, plan("release")],
    ["releases RESERVED with a live lease", record({ state: "RESERVED" }), GENERATION, plan("release")],
    ["repeats on a RESERVED record already released", record({ state: "RESERVED", lease: "none" }), GENERATION, plan("repeat")],
  ] as const)("%s", (_name, stored, generation, expected) => {
    expect(decide(() => planAbandon(stored, generation))).toStrictEqual(expected);
  });
});

/**
 * The promises of docs/lifecycle.md over every combination of state, lease,
 * possible effect, recovery and tombstone, so that no row the tables above
 * leave out can break them.
 */
describe("over every combination of a record's state", () => {
  const LEASES: readonly Lease[] = ["live", "ended", "ends-now", "none"];
  const combinations: StoredRecord[] = STATES.flatMap((state) =>
    LEASES.flatMap((lease) =>
      [false, true].flatMap((effectPossible) =>
        [false, true].flatMap((recovering) => (isTerminal(state) ? [false, true] : [false]).map((tombstoned) => record({ state, lease, effectPossible, recovering, tombstoned }))),
      ),
    ),
  );
  const attemptsOf = (stored: StoredRecord) => (stored.effectPossible ? [attempt("card.charge", 1, "CONFIRMED")] : []);
  const describeRecord = (r: StoredRecord) =>
    `${r.state} lease=${r.leaseExpiresAt?.toISOString() ?? "none"} effectPossible=${r.effectPossible} recovering=${r.recovering} tombstoned=${r.tombstonedAt !== null}`;

  it("refuses every write naming another generation with STALE_GENERATION", () => {
    const writes: Array<(r: StoredRecord, generation: number) => unknown> = [
      ...MODES.map((mode) => (r: StoredRecord, g: number) => planClaim(r, mode, g)),
      (r, g) => checkRenew(r, g),
      (r, g) => checkRecordEffect(r, attemptsOf(r), g, "card.charge"),
      (r, g) => planResolve(r, attempt("card.charge", 1, "PENDING"), g, "CONFIRMED", ""),
      (r, g) => planComplete(r, attemptsOf(r), g, "SUCCEEDED", DIGEST),
      (r, g) => planRelease(r, g),
      (r, g) => planAbandon(r, g),
    ];
    let checked = 0;
    for (const stored of combinations) {
      for (const generation of [GENERATION - 1, GENERATION + 1]) {
        for (const write of writes) {
          expect(
            decide(() => write(stored, generation)),
            describeRecord(stored),
          ).toStrictEqual(stale);
          checked++;
        }
      }
    }
    expect(checked).toBe(combinations.length * 2 * writes.length);
  });

  it("never executes again, releases or rejects a record with a possible effect", () => {
    for (const stored of combinations.filter((r) => r.effectPossible)) {
      const name = describeRecord(stored);
      expect(reserveVerdict(stored, FINGERPRINT).kind, name).not.toBe("takeover");
      expect(
        decide(() => planClaim(stored, "TAKEOVER", GENERATION)),
        name,
      ).not.toStrictEqual(plan("takeover"));
      expect(
        decide(() => planRelease(stored, GENERATION)),
        name,
      ).not.toStrictEqual(plan("release"));
      expect(
        decide(() => planAbandon(stored, GENERATION)),
        name,
      ).not.toStrictEqual(plan("release"));
      const rejected = decide(() => planComplete(stored, attemptsOf(stored), GENERATION, "REJECTED", new Uint8Array(32).fill(0x01)));
      expect(rejected, name).not.toStrictEqual(plan("complete"));
    }
  });

  it("changes nothing of a finished record: every write but an identical Complete is refused", () => {
    for (const stored of combinations.filter((r) => isTerminal(r.state))) {
      const name = describeRecord(stored);
      const finished = transition(stored.state);
      for (const mode of MODES)
        expect(
          decide(() => planClaim(stored, mode, GENERATION)),
          name,
        ).toStrictEqual(finished);
      expect(
        decide(() => checkRenew(stored, GENERATION)),
        name,
      ).toStrictEqual(finished);
      expect(
        decide(() => checkRecordEffect(stored, [], GENERATION, "card.charge")),
        name,
      ).toStrictEqual(finished);
      expect(
        decide(() => planResolve(stored, attempt("card.charge", 1, "PENDING"), GENERATION, "CONFIRMED", "")),
        name,
      ).toStrictEqual(finished);
      expect(
        decide(() => planRelease(stored, GENERATION)),
        name,
      ).toStrictEqual(finished);
      expect(
        decide(() => planAbandon(stored, GENERATION)),
        name,
      ).toStrictEqual(finished);
      expect(
        decide(() => planComplete(stored, [], GENERATION, stored.state as Outcome, DIGEST)),
        name,
      ).toStrictEqual(plan("repeat"));
    }
  });

  it("answers a retry of a live lease IN_PROGRESS, never ACCEPTED", () => {
    const live = combinations.filter((r) => !isTerminal(r.state) && leaseLive(r));
    expect(live.length).toBeGreaterThan(0);
    for (const stored of live) expect(reserveVerdict(stored, FINGERPRINT), describeRecord(stored)).toStrictEqual({ kind: "in_progress" });
  });
});
