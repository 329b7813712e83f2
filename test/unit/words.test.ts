import { create } from "@bufbuild/protobuf";
import { Code, createRouterTransport } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { IdempotencyError } from "../../src/contract/errors.js";
import { CLAIM_MODES, choice, DECISIONS, EFFECT_STATUSES, OUTCOMES, RECORD_STATES, type Vocabulary } from "../../src/contract/words.js";
import { CoordinatorError } from "../../src/gateway/errors.js";
import { CoordinatorClient } from "../../src/gateway/index.js";
import {
  ClaimMode,
  ClaimModeSchema,
  CoordinatorService,
  Decision,
  DecisionSchema,
  ListRecoverableResponseSchema,
  LookupResponseSchema,
  ReleaseResponseSchema,
  ReserveResponseSchema,
} from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { EffectStatus, EffectStatusSchema, Outcome, OutcomeSchema, RecordState, RecordStateSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { OperationMode, OperationModeSchema } from "../../src/gen/idempotency/v1/admin_pb.js";
import { FieldType, FingerprintMode } from "../../src/gen/idempotency/v1/policy_pb.js";
import { parsePolicyDocument } from "../../src/policy/document.js";
import { OPERATION_MODES } from "../../src/policy/operations.js";
import { policyFromProto, policyToProto } from "../../src/server/policy-convert.js";
import { fromProtoClaimMode, fromProtoEffectStatus, fromProtoOutcome, fromProtoState, toProtoDecision, toProtoEffectStatus, toProtoState } from "../../src/server/convert.js";

/**
 * The contract's words (src/contract/words.ts) against the proto enums they
 * translate: every value both ways, and a number that is no word refused
 * wherever it is met (a request on the server, an answer in the SDK).
 */

const ENUMS = [
  { vocabulary: DECISIONS, generated: Decision, schema: DecisionSchema },
  { vocabulary: RECORD_STATES, generated: RecordState, schema: RecordStateSchema },
  { vocabulary: OUTCOMES, generated: Outcome, schema: OutcomeSchema },
  { vocabulary: EFFECT_STATUSES, generated: EffectStatus, schema: EffectStatusSchema },
  { vocabulary: CLAIM_MODES, generated: ClaimMode, schema: ClaimModeSchema },
  { vocabulary: OPERATION_MODES, generated: OperationMode, schema: OperationModeSchema },
] as Array<{ vocabulary: Vocabulary<string, number>; generated: Record<string, string | number>; schema: typeof DecisionSchema }>;

/** A number past every value of every enum: what a newer contract could send. */
const NEWER = 99;

const refusedWith = (described: string): never => {
  throw new Error(described);
};

describe.each(ENUMS.map((e) => [e.vocabulary.typeName, e] as const))("the words of %s", (_name, { vocabulary, generated, schema }) => {
  it("are the generated enum's names without UNSPECIFIED, in the order of their numbers", () => {
    const names = Object.keys(generated)
      .filter((key) => Number.isNaN(Number(key)) && key !== "UNSPECIFIED")
      .sort((a, b) => (generated[a] as number) - (generated[b] as number));
    expect(names.length).toBeGreaterThan(1);
    expect(vocabulary.words).toEqual(names);
  });

  it("translate every value of the enum both ways", () => {
    const values = schema.values.filter((value) => value.number !== 0);
    expect(values.map((value) => value.localName)).toEqual(vocabulary.words);
    for (const value of values) {
      const word = vocabulary.word(value.number, refusedWith);
      expect(word).toBe(value.localName);
      expect(vocabulary.number(word)).toBe(value.number);
      expect(vocabulary.number(word)).toBe(generated[word]);
      expect(vocabulary.has(word)).toBe(true);
    }
  });

  it("hand UNSPECIFIED and a number this build does not know to the caller's refusal, never to another word", () => {
    const unspecified = schema.values.find((value) => value.number === 0)!;
    expect(unspecified.localName).toBe("UNSPECIFIED");
    expect(() => vocabulary.word(0, refusedWith)).toThrow(new Error(unspecified.name));
    expect(() => vocabulary.word(NEWER, refusedWith)).toThrow(new Error(`${vocabulary.typeName} ${NEWER}`));
    expect(vocabulary.has("UNSPECIFIED")).toBe(false);
  });
});

describe("choice", () => {
  it("offers words as a message lists them", () => {
    expect(choice(OUTCOMES.words)).toBe("SUCCEEDED, FAILED_FINAL or REJECTED");
    expect(choice(["ONE"])).toBe("ONE");
  });
});

describe("the server's translation of requests", () => {
  /** The refusal `read` throws, as reason and message. */
  function refusal(read: () => unknown): { reason: string; message: string } | undefined {
    try {
      read();
      return undefined;
    } catch (error) {
      expect(error).toBeInstanceOf(IdempotencyError);
      return { reason: (error as IdempotencyError).reason, message: (error as IdempotencyError).message };
    }
  }

  it("reads every word of a request's enum fields", () => {
    expect(OUTCOMES.words.map((word) => fromProtoOutcome(OUTCOMES.number(word)))).toEqual(OUTCOMES.words);
    expect(CLAIM_MODES.words.map((word) => fromProtoClaimMode(CLAIM_MODES.number(word)))).toEqual(CLAIM_MODES.words);
    expect(RECORD_STATES.words.map((word) => fromProtoState(toProtoState(word)))).toEqual(RECORD_STATES.words);
    expect(fromProtoEffectStatus(toProtoEffectStatus("NO_EFFECT"))).toBe("NO_EFFECT");
    expect(toProtoDecision("PAYLOAD_CONFLICT")).toBe(Decision.PAYLOAD_CONFLICT);
  });

  it.each([
    ["an outcome", () => fromProtoOutcome(NEWER), "outcome must be SUCCEEDED, FAILED_FINAL or REJECTED"],
    ["a claim mode", () => fromProtoClaimMode(NEWER), "mode must be OWNER, TAKEOVER or RECOVER"],
    ["a record state", () => fromProtoState(NEWER), "states must be record states such as RECORD_STATE_UNKNOWN"],
    ["an effect status", () => fromProtoEffectStatus(NEWER), "status must be CONFIRMED, NO_EFFECT or INDETERMINATE"],
    ["an effect status of PENDING, where a resolution is asked", () => fromProtoEffectStatus(EffectStatus.PENDING), "status must be CONFIRMED, NO_EFFECT or INDETERMINATE"],
    ["an unset outcome", () => fromProtoOutcome(Outcome.UNSPECIFIED), "outcome must be SUCCEEDED, FAILED_FINAL or REJECTED"],
  ])("refuses %s it does not take with INVALID_REQUEST", (_name, read, message) => {
    expect(refusal(read)).toEqual({ reason: "INVALID_REQUEST", message });
  });
});

describe("the SDK's translation of answers", () => {
  /** A client of a coordinator that answers with these messages. */
  function clientAnswering(answers: { reserve?: object; release?: object; lookup?: object; listRecoverable?: object }): CoordinatorClient {
    const transport = createRouterTransport(({ service }) => {
      service(CoordinatorService, {
        reserve: () => create(ReserveResponseSchema, answers.reserve ?? {}),
        release: () => create(ReleaseResponseSchema, answers.release ?? {}),
        lookup: () => create(LookupResponseSchema, answers.lookup ?? {}),
        listRecoverable: () => create(ListRecoverableResponseSchema, answers.listRecoverable ?? {}),
      });
    });
    return new CoordinatorClient({ transport, batching: false, retry: { attempts: 1 } });
  }
  const ref = { tenant: "acme", operationId: "01a229d0-0f4c-7516-846e-0457ee592196" };
  const reserveInput = {
    subject: { tenant: "acme", principal: "alice" },
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: "k".repeat(24),
    parts: { method: "POST", path: "/v1/payments", query: "", mediaType: "application/json", headers: [], body: new Uint8Array() },
  };

  const record = (init: object) => ({ operationId: ref.operationId, subject: { tenant: "acme", principal: "alice" }, state: RecordState.UNKNOWN, ...init });
  const attempt = (status: number) => ({ attemptNumber: 1, effect: "card.charge", provider: "cards", status });

  it("reads the words of an answer", async () => {
    const reserved = await clientAnswering({ reserve: { decision: Decision.IN_PROGRESS, state: RecordState.EXECUTING } }).reserve(reserveInput);
    expect(reserved).toMatchObject({ decision: "IN_PROGRESS", state: "EXECUTING" });
    expect(await clientAnswering({ release: { state: RecordState.RESERVED, generation: 2n } }).release({ ref, generation: 1 })).toEqual({ state: "RESERVED", generation: 2 });
    const listed = await clientAnswering({
      listRecoverable: { records: [{ record: record({ effectAttempts: [attempt(EffectStatus.INDETERMINATE)] }), claimMode: ClaimMode.RECOVER }] },
    }).listRecoverable();
    expect(listed.records).toMatchObject([{ claimMode: "RECOVER", record: { state: "UNKNOWN", effectAttempts: [{ status: "INDETERMINATE" }] } }]);
  });

  it.each([
    ["a decision", { reserve: { decision: NEWER } }, "reserve", `idempotency.v1.Decision ${NEWER}`],
    ["an unset decision", { reserve: {} }, "reserve", "DECISION_UNSPECIFIED"],
    ["a record state", { release: { state: NEWER } }, "release", `idempotency.v1.RecordState ${NEWER}`],
    ["a record's state", { lookup: { record: record({ state: NEWER }) } }, "lookup", `idempotency.v1.RecordState ${NEWER}`],
    ["an attempt's status", { lookup: { record: record({ effectAttempts: [attempt(NEWER)] }) } }, "lookup", `idempotency.v1.EffectStatus ${NEWER}`],
    ["an unset attempt status", { lookup: { record: record({ effectAttempts: [attempt(0)] }) } }, "lookup", "EFFECT_STATUS_UNSPECIFIED"],
    ["a claim mode", { listRecoverable: { records: [{ record: record({}), claimMode: NEWER }] } }, "listRecoverable", `idempotency.v1.ClaimMode ${NEWER}`],
  ] as const)("refuses %s it does not know, saying so, instead of taking it for another word", async (_name, answers, rpc, described) => {
    const client = clientAnswering(answers);
    const calls = {
      reserve: () => client.reserve(reserveInput),
      release: () => client.release({ ref, generation: 1 }),
      lookup: () => client.lookup({ ref, subject: { tenant: "acme", principal: "alice" } }),
      listRecoverable: () => client.listRecoverable(),
    };
    const call = calls[rpc]();
    const error = await call.then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(CoordinatorError);
    expect(error).toMatchObject({ code: Code.Internal, reason: "INTERNAL" });
    expect((error as CoordinatorError).retryable).toBe(false);
    expect((error as CoordinatorError).message).toBe(`the coordinator answered ${described}, a value this version of the gateway SDK does not know: upgrade idempotency-gateway`);
  });
});

describe("the server's translation of policies", () => {
  /** A policy of json mode whose body has one member of every field type. */
  const document = parsePolicyDocument({
    operation: "payments.create",
    apiRevision: 1,
    fingerprint: {
      mode: "json",
      schema: {
        type: "object",
        properties: {
          text: { type: "string" },
          flag: { type: "boolean" },
          count: { type: "integer" },
          amount: { type: "decimal", scale: "normalized" },
          price: { type: "decimal" },
          ratio: { type: "number" },
          tags: { type: "array", items: { type: "string" } },
        },
      },
    },
  });

  it("translates every fingerprint mode, field type and decimal scale both ways", () => {
    expect(policyFromProto(policyToProto(document))).toEqual(document);
    expect(policyFromProto(policyToProto(parsePolicyDocument({ operation: "payments.create", apiRevision: 1 }))).fingerprint.mode).toBe("raw");
  });

  it.each([
    [
      "a fingerprint mode",
      (wire: ReturnType<typeof policyToProto>) => (wire.fingerprint!.mode = NEWER as FingerprintMode),
      "policy.fingerprint.mode",
      `idempotency.v1.FingerprintMode ${NEWER}`,
    ],
    [
      "a field type",
      (wire: ReturnType<typeof policyToProto>) => (wire.fingerprint!.schema!.properties.amount!.type = NEWER as FieldType),
      "policy.fingerprint.schema.properties.amount.type",
      `idempotency.v1.FieldType ${NEWER}`,
    ],
  ] as const)("refuses %s this coordinator does not know with INVALID_POLICY, naming the field", (_name, change, path, described) => {
    const wire = policyToProto(document);
    change(wire);
    let refused: unknown;
    try {
      policyFromProto(wire);
    } catch (error) {
      refused = error;
    }
    expect(refused).toBeInstanceOf(IdempotencyError);
    expect(refused).toMatchObject({ reason: "INVALID_POLICY", metadata: { path }, message: `${path} is ${described}, which this coordinator does not know` });
  });
});
