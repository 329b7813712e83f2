import { create } from "@bufbuild/protobuf";
import { type Duration, DurationSchema, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { FieldSchema as DomainFieldSchema } from "../contract/json-schema.js";
import { parseDuration, parsePolicyDocument, type PolicyDocument } from "../policy/document.js";
import type { StoredPolicy } from "../policy/cache.js";
import { refuse } from "../contract/errors.js";
import { vocabulary, type Vocabulary, type WordsOf } from "../contract/words.js";
import {
  DecimalScale,
  DecimalScaleSchema,
  FieldSchemaSchema,
  FieldType,
  FieldTypeSchema,
  FingerprintMode,
  FingerprintModeSchema,
  type FieldSchema,
  type OperationPolicy,
  OperationPolicySchema,
  type PublishedPolicy,
  PublishedPolicySchema,
} from "../gen/idempotency/v1/policy_pb.js";

/**
 * Translation between the wire form of a policy (idempotency.v1.OperationPolicy)
 * and the document people write and the registry stores. Unset and zero wire
 * fields are left out, so that the document's defaults apply; the document
 * parser then validates everything.
 */
export function policyFromProto(policy: OperationPolicy | undefined): PolicyDocument {
  if (!policy) return parsePolicyDocument(undefined);
  const fp = policy.fingerprint;
  const retention = policy.retention;
  return parsePolicyDocument(
    withoutUnset({
      operation: policy.operation || undefined,
      apiRevision: policy.apiRevision || undefined,
      schemaRevision: policy.schemaRevision || undefined,
      fingerprint: fp && {
        mode: documentWord(FINGERPRINT_MODES, fp.mode, "policy.fingerprint.mode"),
        queryParameters: fp.queryParameters,
        headers: fp.headers,
        maxBodyBytes: fp.maxBodyBytes || undefined,
        maxDepth: fp.maxDepth || undefined,
        schema: fp.schema && fieldSchemaFromProto(fp.schema, "policy.fingerprint.schema"),
      },
      keys: policy.keys && {
        minLength: policy.keys.minLength || undefined,
        maxLength: policy.keys.maxLength || undefined,
        minEntropyBits: policy.keys.minEntropyBits || undefined,
      },
      lease: policy.lease && { default: durationText(policy.lease.defaultLease), max: durationText(policy.lease.maxLease) },
      retention: retention && {
        keep: durationText(retention.keep),
        clientRetryWindow: durationText(retention.clientRetryWindow),
        queueBacklogWindow: durationText(retention.queueBacklogWindow),
        reconciliationWindow: durationText(retention.reconciliationWindow),
        backupRestoreWindow: durationText(retention.backupRestoreWindow),
        tombstoneReuse: retention.tombstoneReuse && {
          allowed: retention.tombstoneReuse.allowed,
          horizon: durationText(retention.tombstoneReuse.horizon),
        },
      },
      maxActivePerPrincipal: policy.maxActivePerPrincipal || undefined,
      snapshot: policy.snapshot && {
        headerAllowlist: policy.snapshot.headerAllowlist,
        maxBodyBytes: policy.snapshot.maxBodyBytes || undefined,
        maxHeaders: policy.snapshot.maxHeaders || undefined,
        maxHeaderNameBytes: policy.snapshot.maxHeaderNameBytes || undefined,
        maxHeaderValueBytes: policy.snapshot.maxHeaderValueBytes || undefined,
        maxLocationBytes: policy.snapshot.maxLocationBytes || undefined,
        maxBusinessVersionBytes: policy.snapshot.maxBusinessVersionBytes || undefined,
        maxMediaTypeBytes: policy.snapshot.maxMediaTypeBytes || undefined,
      },
    }),
  );
}

export function policyToProto(document: PolicyDocument): OperationPolicy {
  const fp = document.fingerprint;
  return create(OperationPolicySchema, {
    operation: document.operation,
    apiRevision: document.apiRevision,
    schemaRevision: document.schemaRevision,
    fingerprint: {
      mode: wireWord(FINGERPRINT_MODES, fp.mode),
      queryParameters: fp.queryParameters,
      headers: fp.headers,
      maxBodyBytes: fp.maxBodyBytes,
      maxDepth: fp.maxDepth ?? 0,
      schema: fp.schema && fieldSchemaToProto(fp.schema),
    },
    keys: document.keys,
    lease: { defaultLease: protoDuration(document.lease.default), maxLease: protoDuration(document.lease.max) },
    retention: {
      keep: protoDuration(document.retention.keep),
      clientRetryWindow: protoDuration(document.retention.clientRetryWindow),
      queueBacklogWindow: protoDuration(document.retention.queueBacklogWindow),
      reconciliationWindow: protoDuration(document.retention.reconciliationWindow),
      backupRestoreWindow: protoDuration(document.retention.backupRestoreWindow),
      tombstoneReuse: { allowed: document.retention.tombstoneReuse.allowed, horizon: protoDuration(document.retention.tombstoneReuse.horizon) },
    },
    maxActivePerPrincipal: document.maxActivePerPrincipal,
    snapshot: document.snapshot,
  });
}

export function publishedToProto(stored: StoredPolicy): PublishedPolicy {
  return create(PublishedPolicySchema, {
    policy: policyToProto(stored.document),
    digest: stored.digest,
    publishedAt: timestampFromDate(stored.publishedAt),
    publishedBy: stored.publishedBy,
  });
}

/**
 * The policy document's enums, whose words are the proto's in lower case
 * (`FINGERPRINT_MODE_JSON` is "json").
 */
const FINGERPRINT_MODES = vocabulary<WordsOf<typeof FingerprintMode>, FingerprintMode>(FingerprintModeSchema);
const FIELD_TYPES = vocabulary<WordsOf<typeof FieldType>, FieldType>(FieldTypeSchema);
const DECIMAL_SCALES = vocabulary<WordsOf<typeof DecimalScale>, DecimalScale>(DecimalScaleSchema);

/**
 * The document's word of an enum field of a policy: undefined when unset, so
 * that the document's default applies. A number this coordinator does not
 * know refuses the policy, naming the field (INVALID_POLICY).
 */
function documentWord<Word extends string>(words: Vocabulary<Word, number>, value: number, path: string): string | undefined {
  if (value === 0) return undefined;
  return words.word(value, (described) => refuse("INVALID_POLICY", `${path} is ${described}, which this coordinator does not know`, { path })).toLowerCase();
}

/** The number on the wire of a document's word. */
function wireWord<Word extends string>(words: Vocabulary<Word, number>, word: Lowercase<Word>): number {
  return words.number(word.toUpperCase() as Word);
}

function fieldSchemaFromProto(schema: FieldSchema, path: string): Record<string, unknown> {
  return withoutUnset({
    type: documentWord(FIELD_TYPES, schema.type, `${path}.type`),
    nullable: schema.nullable || undefined,
    nullEqualsAbsent: schema.nullEqualsAbsent || undefined,
    fingerprint: schema.fingerprint,
    required: schema.required || undefined,
    scale: documentWord(DECIMAL_SCALES, schema.scale, `${path}.scale`),
    properties:
      Object.keys(schema.properties).length > 0
        ? Object.fromEntries(Object.entries(schema.properties).map(([name, member]) => [name, fieldSchemaFromProto(member, `${path}.properties.${name}`)]))
        : undefined,
    items: schema.items && fieldSchemaFromProto(schema.items, `${path}.items`),
    set: schema.set || undefined,
  });
}

function fieldSchemaToProto(schema: DomainFieldSchema): FieldSchema {
  return create(FieldSchemaSchema, {
    type: wireWord(FIELD_TYPES, schema.type),
    nullable: schema.nullable ?? false,
    nullEqualsAbsent: schema.nullEqualsAbsent ?? false,
    ...(schema.fingerprint === false ? { fingerprint: false } : {}),
    required: schema.required ?? false,
    scale: schema.type === "decimal" ? wireWord(DECIMAL_SCALES, schema.scale ?? "significant") : DecimalScale.UNSPECIFIED,
    properties: Object.fromEntries(Object.entries(schema.properties ?? {}).map(([name, member]) => [name, fieldSchemaToProto(member)])),
    items: schema.items && fieldSchemaToProto(schema.items),
    set: schema.set ?? false,
  });
}

/** A wire duration as document text (whole milliseconds; finer parts are refused by the parser). */
function durationText(duration: Duration | undefined): string | undefined {
  if (!duration) return undefined;
  const ms = Number(duration.seconds) * 1000 + duration.nanos / 1e6;
  return Number.isInteger(ms) && ms >= 0 ? `${ms}ms` : `${duration.seconds}s${duration.nanos}ns`;
}

function protoDuration(text: string): Duration {
  const ms = parseDuration(text)!;
  return create(DurationSchema, { seconds: BigInt(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 });
}

/** Drops undefined members (and objects left empty) so that document defaults apply. */
function withoutUnset(o: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(o)) {
    if (value === undefined) continue;
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      out[key] = withoutUnset(value as Record<string, unknown>);
    } else {
      out[key] = value;
    }
  }
  return out;
}
