import type pg from "pg";
import { refuse } from "../../contract/errors.js";
import { validateText } from "../../contract/scope.js";
import { snapshotDigest, storedSnapshot, type Snapshot } from "../../contract/snapshot.js";
import { laneOf, opened, policyOf, snapshotColumns, type RegistryContext } from "../context.js";
import type { Db, Send } from "../db.js";
import { keepingResult } from "../statement.js";
import { toAttempt, toRecord } from "../rows.js";
import { lockedChange, lockWithAttempts, refuseNotFound, requireTenant, validateRef } from "../shared.js";
import * as attemptStatements from "../statements/attempts.js";
import type { AttemptRow, RecordRow } from "../statements/parts.js";
import * as recordStatements from "../statements/records.js";
import { planComplete, planResolutions, type CompletePlan } from "../state-machine.js";
import type { Actor, CompleteInput, EffectResolution, StoredAttempt, StoredRecord } from "../types.js";

/**
 * Complete: the terminal state and the response to replay, with the
 * resolutions of the last attempts sent along.
 */

/** Most attempts one Complete resolves (proto: CompleteRequest.resolutions). */
const MAX_RESOLUTIONS = 64;

/** A Complete waiting for a batch. */
export interface CompleteItem {
  db: Db;
  input: CompleteInput;
  actor: Actor;
  alone: () => Promise<StoredRecord>;
}

/** Finishes the operation and stores the snapshot to replay; an identical repeat succeeds again. */
export async function complete(context: RegistryContext, db: Db, input: CompleteInput, actor: Actor): Promise<StoredRecord> {
  validateRef(input.ref);
  requireTenant(actor, input.ref.tenant);
  const resolutions = input.resolutions ?? [];
  validateResolutions(resolutions);
  // A Complete with resolutions is decided alone, on its read: it writes more than a batch's finish or finishReady.
  // finishReady goes out with COMMIT, so only in a transaction of its own, never in a caller's (co-located mode),
  // whose business rows that COMMIT would commit whatever the rules decided.
  const unread = db.coalescible === true && resolutions.length === 0;
  const alone = async () => (unread ? await completeAtOnce(context, db, input, actor) : undefined) ?? completeAfterReading(context, db, input, actor);
  const completed = context.completes && unread ? await context.completes.submit(laneOf(db, input.ref.tenant, actor.caller), { db, input, actor, alone }) : await alone();
  await context.hooks.reached("registry.complete.after-commit");
  return completed;
}

/**
 * Complete in two round trips: the record locked and read with its
 * attempts, decided by the rules, then the resolutions sent along and the
 * terminal state written with COMMIT.
 */
function completeAfterReading(context: RegistryContext, db: Db, input: CompleteInput, actor: Actor): Promise<StoredRecord> {
  const resolutions = input.resolutions ?? [];
  return db.transaction(
    input.ref.tenant,
    async (q, commitWith) => {
      const locked = await lockWithAttempts(q, input.ref, actor);
      // The resolutions as ResolveEffectAttempt would make them, then the finish judged on what they leave.
      const resolving = planResolutions(locked.record, locked.attempts, input.generation, resolutions);
      const last = resolving.changes.at(-1);
      const record = last ? { ...locked.record, effectPossible: last.effectPossible } : locked.record;
      const columns = await finishColumns(context, record, resolving.attempts, input);
      if (!columns) return opened(context, locked.record);
      await context.hooks.reached("registry.complete.before-commit");
      // The resolutions and the terminal state go out with COMMIT: two round trips in all.
      const made = resolutionSends(locked.record, resolving.changes, actor.caller);
      const finish = lockedChange(recordStatements.finish, record, { caller: actor.caller, detail: { outcome: input.outcome } }, columns);
      const finishing = keepingResult(finish.send);
      const written = await commitWith([...made, finishing.send]);
      for (const result of written.slice(0, -1)) {
        if (result.rows.length !== 1) throw new Error(`a resolution of ${record.operationId} changed ${result.rows.length} rows`);
      }
      return opened(context, finish.changed(await finishing.result()));
    },
    "complete",
  );
}

/**
 * Complete in one round trip, for a record whose policy revision this
 * process knows (it handed the record to its owner: identities.ts) and a
 * Complete that resolves no attempt: what it stores is computed first, then
 * the locking read, the attempts and finishReady go out with COMMIT. When
 * finishReady matched, the record is finished; the rules, judged on the read,
 * must agree. When it did not, the read decides: a refusal or an identical
 * repeat is answered from it, and a Complete the rules would let through
 * (one finishReady is too narrow for) is left to the two-round-trip path.
 * Undefined: not decided here.
 */
async function completeAtOnce(context: RegistryContext, db: Db, input: CompleteInput, actor: Actor): Promise<StoredRecord | undefined> {
  const { ref } = input;
  const identity = context.identities.find(ref.tenant, ref.operationId);
  // A fault test stopping between the decision and the COMMIT needs the path that has a place between them.
  if (!identity || context.hooks.isArmed?.("registry.complete.before-commit") !== false) return undefined;
  // Checked before anything is sent: finishReady matches the record of this operation only.
  if (!actor.mayOperate(identity.operation)) return undefined;
  const policy = await context.policies.revision(identity.operation, identity.apiRevision, identity.schemaRevision);
  if (!policy) return undefined;
  let snapshot: Snapshot;
  try {
    snapshot = storedSnapshot(input.snapshot, policy.snapshot);
  } catch {
    // Refused: the two-round-trip path refuses it, after the checks that come first there.
    return undefined;
  }
  const digest = snapshotDigest(snapshot);
  const columns = { outcome: input.outcome, keepMs: policy.retention.keepMs, ...snapshotColumns(context, ref, snapshot, digest) };
  const event = { caller: actor.caller, eventDetail: JSON.stringify({ outcome: input.outcome }) };
  return db.transaction(
    ref.tenant,
    async (_q, commitWith) => {
      const [locked, attempts, finished] = (await commitWith([
        (q) => recordStatements.lockRecord.run(q, ref),
        (q) => attemptStatements.loadAttempts.run(q, ref),
        (q) => recordStatements.finishReady.run(q, { ...ref, ...event, ...columns, ...identity, generation: input.generation }),
      ])) as [pg.QueryResult<RecordRow>, pg.QueryResult<AttemptRow>, pg.QueryResult<RecordRow>];
      const decided = finished.rows.length === 1;
      const read = locked.rows[0] ? toRecord(locked.rows[0]) : undefined;
      if (!read) refuseNotFound();
      if (!decided && (read.operation !== identity.operation || read.apiRevision !== identity.apiRevision || read.schemaRevision !== identity.schemaRevision)) {
        return undefined;
      }
      let plan: CompletePlan;
      try {
        plan = planComplete(read, attempts.rows.map(toAttempt), input.generation, input.outcome, digest);
      } catch (refusal) {
        if (decided) throw new Error(`finishReady finished ${ref.operationId}, which the rules refuse`, { cause: refusal });
        throw refusal;
      }
      if (decided) {
        if (plan !== "complete") throw new Error(`finishReady finished ${ref.operationId}, which the rules call a ${plan}`);
        return opened(context, toRecord(finished.rows[0]!));
      }
      return plan === "repeat" ? opened(context, read) : undefined;
    },
    "complete",
  );
}

/**
 * What Complete stores for a record read under its lock: its terminal
 * state and snapshot columns, or undefined for an identical repeat (already
 * done); refuses as the rules say.
 */
export async function finishColumns(
  context: RegistryContext,
  record: StoredRecord,
  attempts: readonly StoredAttempt[],
  input: CompleteInput,
): Promise<recordStatements.SnapshotColumns | undefined> {
  const policy = await policyOf(context, record);
  const snapshot = storedSnapshot(input.snapshot, policy.snapshot);
  const digest = snapshotDigest(snapshot);
  if (planComplete(record, attempts, input.generation, input.outcome, digest) === "repeat") return undefined;
  return { outcome: input.outcome, keepMs: policy.retention.keepMs, ...snapshotColumns(context, record, snapshot, digest) };
}

/** Complete's resolutions are well formed: CONFIRMED or NO_EFFECT, each attempt once, at most MAX_RESOLUTIONS. */
function validateResolutions(resolutions: readonly EffectResolution[]): void {
  if (resolutions.length > MAX_RESOLUTIONS) refuse("INVALID_REQUEST", `a Complete resolves at most ${MAX_RESOLUTIONS} attempts, this one ${resolutions.length}`);
  const seen = new Set<number>();
  for (const { attemptNumber, status, providerHandle } of resolutions) {
    if (status !== "CONFIRMED" && status !== "NO_EFFECT") {
      refuse("INVALID_REQUEST", "a resolution sent with Complete is CONFIRMED or NO_EFFECT: resolve an INDETERMINATE attempt with ResolveEffectAttempt");
    }
    if (seen.has(attemptNumber)) refuse("INVALID_REQUEST", `attempt ${attemptNumber} is resolved twice in one Complete`);
    seen.add(attemptNumber);
    if (providerHandle.length > 0) validateText(providerHandle, "provider_handle", 512);
  }
}

/**
 * The statements of Complete's resolutions (planResolutions' changes), for a
 * record this transaction has locked: each attempt's new status, and the
 * record's effect flag with its EFFECT_RESOLVED event, as
 * ResolveEffectAttempt writes them.
 */
function resolutionSends(record: StoredRecord, changes: ReadonlyArray<EffectResolution & { effectPossible: boolean }>, caller: string): Send[] {
  return changes.flatMap(({ attemptNumber, status, providerHandle, effectPossible }): Send[] => [
    (q) => attemptStatements.resolveAttempt.run(q, { tenant: record.tenant, operationId: record.operationId, attemptNumber, status, providerHandle }),
    lockedChange(recordStatements.setEffectPossible, record, { caller, detail: { attempt: attemptNumber, status } }, { effectPossible }).send,
  ]);
}
