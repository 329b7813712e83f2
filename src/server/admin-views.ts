import { create, type JsonObject } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { IdempotencyError, refuse } from "../contract/errors.js";
import { pageSize } from "../contract/page-size.js";
import { RECORD_STATES } from "../contract/words.js";
import { bodyLength } from "../crypto/sealing.js";
import {
  type AdminService,
  FindRecordsResponseSchema,
  GetEventSeriesResponseSchema,
  GetRecordCensusResponseSchema,
  GetRecordHistoryResponseSchema,
  ListNewestRecordsResponseSchema,
  ListRecentEventsResponseSchema,
  ListUnknownRecordsResponseSchema,
  LoggedEventSchema,
  RecordSummarySchema,
} from "../gen/idempotency/v1/admin_pb.js";
import type { Db } from "../registry/db.js";
import type { PolicyStore } from "../registry/policy-store.js";
import type { Registry } from "../registry/registry.js";
import type { LoggedEvent, RecordView, StoredAttempt, StoredRecord } from "../registry/types.js";
import { scopeOf } from "./callers.js";
import { fromProtoRef, fromProtoState, toProtoAttempt, toProtoDuration, toProtoState, toTimestamp } from "./convert.js";
import { CHART_WINDOWS, eventLogCharts, type ChartSeries, type DecisionSampler } from "./event-series.js";
import { callerOf } from "./interceptors.js";
import { decodePageToken, encodePageToken } from "./page-token.js";

/** Most events a record's timeline holds: its newest. */
const TIMELINE_LIMIT = 500;

export interface AdminViewDeps {
  registry: Registry;
  /** Where the views read: the reader's Db when one is configured. */
  reads: Db;
  /** The published policies, read over `reads`: a search by scope without a revision tries each published one. */
  readStore: PolicyStore;
  /** This replica's Reserve decisions (metrics), sampled for the ones the event log does not hold. */
  decisions?: DecisionSampler;
}

type ViewMethods = "getRecordCensus" | "listNewestRecords" | "findRecords" | "listUnknownRecords" | "getRecordHistory" | "listRecentEvents" | "getEventSeries";

/**
 * AdminService's reads for the operator console (docs/console.md): what the
 * registry holds within the caller's grant. The grant narrows the registry's
 * statements before any limit (so that other tenants' rows never crowd a
 * caller's own out), and the registry checks each row against it again.
 */
export function adminViews({ registry, reads, readStore, decisions }: AdminViewDeps): Pick<ServiceImpl<typeof AdminService>, ViewMethods> {
  return {
    async getRecordCensus(_req, ctx) {
      const caller = callerOf(ctx.values);
      const census = await registry.census(reads, scopeOf(caller));
      return create(GetRecordCensusResponseSchema, {
        states: RECORD_STATES.words.map((state) => ({ state: toProtoState(state), records: BigInt(census.byState.get(state) ?? 0) })),
        oldestUnknown: toProtoDuration(Math.round(census.oldestUnknownSeconds) * 1000),
      });
    },

    async listNewestRecords(req, ctx) {
      const caller = callerOf(ctx.values);
      const size = pageSize(req.pageSize);
      const before = decodePageToken(req.pageToken, 3);
      const { views, next } = await registry.newestRecords(
        reads,
        {
          ...scopeOf(caller),
          ...(req.states.length > 0 ? { states: req.states.map(fromProtoState) } : {}),
          pageSize: size,
          ...(before ? { before: { createdAt: before[0]!, tenant: before[1]!, operationId: before[2]! } } : {}),
        },
        caller,
      );
      return create(ListNewestRecordsResponseSchema, {
        records: views.map(toSummary),
        nextPageToken: next ? encodePageToken([next.createdAt, next.tenant, next.operationId]) : "",
      });
    },

    async findRecords(req, ctx) {
      const caller = callerOf(ctx.values);
      if (req.by.case === "operationId") {
        return create(FindRecordsResponseSchema, { records: (await registry.recordsById(reads, req.by.value, scopeOf(caller).tenants, caller)).map(toSummary) });
      }
      const scope = req.by.case === "scope" ? req.by.value : undefined;
      const tenant = scope?.subject?.tenant ?? "";
      const principal = scope?.subject?.principal ?? "";
      if (!scope || !tenant || !principal || !scope.operation || !scope.idempotencyKey) {
        refuse("INVALID_REQUEST", "search by an operation id, or by a scope: tenant, principal, operation and idempotency key");
      }
      const { operation, idempotencyKey } = scope;
      // Without a revision, the scope at each published revision of the operation: the key is hashed with it.
      const published = [...new Set((await readStore.list(operation)).map((p) => p.document.apiRevision))];
      const revisions = scope.apiRevision ? [scope.apiRevision] : published.length > 0 ? published : [1];
      const found: RecordView[] = [];
      for (const apiRevision of revisions) {
        try {
          found.push(await registry.lookupByScope(reads, { subject: { tenant, principal }, operation, apiRevision, idempotencyKey }, caller));
        } catch (error) {
          if (!(error instanceof IdempotencyError) || error.reason !== "NOT_FOUND") throw error;
        }
      }
      return create(FindRecordsResponseSchema, { records: found.map(toSummary) });
    },

    async listUnknownRecords(req, ctx) {
      const caller = callerOf(ctx.values);
      const views = await registry.unknownQueue(reads, { ...scopeOf(caller), limit: pageSize(req.pageSize) }, caller);
      return create(ListUnknownRecordsResponseSchema, {
        records: views.map((view) => ({ record: toSummary(view), unknownFor: toProtoDuration(ageOf(view.record) * 1000) })),
      });
    },

    async getRecordHistory(req, ctx) {
      const caller = callerOf(ctx.values);
      return create(GetRecordHistoryResponseSchema, history(await registry.recordHistory(reads, fromProtoRef(req.ref), caller, TIMELINE_LIMIT)));
    },

    async listRecentEvents(req, ctx) {
      const caller = callerOf(ctx.values);
      if (req.kinds.length === 0) refuse("INVALID_REQUEST", "kinds must name at least one event kind, e.g. CONFLICT");
      const events = await registry.recentEvents(reads, { ...scopeOf(caller), kinds: req.kinds, limit: pageSize(req.pageSize) }, caller);
      return create(ListRecentEventsResponseSchema, { events: events.map(toProtoEvent) });
    },

    async getEventSeries(req, ctx) {
      const caller = callerOf(ctx.values);
      const minutes = req.minutes || 10;
      if (!CHART_WINDOWS.includes(minutes)) refuse("INVALID_REQUEST", `minutes must be one of ${CHART_WINDOWS.join(", ")}`);
      const { grid, now, series } = await eventLogCharts(registry, reads, scopeOf(caller), minutes);
      // This replica's metrics count decisions of every tenant: shown only to operators granted them all.
      const replica = decisions && caller.tenants === "*" ? await decisions.series(grid, (operation) => caller.mayOperate(operation)) : undefined;
      return create(GetEventSeriesResponseSchema, {
        minutes,
        stepSeconds: grid.stepSeconds,
        bucketStarts: grid.buckets.map(BigInt),
        bucketSeconds: grid.spans,
        now: timestampFromMs(Math.round(now * 1000)),
        series: series.map(toProtoSeries),
        ...(replica ? { replica: { since: timestampFromMs(Date.parse(replica.since)), series: replica.series.map(toProtoSeries) } } : {}),
      });
    },
  };
}

function toSummary({ record, attempts }: RecordView) {
  return create(RecordSummarySchema, {
    tenant: record.tenant,
    operationId: record.operationId,
    principal: record.principal,
    operation: record.operation,
    apiRevision: record.apiRevision,
    state: toProtoState(record.state),
    generation: BigInt(record.generation),
    recovering: record.recovering,
    tombstoned: record.tombstonedAt !== null,
    createdAt: toTimestamp(record.createdAt),
    updatedAt: toTimestamp(record.updatedAt),
    effectAttempts: attempts.map(toProtoAttempt),
  });
}

function toProtoEvent(event: Omit<LoggedEvent, "cursor">) {
  return create(LoggedEventSchema, { ...eventFields(event), ...(event.generation !== null ? { generation: BigInt(event.generation) } : {}) });
}

/** What every message of an event carries, from the event log's entry (the generation and cursor are each message's own). */
export function eventFields(event: Omit<LoggedEvent, "cursor">) {
  return {
    eventId: BigInt(event.eventId),
    tenant: event.tenant,
    operationId: event.operationId ?? "",
    operation: event.operation ?? "",
    apiRevision: event.apiRevision ?? 0,
    kind: event.kind,
    state: event.state ?? "",
    caller: event.caller,
    detail: event.detail as JsonObject,
    at: toTimestamp(event.at),
  };
}

function toProtoSeries(series: ChartSeries) {
  return { key: series.key, title: series.title, unit: series.unit, values: series.values, counts: (series.counts ?? []).map((n) => BigInt(Math.round(n))) };
}

/** Seconds since a record last changed, in database time: for an UNKNOWN one, how long it has been UNKNOWN. */
function ageOf(record: StoredRecord): number {
  return Math.max(0, Math.round((record.dbNow.getTime() - record.updatedAt.getTime()) / 1000));
}

/** A record's story: the record, its lease and owner, its stored response's metadata, its generations and its timeline. */
function history(view: RecordView & { events: Array<Omit<LoggedEvent, "cursor">> }) {
  const { record, attempts, events } = view;
  const generations = generationsOf(events, attempts);
  const current = generations.find((g) => g.generation === record.generation);
  const unfinished = record.state === "RESERVED" || record.state === "EXECUTING";
  return {
    record: toSummary(view),
    effectPossible: record.effectPossible,
    writerEpoch: BigInt(record.writerEpoch),
    completedAt: toTimestamp(record.completedAt),
    retainUntil: toTimestamp(record.retainUntil),
    tombstonedAt: toTimestamp(record.tombstonedAt),
    readAt: toTimestamp(record.dbNow),
    ...(record.leaseExpiresAt ? { lease: { expiresAt: toTimestamp(record.leaseExpiresAt), live: record.leaseExpiresAt > record.dbNow } } : {}),
    // Who holds an unfinished record: the caller whose acceptance, claim or takeover began its generation.
    ...(unfinished && record.leaseExpiresAt && current?.caller
      ? { owner: { generation: BigInt(record.generation), caller: current.caller, since: toTimestamp(current.since) } }
      : {}),
    ...(record.snapshot ? { storedResponse: storedResponseFacts(record, record.snapshot) } : {}),
    generations: generations.map((g) => ({
      generation: BigInt(g.generation),
      beganWith: g.began ?? "",
      beganAt: toTimestamp(g.since),
      beganBy: g.caller ?? "",
      attemptNumbers: g.attempts,
      events: g.events,
    })),
    events: events.map(toProtoEvent),
    eventsLimit: TIMELINE_LIMIT,
  };
}

/**
 * What an operator is shown of a stored response: its status, media type,
 * body size, header names, whether its body is sealed (and under which key
 * id), and its digest. Never the body, the header values or the location:
 * they are the end user's data as the service answered it (an account, an
 * address, a token), which settling a record never needs (an operator goes
 * by the effect attempts and the downstream system), and a browser page is
 * where data leaks most easily: screenshots, shared screens, a tab left
 * open. An operator who must read a body has `idemctl lookup`, a deliberate
 * act with the same grant. Nor are sealed bodies opened: a record whose key
 * has left the ring still shows.
 */
function storedResponseFacts(record: StoredRecord, snapshot: NonNullable<StoredRecord["snapshot"]>) {
  return {
    ...(record.tombstonedAt ? {} : { statusCode: snapshot.statusCode, bodyBytes: BigInt(bodyLength(snapshot.body, snapshot.keyId)) }),
    mediaType: snapshot.mediaType,
    headerNames: snapshot.headers.map(([name]) => name),
    sealedWith: snapshot.keyId ?? "",
    digest: snapshot.digest,
  };
}

/** A record's generations as its events and attempts tell them: how and when each began, by whom, and its attempts. */
function generationsOf(events: ReadonlyArray<Omit<LoggedEvent, "cursor">>, attempts: readonly StoredAttempt[]) {
  const byGeneration = new Map<number, { generation: number; since: Date | null; began: string | null; caller: string | null; events: number; attempts: number[] }>();
  const of = (generation: number) => {
    let entry = byGeneration.get(generation);
    if (!entry) byGeneration.set(generation, (entry = { generation, since: null, began: null, caller: null, events: 0, attempts: [] }));
    return entry;
  };
  for (const event of events) {
    if (event.generation === null) continue;
    const entry = of(event.generation);
    if (entry.events++ === 0) Object.assign(entry, { since: event.at, began: event.kind, caller: event.caller });
  }
  for (const attempt of attempts) of(attempt.generation).attempts.push(attempt.attemptNumber);
  return [...byGeneration.values()].sort((a, b) => a.generation - b.generation);
}
