import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { EFFECT_STATUSES, RECORD_STATES, type Vocabulary } from "../contract/words.js";
import type { EffectAttempt as ProtoEffectAttempt, OperationRecord as ProtoOperationRecord, ResponseSnapshot as ProtoResponseSnapshot } from "../gen/idempotency/v1/types_pb.js";
import { CoordinatorError } from "./errors.js";
import type { EffectAttempt, OperationRecord, ResponseSnapshot } from "./types.js";

/**
 * The SDK's translation of the coordinator's answers into its public types
 * (types.ts): plain objects, dates and the contract's words, never a
 * protobuf message.
 */

export function dateField<K extends string>(key: K, ts: Timestamp | undefined): { [P in K]?: Date } {
  return (ts ? { [key]: timestampDate(ts) } : {}) as { [P in K]?: Date };
}

/**
 * The word of an enum field of the coordinator's answer. A number that is no
 * word of this SDK (a value of a newer contract, or UNSPECIFIED where the
 * contract always sets one) is never taken for another word: the call fails,
 * saying so.
 */
export function answered<Word extends string>(vocabulary: Vocabulary<Word, number>, value: number): Word {
  return vocabulary.word(value, unknownAnswer);
}

function unknownAnswer(described: string): never {
  throw new CoordinatorError(
    `the coordinator answered ${described}, a value this version of the gateway SDK does not know: upgrade idempotency-gateway`,
    Code.Internal,
    "INTERNAL",
  );
}

export function fromAttempt(a: ProtoEffectAttempt): EffectAttempt {
  return {
    attemptNumber: a.attemptNumber,
    effect: a.effect,
    provider: a.provider,
    downstreamKey: a.downstreamKey,
    status: answered(EFFECT_STATUSES, a.status),
    providerHandle: a.providerHandle,
    generation: Number(a.generation),
    ...dateField("createdAt", a.createdAt),
    ...dateField("resolvedAt", a.resolvedAt),
  };
}

export function fromSnapshot(s: ProtoResponseSnapshot): ResponseSnapshot {
  return {
    statusCode: s.statusCode,
    mediaType: s.mediaType,
    location: s.location,
    businessVersion: s.businessVersion,
    headers: s.headers.map((h): [string, string] => [h.name, h.value]),
    body: s.body,
    digest: s.digest,
  };
}

export function fromRecord(r: ProtoOperationRecord): OperationRecord {
  return {
    operationId: r.operationId,
    subject: { tenant: r.subject?.tenant ?? "", principal: r.subject?.principal ?? "" },
    operation: r.operation,
    apiRevision: r.apiRevision,
    schemaRevision: r.schemaRevision,
    state: answered(RECORD_STATES, r.state),
    generation: Number(r.generation),
    recovering: r.recovering,
    ...dateField("leaseExpiresAt", r.leaseExpiresAt),
    ...dateField("createdAt", r.createdAt),
    ...dateField("updatedAt", r.updatedAt),
    ...dateField("completedAt", r.completedAt),
    ...(r.snapshot ? { snapshot: fromSnapshot(r.snapshot) } : {}),
    effectAttempts: r.effectAttempts.map(fromAttempt),
    contractVersion: r.contractVersion,
  };
}
