import { randomUUID } from "node:crypto";
import { IdempotencyError, refuse, type Reason } from "../contract/errors.js";
import { failpoint } from "../failpoints.js";
import { downstreamKey, validateEffectName } from "../contract/effects.js";
import { FINGERPRINT_SCHEME, fingerprint } from "../contract/fingerprint.js";
import { validateKey } from "../contract/keys.js";
import {
  type ScopeInput,
  scopeDigest,
  validateApiRevision,
  validateOperationName,
  validateSubject,
  validateText,
} from "../contract/scope.js";
import { snapshotDigest, storedSnapshot, type Snapshot } from "../contract/snapshot.js";
import type { OperationPolicy, PolicySource } from "../policy/operations.js";
import { bindingFor, type Db, type Queryable } from "./db.js";
import { isUuid, uuidv7 } from "./ids.js";
import { openBody, sealBody, type SnapshotKeyring } from "../crypto/sealing.js";
import { ATTEMPT_COLUMNS, plusMs, readView, readViews, RECORD_COLUMNS, toAttempt, toRecord } from "./records.js";
import {
  checkRecordEffect,
  checkRenew,
  effectFlags,
  planAbandon,
  planClaim,
  planComplete,
  planRelease,
  planResolve,
  reserveVerdict,
  retryAfterMs,
} from "./state-machine.js";
import type {
  Actor,
  ClaimInput,
  ClaimResult,
  CompleteInput,
  EffectStatus,
  OperationRef,
  RecordView,
  RequestIdentity,
  ReserveInput,
  ReserveResult,
  StoredAttempt,
  RecoverableCursor,
  StoredRecord,
} from "./types.js";

/** How many times Reserve re-reads a record that changed under its compare-and-set before giving up. */
const RESERVE_ROUNDS = 5;

/**
 * The state machine of the contract over PostgreSQL. It holds no connection
 * of its own: every call takes a Db, which is either the coordinator's pool or
 * a transaction of an embedding business service (co-located mode).
 */
export class Registry {
  constructor(
    private readonly policies: PolicySource,
    /** Seals stored response bodies at rest; without one they are stored as they are. */
    private readonly keyring?: SnapshotKeyring,
    /**
     * How often recovery looks at UNKNOWN records (the recoverer's interval):
     * the Retry-After of a request that finds one.
     */
    private readonly recoveryCadenceMs = 1000,
  ) {}

  /** A record with its response body opened (plaintext), for answers that show it. */
  opened<T extends { record: StoredRecord }>(view: T): T;
  opened(record: StoredRecord): StoredRecord;
  opened(subject: StoredRecord | { record: StoredRecord }): StoredRecord | { record: StoredRecord } {
    if ("record" in subject) return { ...subject, record: this.opened(subject.record) };
    const { snapshot } = subject;
    if (!snapshot?.keyId || subject.tombstonedAt !== null) return subject;
    const body = openBody(snapshot.body, snapshot.keyId, this.keyring, subject.tenant, subject.operationId);
    return { ...subject, snapshot: { ...snapshot, body, keyId: null } };
  }

  /** The newest revision of an operation's policy, or UNKNOWN_OPERATION. */
  async policy(operation: string, apiRevision: number): Promise<OperationPolicy> {
    const policy = await this.policies.current(operation, apiRevision);
    if (!policy) {
      refuse(
        "UNKNOWN_OPERATION",
        `operation ${operation} at API revision ${apiRevision} has no published policy; publish one (idemctl policy apply)`,
      );
    }
    return policy;
  }

  /** The policy revision a record lives under (its fingerprint's), with the operation's current switches. */
  private async policyOf(record: StoredRecord): Promise<OperationPolicy> {
    const policy = await this.policies.revision(record.operation, record.apiRevision, record.schemaRevision);
    if (!policy) {
      throw new Error(`policy ${record.operation}@${record.apiRevision} revision ${record.schemaRevision} of a stored record is missing`);
    }
    return policy;
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
    const policy = await this.policy(input.operation, input.apiRevision);
    if (input.writerEpoch < policy.writerEpoch) {
      refuse(
        "STALE_WRITER_EPOCH",
        `writer epoch ${input.writerEpoch} is older than the operation's epoch ${policy.writerEpoch}: this deployment was rolled back; stop writing`,
        { writer_epoch: String(policy.writerEpoch) },
      );
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
    // recognizes its own record by these ids.
    const operationId = uuidv7();
    const acquisitionId = randomUUID();
    const state = input.claim ? "EXECUTING" : "RESERVED";
    const answer = (decision: ReserveResult["decision"], record?: StoredRecord, retryAfterMs?: number): ReserveResult => ({
      decision,
      ...(record ? { record: this.opened(record) } : {}),
      ...(retryAfterMs !== undefined ? { retryAfterMs } : {}),
      enforced,
      schemaRevision: record?.schemaRevision ?? policy.fingerprint.schemaRevision,
    });

    const result = await db.transaction(subject.tenant, async (q): Promise<ReserveResult> => {
      for (let round = 0; round < RESERVE_ROUNDS; round++) {
        let found: { record: StoredRecord; inserted: boolean } | undefined;
        if (policy.mode !== "DRAINING" && fp !== undefined && keyRefusal === undefined) {
          const admitted = await insertOrFind(q, {
            tenant: subject.tenant,
            scope,
            operationId,
            principal: subject.principal,
            operation: input.operation,
            apiRevision: input.apiRevision,
            schemaRevision: policy.fingerprint.schemaRevision,
            fingerprint: fp,
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
          if (keyRefusal ?? refusal) throw keyRefusal ?? refusal;
          refuse("OPERATION_DRAINING", `operation ${input.operation} is draining: it accepts no new requests`);
        }
        const { record, inserted } = found;
        if (inserted || record.acquisitionId === acquisitionId) return answer("ACCEPTED", record);

        if (record.tombstonedAt !== null && (await this.reusable(record))) {
          // The policy says old effects cannot reappear and the horizon passed:
          // the scope starts afresh, and one racing reservation wins it.
          if (keyRefusal ?? refusal) throw keyRefusal ?? refusal;
          const recycled = await recycleByScope(q, record, {
            operationId,
            schemaRevision: policy.fingerprint.schemaRevision,
            fingerprint: fp!,
            state,
            leaseMs,
            acquisitionId,
            writerEpoch: input.writerEpoch,
            caller: actor.caller,
          });
          if (recycled) {
            // The recycled scope is unfinished again: it counts against the quota like a new record.
            const active = await countActiveUnderGate(q, { ...subject, operation: input.operation, apiRevision: input.apiRevision, scope, acquisitionId, quota: policy.maxActivePerPrincipal });
            if (active > policy.maxActivePerPrincipal) refuseQuota(policy);
            return answer("ACCEPTED", recycled);
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
            return answer("IN_PROGRESS", record, retryAfterMs(record, this.recoveryCadenceMs));
          case "takeover": {
            const taken = await takeOverByScope(q, record, { state, leaseMs, acquisitionId, writerEpoch: input.writerEpoch, caller: actor.caller });
            if (taken) return answer("ACCEPTED", taken);
            break; // someone else moved the record first: re-read and decide again
          }
          case "mark_unknown": {
            const unknown = await markUnknownByScope(q, record, actor.caller);
            if (unknown) return answer("IN_PROGRESS", unknown, retryAfterMs(unknown, this.recoveryCadenceMs));
            break;
          }
        }
      }
      refuse("REGISTRY_BUSY", "the record kept changing while deciding; nothing was decided, retry with backoff");
    }, "reserve");
    if (result.decision === "ACCEPTED") await failpoint("registry.reserve.after-commit");
    return result;
  }

  /** Whether a tombstone's scope may be reused now: its policy allows it and the horizon passed. */
  private async reusable(record: StoredRecord): Promise<boolean> {
    const { allowed, horizonMs } = (await this.policyOf(record)).retention.tombstoneReuse;
    return allowed && record.tombstonedAt!.getTime() + horizonMs <= record.dbNow.getTime();
  }

  /**
   * The fingerprint of a request under the older revision its record was made
   * under, or undefined when the request is not valid under that revision (so
   * it cannot be the same request: a conflict).
   */
  private async fingerprintUnder(record: StoredRecord, request: RequestIdentity): Promise<Uint8Array | undefined> {
    const policy = await this.policyOf(record);
    try {
      return requestFingerprint(request, policy);
    } catch (error) {
      if (error instanceof IdempotencyError && error.reason === "INVALID_PAYLOAD") return undefined;
      throw error;
    }
  }

  /** Takes ownership for execution (OWNER, TAKEOVER or RECOVER). */
  async claim(db: Db, input: ClaimInput, actor: Actor): Promise<ClaimResult> {
    validateRef(input.ref);
    const acquisitionId = randomUUID();
    return db.transaction(input.ref.tenant, async (q) => {
      const { record, attempts } = await this.lockWithAttempts(q, input.ref, actor);
      // A re-run after a lost COMMIT: the claim already happened.
      if (record.acquisitionId === acquisitionId) return { record, attempts };
      const policy = await this.policyOf(record);
      if (input.mode !== "OWNER" && input.writerEpoch < policy.writerEpoch) {
        refuse("STALE_WRITER_EPOCH", `writer epoch ${input.writerEpoch} is older than the operation's epoch ${policy.writerEpoch}`, {
          writer_epoch: String(policy.writerEpoch),
        });
      }
      const leaseMs = grantLease(policy, input.leaseMs);
      const plan = planClaim(record, input.mode, input.generation);
      const event = { caller: actor.caller };
      let updated: StoredRecord;
      switch (plan) {
        case "own":
        case "renew":
          updated = await fencedUpdate(q, record, { ...event, kind: plan === "own" ? "CLAIMED" : "LEASE_RENEWED" },
            `state = 'EXECUTING', lease_expires_at = ${plusMs("$7")}`, [leaseMs]);
          break;
        case "takeover":
          updated = await fencedUpdate(q, record, { ...event, kind: "TAKEOVER" },
            `generation = generation + 1, state = 'EXECUTING', recovering = false, lease_expires_at = ${plusMs("$7")},
             acquisition_id = $8, writer_epoch = $9`, [leaseMs, acquisitionId, input.writerEpoch]);
          break;
        case "recover":
          if (record.state !== "UNKNOWN") {
            // Recorded as its own step so that the event log shows the record went UNKNOWN.
            await appendEvent(q, record, { ...event, kind: "UNKNOWN", state: "UNKNOWN" });
          }
          updated = await fencedUpdate(q, record, { ...event, kind: "RECOVERY_CLAIMED" },
            `generation = generation + 1, state = 'EXECUTING', recovering = true, lease_expires_at = ${plusMs("$7")},
             acquisition_id = $8, writer_epoch = $9`, [leaseMs, acquisitionId, input.writerEpoch]);
          break;
      }
      return { record: updated, attempts };
    }, "claim");
  }

  /** Extends the lease of the generation the caller holds. */
  async renewLease(db: Db, ref: OperationRef, generation: number, leaseMs: number | undefined, actor: Actor): Promise<StoredRecord> {
    validateRef(ref);
    return db.transaction(ref.tenant, async (q) => {
      const record = await this.lockRecord(q, ref, actor);
      checkRenew(record, generation);
      const policy = await this.policyOf(record);
      return fencedUpdate(q, record, { caller: actor.caller, kind: "LEASE_RENEWED" },
        `lease_expires_at = ${plusMs("$7")}`, [grantLease(policy, leaseMs)]);
    }, "renew_lease");
  }

  /** Registers an effect attempt before its downstream call; returns it with the stable downstream key. */
  async recordEffectAttempt(
    db: Db,
    ref: OperationRef,
    generation: number,
    effect: string,
    provider: string,
    actor: Actor,
  ): Promise<StoredAttempt> {
    validateRef(ref);
    validateEffectName(effect);
    if (provider.length > 0) validateText(provider, "provider", 128);
    return db.transaction(ref.tenant, async (q) => {
      const { record, attempts } = await this.lockWithAttempts(q, ref, actor);
      checkRecordEffect(record, attempts, generation, effect);
      const attemptNumber = (attempts.at(-1)?.attemptNumber ?? 0) + 1;
      const { rows } = await q.query(
        `INSERT INTO idem_effect_attempt (tenant_id, operation_id, attempt_number, effect, provider, downstream_key, status, generation)
         VALUES ($1, $2, $3, $4, $5, $6, 'PENDING', $7)
         RETURNING ${ATTEMPT_COLUMNS}`,
        [ref.tenant, ref.operationId, attemptNumber, effect, provider, downstreamKey(ref.tenant, ref.operationId, effect), generation],
      );
      await fencedUpdate(q, record, { caller: actor.caller, kind: "EFFECT_RECORDED", detail: { attempt: attemptNumber, effect } },
        "effect_possible = true", []);
      return toAttempt(rows[0]!);
    }, "record_effect_attempt");
  }

  /** Records what a downstream call did. */
  async resolveEffectAttempt(
    db: Db,
    ref: OperationRef,
    generation: number,
    attemptNumber: number,
    status: EffectStatus,
    providerHandle: string,
    actor: Actor,
  ): Promise<StoredAttempt> {
    validateRef(ref);
    if (status === "PENDING") refuse("INVALID_REQUEST", "status must be CONFIRMED, NO_EFFECT or INDETERMINATE");
    if (providerHandle.length > 0) validateText(providerHandle, "provider_handle", 512);
    return db.transaction(ref.tenant, async (q) => {
      const { record, attempts } = await this.lockWithAttempts(q, ref, actor);
      const attempt = attempts.find((a) => a.attemptNumber === attemptNumber);
      if (planResolve(record, attempt, generation, status, providerHandle) === "unchanged") return attempt!;
      const { rows } = await q.query(
        `UPDATE idem_effect_attempt
            SET status = $4, provider_handle = CASE WHEN $5 = '' THEN provider_handle ELSE $5 END, resolved_at = now()
          WHERE tenant_id = $1 AND operation_id = $2 AND attempt_number = $3
          RETURNING ${ATTEMPT_COLUMNS}`,
        [ref.tenant, ref.operationId, attemptNumber, status, providerHandle],
      );
      const resolved = toAttempt(rows[0]!);
      const after = attempts.map((a) => (a.attemptNumber === attemptNumber ? resolved : a));
      await fencedUpdate(q, record, { caller: actor.caller, kind: "EFFECT_RESOLVED", detail: { attempt: attemptNumber, status } },
        "effect_possible = $7", [effectFlags(after).possible]);
      return resolved;
    }, "resolve_effect_attempt");
  }

  /** Finishes the operation and stores the snapshot to replay; an identical repeat succeeds again. */
  async complete(db: Db, input: CompleteInput, actor: Actor): Promise<StoredRecord> {
    validateRef(input.ref);
    const completed = await db.transaction(input.ref.tenant, async (q) => {
      const { record, attempts } = await this.lockWithAttempts(q, input.ref, actor);
      const policy = await this.policyOf(record);
      const snapshot = storedSnapshot(input.snapshot, policy.snapshot);
      const digest = snapshotDigest(snapshot);
      if (planComplete(record, attempts, input.generation, input.outcome, digest) === "repeat") return this.opened(record);
      const finished = await fencedUpdate(q, record, { caller: actor.caller, kind: "COMPLETED", detail: { outcome: input.outcome } },
        REQUEST_PATH_SQL.finish, [input.outcome, policy.retention.keepMs, ...this.snapshotValues(record, snapshot, digest)]);
      await failpoint("registry.complete.before-commit");
      return this.opened(finished);
    }, "complete");
    await failpoint("registry.complete.after-commit");
    return completed;
  }

  /** Hands the reservation back without effect: RESERVED, no lease, fingerprint kept. */
  async release(db: Db, ref: OperationRef, generation: number, actor: Actor): Promise<StoredRecord> {
    validateRef(ref);
    return db.transaction(ref.tenant, async (q) => {
      const record = await this.lockRecord(q, ref, actor);
      if (planRelease(record, generation) === "repeat") return record;
      return fencedUpdate(q, record, { caller: actor.caller, kind: "RELEASED" },
        "state = 'RESERVED', recovering = false, lease_expires_at = NULL", []);
    }, "release");
  }

  /**
   * The owner stops now: released when nothing can have happened, otherwise
   * UNKNOWN at once with its lease ended, so that recovery starts without
   * waiting for the lease. Fenced by the generation like every write.
   */
  async abandon(db: Db, ref: OperationRef, generation: number, actor: Actor): Promise<StoredRecord> {
    validateRef(ref);
    return db.transaction(ref.tenant, async (q) => {
      const record = await this.lockRecord(q, ref, actor);
      const event = { caller: actor.caller, detail: { abandoned: true } };
      switch (planAbandon(record, generation)) {
        case "repeat":
          return record;
        case "release":
          return fencedUpdate(q, record, { ...event, kind: "RELEASED" }, "state = 'RESERVED', recovering = false, lease_expires_at = NULL", []);
        case "unknown":
          // The lease ends now: recovery lists records whose lease ended.
          return fencedUpdate(q, record, { ...event, kind: "UNKNOWN" }, "state = 'UNKNOWN', recovering = false, lease_expires_at = now()", []);
      }
    }, "abandon");
  }

  /**
   * An operator settles an UNKNOWN record with evidence from outside (the
   * provider's dashboard, a bank statement): it becomes SUCCEEDED or
   * FAILED_FINAL with the snapshot to replay, at the next generation so that a
   * late owner is fenced out. Refused from any other state.
   */
  async reconcile(
    db: Db,
    input: { ref: OperationRef; outcome: "SUCCEEDED" | "FAILED_FINAL"; snapshot: Snapshot; evidence: string; operatorName: string },
    actor: Actor,
  ): Promise<StoredRecord> {
    validateRef(input.ref);
    validateText(input.evidence, "evidence", 4096);
    validateText(input.operatorName, "operator", 256);
    return db.transaction(input.ref.tenant, async (q) => {
      const record = await this.lockRecord(q, input.ref, actor);
      if (record.state !== "UNKNOWN") {
        refuse("INVALID_TRANSITION", `only UNKNOWN records are reconciled; this one is ${record.state}${record.recovering ? " (a recovery worker holds it)" : ""}`, {
          state: record.state,
        });
      }
      const policy = await this.policyOf(record);
      const snapshot = storedSnapshot(input.snapshot, policy.snapshot);
      return fencedUpdate(
        q,
        record,
        { caller: actor.caller, kind: "RECONCILED", detail: { outcome: input.outcome, evidence: input.evidence, operator: input.operatorName } },
        `${REQUEST_PATH_SQL.finish}, generation = generation + 1`,
        [input.outcome, policy.retention.keepMs, ...this.snapshotValues(record, snapshot)],
      );
    }, "reconcile");
  }

  /**
   * Reads a record by id. Without the operator role, the subject must be the
   * record's: another principal's record is NOT_FOUND, exactly like a missing
   * one, so that lookups are no existence oracle.
   */
  async lookupById(db: Db, ref: OperationRef, principal: string | undefined, actor: Actor): Promise<RecordView> {
    validateRef(ref);
    requireTenant(actor, ref.tenant);
    const view = await db.transaction(ref.tenant, (q) => readView(q, "operation_id = $2", [ref.tenant, ref.operationId]), "lookup");
    return this.opened(visibleTo(view, principal, actor));
  }

  /** Reads the record a request with this scope would meet. */
  async lookupByScope(db: Db, input: ScopeInput, actor: Actor): Promise<RecordView> {
    const subject = validateSubject(input.subject);
    validateOperationName(input.operation);
    validateApiRevision(input.apiRevision);
    requireTenant(actor, subject.tenant);
    const view = await db.transaction(subject.tenant, (q) => readView(q, "scope = $2", [subject.tenant, Buffer.from(scopeDigest(input))]), "lookup");
    return this.opened(visibleTo(view, subject.principal, actor));
  }

  /**
   * Records a recovery worker should act on, by when their lease ended:
   * UNKNOWN ones, and unfinished ones whose lease ended (a released record
   * has no lease: its client's retry takes it over). `tenants` and
   * `operations` narrow the search (undefined: all); each record is also
   * checked against the actor's grants.
   */
  async listRecoverable(
    db: Db,
    filter: { tenants?: readonly string[]; operations?: readonly string[]; pageSize: number; after?: RecoverableCursor },
    actor: Actor,
  ): Promise<{ views: RecordView[]; next?: RecoverableCursor }> {
    if (!Number.isInteger(filter.pageSize) || filter.pageSize < 1 || filter.pageSize > 500) {
      refuse("INVALID_REQUEST", "page_size must be from 1 to 500");
    }
    const views = await db.transaction(bindingFor(filter.tenants), (q) =>
      readViews(
        q,
        `state IN ('RESERVED', 'EXECUTING', 'UNKNOWN') AND lease_expires_at <= now()
         AND ($1::text[] IS NULL OR tenant_id = ANY($1))
         AND ($2::text[] IS NULL OR operation = ANY($2))
         AND ($3::timestamptz IS NULL OR (lease_expires_at, tenant_id, operation_id) > ($3, $4, $5::uuid))
         ORDER BY lease_expires_at, tenant_id, operation_id LIMIT $6`,
        [filter.tenants ?? null, filter.operations ?? null, filter.after?.leaseEnd ?? null, filter.after?.tenant ?? null, filter.after?.operationId ?? null, filter.pageSize],
      ),
      "list_recoverable",
    );
    const last = views.at(-1);
    return {
      views: views.filter((v) => actor.mayUseTenant(v.record.tenant) && actor.mayOperate(v.record.operation)),
      ...(last && views.length === filter.pageSize ? { next: { leaseEnd: last.leaseEndText, tenant: last.record.tenant, operationId: last.record.operationId } } : {}),
    };
  }

  /** A stored snapshot's column values, in the order REQUEST_PATH_SQL.finish binds them; the body sealed when a key ring is configured. */
  private snapshotValues(record: StoredRecord, snapshot: Snapshot, digest = snapshotDigest(snapshot)): unknown[] {
    const sealed = this.keyring ? sealBody(snapshot.body, this.keyring, record.tenant, record.operationId) : undefined;
    return [
      snapshot.statusCode,
      snapshot.mediaType,
      snapshot.location,
      snapshot.businessVersion,
      JSON.stringify(snapshot.headers),
      sealed?.sealed ?? Buffer.from(snapshot.body),
      Buffer.from(digest),
      sealed?.keyId ?? null,
    ];
  }

  /** Locks the record for the rest of the transaction, or NOT_FOUND. */
  private async lockRecord(q: Queryable, ref: OperationRef, actor: Actor): Promise<StoredRecord> {
    requireTenant(actor, ref.tenant);
    // FOR UPDATE serializes every write to one record; lock_timeout bounds the
    // wait so a stuck writer turns into REGISTRY_BUSY instead of a pile-up.
    const { rows } = await q.query(
      REQUEST_PATH_SQL.lockRecord,
      [ref.tenant, ref.operationId],
    );
    const record = rows[0] ? toRecord(rows[0]) : undefined;
    if (!record || !actor.mayOperate(record.operation)) refuseNotFound();
    return record;
  }

  /**
   * Locks the record and reads its effect attempts in one round trip: the read
   * is pipelined behind the lock, and PostgreSQL runs it once the lock is held,
   * so it sees the attempts as they stand under the lock.
   */
  private async lockWithAttempts(q: Queryable, ref: OperationRef, actor: Actor): Promise<{ record: StoredRecord; attempts: StoredAttempt[] }> {
    requireTenant(actor, ref.tenant);
    const [record, attempts] = await Promise.all([this.lockRecord(q, ref, actor), loadAttempts(q, ref)]);
    return { record, attempts };
  }
}

/**
 * The statements of the request path, by name: the benchmark's pgbench
 * baseline (bench/sql.ts) runs exactly these.
 */
export const REQUEST_PATH_SQL = {
  /** A Reserve's guarded insert of its scope, or the record already there (insertOrFind). */
  insertOrFind: `WITH inserted AS (
       INSERT INTO idem_record (tenant_id, scope, operation_id, principal, operation, api_revision, schema_revision,
                                fingerprint, state, generation, lease_expires_at, acquisition_id, writer_epoch)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, ${plusMs("$10")}, $11, $12)
       ON CONFLICT (tenant_id, scope) DO NOTHING
       RETURNING ${RECORD_COLUMNS}
     ), logged AS (
       INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller)
       SELECT tenant_id, operation_id, operation, api_revision, 'ACCEPTED', generation, state, $13 FROM inserted
     )
     SELECT true AS inserted, ${RECORD_COLUMNS}, now() AS db_now FROM inserted
     UNION ALL
     SELECT false, ${RECORD_COLUMNS}, now() FROM idem_record WHERE tenant_id = $1 AND scope = $2`,
  /**
   * Locks the principal's quota gate for the rest of the transaction, only
   * when this transaction made the scope's record ($5, $6: scope and
   * acquisition id), creating the gate on first use. ON CONFLICT DO UPDATE
   * locks the existing row even though WHERE false changes nothing, and it
   * locks the latest version, also one committed after this statement began.
   */
  holdQuotaGate: `INSERT INTO idem_quota_gate (tenant_id, principal, operation, api_revision)
     SELECT $1, $2, $3, $4 FROM idem_record WHERE tenant_id = $1 AND scope = $5 AND acquisition_id = $6
     ON CONFLICT (tenant_id, principal, operation, api_revision) DO UPDATE SET principal = EXCLUDED.principal WHERE false`,
  /**
   * The principal's unfinished records, counted up to $5 (quota + 1), by a
   * statement that starts once the gate is held, so that its snapshot shows
   * every record that passed the gate before; 0 unless this transaction made
   * the scope's record ($6, $7), so that a replay never counts.
   */
  countActive: `SELECT count(*)::int AS active FROM (
       SELECT 1 FROM idem_record
        WHERE tenant_id = $1 AND principal = $2 AND operation = $3 AND api_revision = $4
          AND state IN ('RESERVED', 'EXECUTING', 'UNKNOWN')
        LIMIT $5) capped
     WHERE EXISTS (SELECT 1 FROM idem_record WHERE tenant_id = $1 AND scope = $6 AND acquisition_id = $7)`,
  /** Locks one record for the rest of the transaction (Registry.lockRecord). */
  lockRecord: `SELECT ${RECORD_COLUMNS}, now() AS db_now FROM idem_record
        WHERE tenant_id = $1 AND operation_id = $2 FOR UPDATE`,
  /** A record's effect attempts, read after its lock is held (loadAttempts). */
  loadAttempts: `SELECT ${ATTEMPT_COLUMNS} FROM idem_effect_attempt
      WHERE tenant_id = $1 AND operation_id = $2 ORDER BY attempt_number`,
  /** An update fenced by generation, with its event (fencedUpdate); `set` may use $7 onwards. */
  fencedUpdate: (set: string) => `WITH updated AS (
       UPDATE idem_record SET ${set}, updated_at = now()
        WHERE tenant_id = $1 AND operation_id = $2 AND generation = $3
        RETURNING ${RECORD_COLUMNS}
     ), logged AS (
       INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail)
       SELECT tenant_id, operation_id, operation, api_revision, $4, generation, state, $5, $6 FROM updated
     )
     SELECT ${RECORD_COLUMNS}, now() AS db_now FROM updated`,
  /** The terminal state: $7 the outcome, $8 the retention in ms, $9 to $16 the snapshot (Registry.snapshotValues). */
  finish: `state = $7, recovering = false, lease_expires_at = NULL, completed_at = now(),
  retain_until = ${plusMs("$8")}, snapshot_status = $9, snapshot_media_type = $10, snapshot_location = $11,
  snapshot_business_version = $12, snapshot_headers = $13, snapshot_body = $14, snapshot_digest = $15, snapshot_key_id = $16`,
} as const;

function refuseNotFound(): never {
  refuse("NOT_FOUND", "no such operation for this subject");
}

function requireTenant(actor: Actor, tenant: string): void {
  if (!actor.mayUseTenant(tenant)) refuse("PERMISSION_DENIED", `this caller is not granted tenant ${tenant}`);
}

function visibleTo(view: RecordView | undefined, principal: string | undefined, actor: Actor): RecordView {
  if (!view || !actor.mayOperate(view.record.operation)) refuseNotFound();
  if (!actor.isOperator && view.record.principal !== principal) refuseNotFound();
  return view;
}

function validateRef(ref: OperationRef): void {
  validateText(ref.tenant, "ref.tenant", 128);
  if (!isUuid(ref.operationId)) refuse("INVALID_REQUEST", "ref.operation_id must be the operation id Reserve returned");
}

/** The lease to grant: the policy's default when none is asked, never above its maximum, never under a second. */
function grantLease(policy: OperationPolicy, requestedMs: number | undefined): number {
  if (requestedMs === undefined || requestedMs <= 0) return policy.lease.defaultMs;
  return Math.min(Math.max(requestedMs, 1000), policy.lease.maxMs);
}

/** Refusals of a request under the newest revision that a record of an older revision may overrule (keys: see reserve). */
const REJUDGED: ReadonlySet<Reason> = new Set(["INVALID_PAYLOAD", "SCHEMA_REVISION_MISMATCH"]);

/** The fingerprint of a Reserve under a revision: computed from the request parts, or checked as precomputed. */
function requestFingerprint(request: RequestIdentity, policy: OperationPolicy): Uint8Array {
  const rules = policy.fingerprint;
  if (request.kind === "parts") return fingerprint(request.parts, rules);
  const { scheme, schemaRevision, digest } = request;
  if (scheme !== FINGERPRINT_SCHEME) {
    refuse("UNSUPPORTED_FINGERPRINT_SCHEME", `fingerprint.scheme must be ${FINGERPRINT_SCHEME}`);
  }
  if (schemaRevision !== rules.schemaRevision) {
    refuse(
      "SCHEMA_REVISION_MISMATCH",
      `fingerprint computed under schema revision ${schemaRevision}; compute it under revision ${rules.schemaRevision}`,
      { schema_revision: String(rules.schemaRevision) },
    );
  }
  if (digest.byteLength !== 32) refuse("INVALID_REQUEST", "fingerprint.digest must be the 32-byte SHA-256 digest");
  return digest;
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
 * The guarded insert: `INSERT … ON CONFLICT DO NOTHING` decides "new or not"
 * and takes the place in one step (a concurrent insert of the same scope waits
 * for ours and then conflicts). A new record is then counted against its
 * principal's quota behind the principal's gate (countActiveUnderGate), in the
 * same round trip: the statements are pipelined and PostgreSQL runs them in
 * order. Returns the new record with the principal's unfinished records
 * counting it, the existing one, or nothing (existing but committed after
 * this statement's snapshot).
 */
async function insertOrFind(q: Queryable, r: NewRecord): Promise<{ record: StoredRecord; inserted: boolean; active: number } | undefined> {
  const [{ rows }, active] = await Promise.all([
    q.query(
      REQUEST_PATH_SQL.insertOrFind,
      [r.tenant, Buffer.from(r.scope), r.operationId, r.principal, r.operation, r.apiRevision, r.schemaRevision,
       Buffer.from(r.fingerprint), r.state, r.leaseMs, r.acquisitionId, r.writerEpoch, r.caller],
    ),
    countActiveUnderGate(q, r),
  ]);
  const row = rows[0];
  return row ? { record: toRecord(row), inserted: row.inserted === true, active } : undefined;
}

/**
 * How many unfinished records the principal has, this transaction's new one
 * included, counted while holding the principal's quota gate (0 when this
 * transaction made no record of `scope`). Every transaction that adds an
 * unfinished record takes the gate after adding it and holds it until it ends,
 * so each one counts every record admitted before it: of any number of racing
 * reservations, on any number of coordinators, no more than the quota commit.
 * Only new records of one principal and operation wait for each other;
 * replays and other principals never touch the gate.
 */
async function countActiveUnderGate(
  q: Queryable,
  r: { tenant: string; principal: string; operation: string; apiRevision: number; scope: Uint8Array; acquisitionId: string; quota: number },
): Promise<number> {
  const who = [r.tenant, r.principal, r.operation, r.apiRevision];
  const [, { rows }] = await Promise.all([
    q.query(REQUEST_PATH_SQL.holdQuotaGate, [...who, Buffer.from(r.scope), r.acquisitionId]),
    q.query<{ active: number }>(REQUEST_PATH_SQL.countActive, [...who, r.quota + 1, Buffer.from(r.scope), r.acquisitionId]),
  ]);
  return rows[0]?.active ?? 0;
}

function refuseQuota(policy: OperationPolicy): never {
  refuse(
    "QUOTA_EXCEEDED",
    `this principal already has ${policy.maxActivePerPrincipal} unfinished ${policy.operation} operations; finish some first`,
    { limit: String(policy.maxActivePerPrincipal) },
  );
}

async function findByScope(q: Queryable, tenant: string, scope: Uint8Array): Promise<{ record: StoredRecord; inserted: false } | undefined> {
  const { rows } = await q.query(
    `SELECT ${RECORD_COLUMNS}, now() AS db_now FROM idem_record WHERE tenant_id = $1 AND scope = $2`,
    [tenant, Buffer.from(scope)],
  );
  return rows[0] ? { record: toRecord(rows[0]), inserted: false } : undefined;
}

/**
 * Takeover as one compare-and-set: only from the generation and state that
 * were read, only with the lease ended and no possible effect. READ COMMITTED
 * re-checks these conditions on the latest row version after waiting for a
 * concurrent writer, so of any number of racing takeovers exactly one matches.
 */
async function takeOverByScope(
  q: Queryable,
  seen: StoredRecord,
  t: { state: "RESERVED" | "EXECUTING"; leaseMs: number; acquisitionId: string; writerEpoch: number; caller: string },
): Promise<StoredRecord | undefined> {
  const { rows } = await q.query(
    `WITH taken AS (
       UPDATE idem_record
          SET generation = generation + 1, state = $4, recovering = false, lease_expires_at = ${plusMs("$5")},
              acquisition_id = $6, writer_epoch = $7, updated_at = now()
        WHERE tenant_id = $1 AND scope = $2 AND generation = $3
          AND state IN ('RESERVED', 'EXECUTING') AND NOT effect_possible
          AND (lease_expires_at IS NULL OR lease_expires_at <= now())
        RETURNING ${RECORD_COLUMNS}
     ), logged AS (
       INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller)
       SELECT tenant_id, operation_id, operation, api_revision, 'TAKEOVER', generation, state, $8 FROM taken
     )
     SELECT ${RECORD_COLUMNS}, now() AS db_now FROM taken`,
    [seen.tenant, Buffer.from(seen.scope), seen.generation, t.state, t.leaseMs, t.acquisitionId, t.writerEpoch, t.caller],
  );
  return rows[0] ? toRecord(rows[0]) : undefined;
}

/**
 * A reusable tombstone becomes a new operation in place (new operation id,
 * fingerprint and revision; the generation still grows), fenced like a
 * takeover on the generation that was read: of racing reservations, one wins.
 */
async function recycleByScope(
  q: Queryable,
  seen: StoredRecord,
  r: { operationId: string; schemaRevision: number; fingerprint: Uint8Array; state: "RESERVED" | "EXECUTING"; leaseMs: number; acquisitionId: string; writerEpoch: number; caller: string },
): Promise<StoredRecord | undefined> {
  const { rows } = await q.query(
    `WITH recycled AS (
       UPDATE idem_record
          SET operation_id = $4, schema_revision = $5, fingerprint = $6, state = $7, generation = generation + 1,
              recovering = false, lease_expires_at = ${plusMs("$8")}, acquisition_id = $9, writer_epoch = $10,
              effect_possible = false, snapshot_status = NULL, snapshot_media_type = NULL, snapshot_location = NULL,
              snapshot_business_version = NULL, snapshot_headers = NULL, snapshot_body = NULL, snapshot_digest = NULL, snapshot_key_id = NULL,
              created_at = now(), updated_at = now(), completed_at = NULL, retain_until = NULL, tombstoned_at = NULL
        WHERE tenant_id = $1 AND scope = $2 AND generation = $3 AND tombstoned_at IS NOT NULL
        RETURNING ${RECORD_COLUMNS}
     ), logged AS (
       INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail)
       SELECT tenant_id, operation_id, operation, api_revision, 'RECYCLED', generation, state, $11, json_build_object('previous_operation_id', $12::text) FROM recycled
     )
     SELECT ${RECORD_COLUMNS}, now() AS db_now FROM recycled`,
    [seen.tenant, Buffer.from(seen.scope), seen.generation, r.operationId, r.schemaRevision, Buffer.from(r.fingerprint), r.state, r.leaseMs,
     r.acquisitionId, r.writerEpoch, r.caller, seen.operationId],
  );
  return rows[0] ? toRecord(rows[0]) : undefined;
}

/** EXECUTING with an ended lease and a possible effect becomes UNKNOWN (same generation: the owner may still complete). */
async function markUnknownByScope(q: Queryable, seen: StoredRecord, caller: string): Promise<StoredRecord | undefined> {
  const { rows } = await q.query(
    `WITH marked AS (
       UPDATE idem_record SET state = 'UNKNOWN', recovering = false, updated_at = now()
        WHERE tenant_id = $1 AND scope = $2 AND generation = $3 AND state = 'EXECUTING'
          AND effect_possible AND lease_expires_at <= now()
        RETURNING ${RECORD_COLUMNS}
     ), logged AS (
       INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller)
       SELECT tenant_id, operation_id, operation, api_revision, 'UNKNOWN', generation, state, $4 FROM marked
     )
     SELECT ${RECORD_COLUMNS}, now() AS db_now FROM marked`,
    [seen.tenant, Buffer.from(seen.scope), seen.generation, caller],
  );
  return rows[0] ? toRecord(rows[0]) : undefined;
}

interface EventFacts {
  kind: string;
  caller: string;
  detail?: Record<string, unknown>;
}

/**
 * Updates a record locked by this transaction, fenced once more by its
 * generation in the WHERE clause, and logs the event in the same statement.
 * `set` may use $7 onwards for `values`. Exactly one row must change.
 */
async function fencedUpdate(q: Queryable, record: StoredRecord, event: EventFacts, set: string, values: unknown[]): Promise<StoredRecord> {
  const { rows } = await q.query(
    REQUEST_PATH_SQL.fencedUpdate(set),
    [record.tenant, record.operationId, record.generation, event.kind, event.caller, JSON.stringify(event.detail ?? {}), ...values],
  );
  if (rows.length !== 1) {
    throw new Error(`fenced update of ${record.operationId} at generation ${record.generation} changed ${rows.length} rows`);
  }
  return toRecord(rows[0]!);
}

async function appendEvent(q: Queryable, record: StoredRecord, event: EventFacts & { state: string }): Promise<void> {
  await q.query(
    `INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
    [record.tenant, record.operationId, record.operation, record.apiRevision, event.kind, record.generation, event.state, event.caller, JSON.stringify(event.detail ?? {})],
  );
}

/**
 * The attempts of a record, read by a statement of their own after the
 * record's lock is held: under READ COMMITTED a new statement sees every
 * attempt committed by the writer the lock waited for, which a subquery of
 * the locking statement (with its older snapshot) could miss.
 */
async function loadAttempts(q: Queryable, ref: OperationRef): Promise<StoredAttempt[]> {
  const { rows } = await q.query(
    REQUEST_PATH_SQL.loadAttempts,
    [ref.tenant, ref.operationId],
  );
  return rows.map(toAttempt);
}

