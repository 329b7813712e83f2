import { randomUUID } from "node:crypto";
import { refuse } from "../../contract/errors.js";
import { downstreamKey, validateEffectName } from "../../contract/effects.js";
import { validateText } from "../../contract/scope.js";
import type { Db, Queryable } from "../db.js";
import { toAttempt } from "../rows.js";
import { changeLocked, lockedChange, lockWithAttempts, validateRef } from "../shared.js";
import { pipelined } from "../statement.js";
import * as attemptStatements from "../statements/attempts.js";
import * as recordStatements from "../statements/records.js";
import { checkRecordEffect, effectFlags, planResolve } from "../state-machine.js";
import type { Actor, RecordEffectInput, ReserveInput, ResolveEffectInput, StoredAttempt, StoredRecord } from "../types.js";

/**
 * Effect attempts: registered before a downstream call (RecordEffectAttempt,
 * or declared with Reserve), resolved with what the call did
 * (ResolveEffectAttempt).
 */

/** Most effects one Reserve declares (proto: ReserveRequest.effects). */
const MAX_DECLARED_EFFECTS = 16;

/** Registers an effect attempt before its downstream call; returns it with the stable downstream key. */
export async function recordEffectAttempt(db: Db, { ref, generation, effect, provider }: RecordEffectInput, actor: Actor): Promise<StoredAttempt> {
  validateRef(ref);
  validateEffectName(effect);
  if (provider.length > 0) validateText(provider, "provider", 128);
  // Minted once, outside the retried work: a re-run after a lost COMMIT finds its own attempt.
  const registrationId = randomUUID();
  return db.transaction(
    ref.tenant,
    async (q) => {
      const { record, attempts } = await lockWithAttempts(q, ref, actor);
      const registered = attempts.find((a) => a.registrationId === registrationId);
      if (registered) return registered;
      checkRecordEffect(record, attempts, generation, effect);
      const attemptNumber = (attempts.at(-1)?.attemptNumber ?? 0) + 1;
      const { rows } = await attemptStatements.insertAttempt.run(q, {
        ...ref,
        attemptNumber,
        effect,
        provider,
        downstreamKey: downstreamKey(ref.tenant, ref.operationId, effect),
        generation,
        registrationId,
      });
      await changeLocked(q, recordStatements.markEffectPossible, record, { caller: actor.caller, detail: { attempt: attemptNumber, effect } }, {});
      return toAttempt(rows[0]!);
    },
    "record_effect_attempt",
  );
}

/** Records what a downstream call did. */
export async function resolveEffectAttempt(db: Db, { ref, generation, attemptNumber, status, providerHandle }: ResolveEffectInput, actor: Actor): Promise<StoredAttempt> {
  validateRef(ref);
  if (status === "PENDING") refuse("INVALID_REQUEST", "status must be CONFIRMED, NO_EFFECT or INDETERMINATE");
  if (providerHandle.length > 0) validateText(providerHandle, "provider_handle", 512);
  return db.transaction(
    ref.tenant,
    async (q) => {
      const { record, attempts } = await lockWithAttempts(q, ref, actor);
      const attempt = attempts.find((a) => a.attemptNumber === attemptNumber);
      if (planResolve(record, attempt, generation, status, providerHandle) === "unchanged") return attempt!;
      const { rows } = await attemptStatements.resolveAttempt.run(q, { ...ref, attemptNumber, status, providerHandle });
      const resolved = toAttempt(rows[0]!);
      const after = attempts.map((a) => (a.attemptNumber === attemptNumber ? resolved : a));
      await changeLocked(
        q,
        recordStatements.setEffectPossible,
        record,
        { caller: actor.caller, detail: { attempt: attemptNumber, status } },
        {
          effectPossible: effectFlags(after).possible,
        },
      );
      return resolved;
    },
    "resolve_effect_attempt",
  );
}

/** An effect declared with Reserve, with the registration id of its attempt (minted once, outside retried work). */
export interface DeclaredEffect {
  effect: string;
  provider: string;
  registrationId: string;
}

/** Reserve's declared effects, checked: with `claim`, at most MAX_DECLARED_EFFECTS, each name valid and once. */
export function declaredEffects(input: ReserveInput): DeclaredEffect[] {
  const effects = input.effects ?? [];
  if (effects.length === 0) return [];
  if (!input.claim) refuse("INVALID_REQUEST", "effects are declared with claim: true (attempts are registered on an executing record)");
  if (effects.length > MAX_DECLARED_EFFECTS) refuse("INVALID_REQUEST", `a Reserve declares at most ${MAX_DECLARED_EFFECTS} effects, this one ${effects.length}`);
  const seen = new Set<string>();
  return effects.map(({ effect, provider }) => {
    validateEffectName(effect);
    if (provider.length > 0) validateText(provider, "provider", 128);
    if (seen.has(effect)) refuse("INVALID_REQUEST", `effect ${effect} is declared twice`);
    seen.add(effect);
    return { effect, provider, registrationId: randomUUID() };
  });
}

/**
 * Reserve's declared effects on the record it just accepted, in its
 * transaction: one PENDING attempt each, as RecordEffectAttempt registers
 * one (the same downstream key, an EFFECT_RECORDED event each). A re-run
 * after a lost COMMIT finds its attempts by their registration ids.
 */
export async function registerDeclared(
  q: Queryable,
  record: StoredRecord,
  declared: readonly DeclaredEffect[],
  actor: Actor,
): Promise<{ record: StoredRecord; attempts: StoredAttempt[] }> {
  if (declared.length === 0) return { record, attempts: [] };
  const ref = { tenant: record.tenant, operationId: record.operationId };
  const existing = (await attemptStatements.loadAttempts.run(q, ref)).rows.map(toAttempt);
  const mine = declared.map((d) => existing.find((a) => a.registrationId === d.registrationId));
  if (mine.every((a) => a !== undefined)) return { record, attempts: mine };
  for (const { effect } of declared) checkRecordEffect(record, existing, record.generation, effect);
  const first = (existing.at(-1)?.attemptNumber ?? 0) + 1;
  // All pipelined: the attempts, then the record's flag with an EFFECT_RECORDED event for each.
  const inserts = declared.map(({ effect, provider, registrationId }, i) =>
    attemptStatements.insertAttempt.run(q, {
      ...ref,
      attemptNumber: first + i,
      effect,
      provider,
      downstreamKey: downstreamKey(ref.tenant, ref.operationId, effect),
      generation: record.generation,
      registrationId,
    }),
  );
  const marks = declared.map(({ effect }, i) => lockedChange(recordStatements.markEffectPossible, record, { caller: actor.caller, detail: { attempt: first + i, effect } }, {}));
  const marked = marks.map((mark) => mark.send(q));
  await pipelined([...inserts, ...marked]);
  const attempts = (await Promise.all(inserts)).map(({ rows }) => toAttempt(rows[0]!));
  return { record: marks.at(-1)!.changed(await marked.at(-1)!), attempts };
}
