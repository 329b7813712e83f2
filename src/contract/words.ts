/**
 * The contract's words: the decisions, record states, outcomes, effect
 * statuses and claim modes of `idempotency.v1`, as the registry, the gateway
 * SDK and co-located mode name them, and the one translation between them
 * and the numbers of the proto enums on the wire.
 *
 * A word is the name of an enum value without the enum's prefix
 * (`RECORD_STATE_UNKNOWN` is `UNKNOWN`); UNSPECIFIED is no word. The types are
 * derived from the generated enums and the translation is read from their
 * descriptors, so that a value added to the proto is a word everywhere at
 * the next `npm run generate`, and a word the proto drops fails to compile.
 */
import type { GenEnum } from "@bufbuild/protobuf/codegenv2";
import { ClaimModeSchema, DecisionSchema, type ClaimMode as ProtoClaimMode, type Decision as ProtoDecision } from "../gen/idempotency/v1/coordinator_pb.js";
import {
  EffectStatusSchema,
  OutcomeSchema,
  RecordStateSchema,
  type EffectStatus as ProtoEffectStatus,
  type Outcome as ProtoOutcome,
  type RecordState as ProtoRecordState,
} from "../gen/idempotency/v1/types_pb.js";

/** The words of a generated enum: its members' names, without UNSPECIFIED. */
export type WordsOf<Enum extends Record<string, string | number>> = Exclude<Extract<keyof Enum, string>, "UNSPECIFIED">;

/** What Reserve decided: ACCEPTED, REPLAY, IN_PROGRESS, PAYLOAD_CONFLICT or EXPIRED. */
export type Decision = WordsOf<typeof ProtoDecision>;
/** Where a record is: RESERVED, EXECUTING, SUCCEEDED, FAILED_FINAL, REJECTED or UNKNOWN. */
export type RecordState = WordsOf<typeof ProtoRecordState>;
/** How an operation finished: SUCCEEDED, FAILED_FINAL or REJECTED. */
export type Outcome = WordsOf<typeof ProtoOutcome>;
/** What a downstream call did: PENDING, CONFIRMED, NO_EFFECT or INDETERMINATE. */
export type EffectStatus = WordsOf<typeof ProtoEffectStatus>;
/** How a Claim takes ownership: OWNER, TAKEOVER or RECOVER. */
export type ClaimMode = WordsOf<typeof ProtoClaimMode>;

/**
 * One enum of the contract: its words, and each word's number on the wire. A number that is no word (UNSPECIFIED, or a value of a newer
 * contract than this build's) has no translation: `word` hands it to the
 * caller's `unknown`, which says what it means where it was met (a refused
 * request on the server, a coordinator newer than the SDK in a client).
 */
export interface Vocabulary<Word extends string, Proto extends number> {
  /** The enum's full name, e.g. `idempotency.v1.RecordState`. */
  readonly typeName: string;
  /** Every word, in the order of their numbers. */
  readonly words: readonly Word[];
  /** The number on the wire of a word. */
  readonly number: (word: Word) => Proto;
  /**
   * The word of a number on the wire. A number that is no word goes to
   * `unknown`, which throws, given the number as a message says it:
   * `idempotency.v1.RecordState 9`, or `RECORD_STATE_UNSPECIFIED`.
   */
  readonly word: (value: number, unknown: (described: string) => never) => Word;
  /** Whether a string is one of the words (a word as a person or a JSON document writes it). */
  readonly has: (text: string) => text is Word;
}

/** The vocabulary of a generated enum, from its descriptor. */
export function vocabulary<Word extends string, Proto extends number>(schema: GenEnum<Proto>): Vocabulary<Word, Proto> {
  const known = schema.values.filter((value) => value.number !== 0);
  const byNumber = new Map(known.map((value) => [value.number, value.localName as Word]));
  const byWord = new Map(known.map((value) => [value.localName, value]));
  const words = known.map((value) => value.localName as Word);
  return {
    typeName: schema.typeName,
    words,
    number: (word) => byWord.get(word)!.number as Proto,
    word: (value, unknown) => {
      const word = byNumber.get(value);
      if (word !== undefined) return word;
      return unknown(schema.values.find((described) => described.number === value)?.name ?? `${schema.typeName} ${value}`);
    },
    has: (text): text is Word => byWord.has(text),
  };
}

export const DECISIONS = vocabulary<Decision, ProtoDecision>(DecisionSchema);
export const RECORD_STATES = vocabulary<RecordState, ProtoRecordState>(RecordStateSchema);
export const OUTCOMES = vocabulary<Outcome, ProtoOutcome>(OutcomeSchema);
export const EFFECT_STATUSES = vocabulary<EffectStatus, ProtoEffectStatus>(EffectStatusSchema);
export const CLAIM_MODES = vocabulary<ClaimMode, ProtoClaimMode>(ClaimModeSchema);

/** Words as a message offers them: `A, B or C`. */
export function choice(words: readonly string[]): string {
  return words.length < 2 ? words.join("") : `${words.slice(0, -1).join(", ")} or ${words.at(-1)}`;
}
