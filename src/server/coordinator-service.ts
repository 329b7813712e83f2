import { create, type Message } from "@bufbuild/protobuf";
import { ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import type { Tracer } from "@opentelemetry/api";
import { MAX_BATCH_CALLS } from "../contract/batch.js";
import { refuse } from "../contract/errors.js";
import { CONTRACT_VERSION } from "../contract/scope.js";
import { CLAIM_MODES } from "../contract/words.js";
import {
  AbandonResponseSchema,
  type BatchCall,
  BatchResponseSchema,
  type BatchResult,
  ClaimResponseSchema,
  CompleteResponseSchema,
  CoordinatorService,
  ListRecoverableResponseSchema,
  LookupResponseSchema,
  RecordEffectAttemptResponseSchema,
  ReleaseResponseSchema,
  RenewLeaseResponseSchema,
  type ReserveRequest,
  ReserveResponseSchema,
  ResolveEffectAttemptResponseSchema,
} from "../gen/idempotency/v1/coordinator_pb.js";
import type { Db } from "../registry/db.js";
import type { Registry } from "../registry/registry.js";
import { recoveryOnly } from "../registry/state-machine.js";
import type { HolderInput, RecoverableCursor, RequestIdentity, StoredRecord } from "../registry/types.js";
import { authorize } from "./authorization.js";
import { scopeOf } from "./callers.js";
import {
  fromProtoClaimMode,
  fromProtoEffectStatus,
  fromProtoDuration,
  fromProtoOutcome,
  fromProtoRef,
  fromProtoSnapshot,
  fromProtoSubject,
  fromUint64,
  toProtoAttempt,
  toProtoDecision,
  toProtoDuration,
  toProtoRecord,
  toProtoSnapshot,
  toProtoState,
  toTimestamp,
} from "./convert.js";
import { errorMappingOf, statusOf } from "./errors.js";
import { callerOf, refuseUnknownFields } from "./interceptors.js";
import type { Metrics } from "./metrics.js";
import { RecordWatch, waitBudgetMs, waitForOwner } from "./owner-wait.js";
import { tracedBatchCall } from "./tracing.js";
import { decodePageToken, encodePageToken } from "./page-token.js";

/** What the coordinator's handlers need. */
export interface CoordinatorDeps {
  registry: Registry;
  db: Db;
  /**
   * Where Lookup and ListRecoverable read (the reader's Db when one is
   * configured; default `db`). A recovery worker may find a record there that
   * was settled or claimed since: its Claim decides on `db` and refuses it.
   */
  reads?: Db;
  /** Decisions and takeovers are counted when given. */
  metrics?: Metrics;
  /** Each call of a Batch gets a span of its own when given (its RPC's span comes from the tracing interceptor). */
  tracer?: Tracer;
  /** Most Reserves of one caller waiting for an owner at once (IDEM_WAITERS_PER_CALLER); no bound when absent. */
  waitersPerCaller?: number;
}

/**
 * The CoordinatorService handlers: translation between the wire and the
 * registry, which holds every rule of the contract. Each RPC's caller is
 * authorized by its role before its handler runs (authorization.ts): by the
 * authentication interceptor, and for each call of a Batch, here.
 */
export function coordinatorService({ registry, db, reads, metrics, tracer, waitersPerCaller }: CoordinatorDeps): ServiceImpl<typeof CoordinatorService> {
  const watch = new RecordWatch(waitersPerCaller, (waiting) => metrics?.reservesWaiting.set(waiting));
  const unary = unaryHandlers({ registry, db, reads, metrics }, watch);

  /** One call of a batch, answered by its unary handler: its response, or the status its unary RPC would be refused with. */
  async function answer(call: BatchCall, ctx: HandlerContext): Promise<BatchResult["result"]> {
    const kind = call.call.case;
    const method = kind ? CoordinatorService.method[kind].name : undefined;
    const startedAt = performance.now();
    try {
      if (call.$unknown && call.$unknown.length > 0) {
        refuse("UNKNOWN_FIELD", "the batch carries a kind of call this coordinator does not know; upgrade the coordinator or send that call's own RPC");
      }
      if (!kind)
        refuse(
          "INVALID_REQUEST",
          "a batch's call names its kind: one of reserve, claim, renew_lease, record_effect_attempt, resolve_effect_attempt, complete, release, abandon, lookup",
        );
      // What the authentication and unknownFieldsRefused interceptors do for the unary RPC, in their order.
      authorize(callerOf(ctx.values), CoordinatorService.method[kind], call.call.value);
      refuseUnknownFields(call.call.value);
      // Each case of BatchCall.call is named after the RPC whose request it carries, and BatchResult.result after the one whose response it holds.
      const handler = unary[kind] as (req: Message, ctx: HandlerContext) => Promise<Message>;
      const request = call.call.value;
      const value = await tracedBatchCall(tracer, CoordinatorService.typeName, CoordinatorService.method[kind].name, call.traceContext, () => handler(request, ctx));
      if (method) metrics?.observeCall(CoordinatorService.typeName, method, startedAt);
      return { case: kind, value } as BatchResult["result"];
    } catch (error) {
      const refused = errorMappingOf(ctx.values)(error, method ?? "Batch");
      if (method) metrics?.observeCall(CoordinatorService.typeName, method, startedAt, refused);
      return { case: "error", value: statusOf(refused) };
    }
  }

  return {
    ...unary,

    async batch(req, ctx) {
      if (req.calls.length > MAX_BATCH_CALLS) {
        refuse("INVALID_REQUEST", `a batch carries at most ${MAX_BATCH_CALLS} calls, this one ${req.calls.length}: split it`, { max_calls: String(MAX_BATCH_CALLS) });
      }
      const results = await untilAborted(ctx.signal, Promise.all(req.calls.map((call) => answer(call, ctx))));
      return create(BatchResponseSchema, { results: results.map((result) => ({ result })) });
    },
  };
}

/**
 * The answers as soon as they are all there, or the batch's deadline or
 * cancellation first: its client has stopped waiting, and the calls still
 * running finish on their own as a unary call's would.
 */
function untilAborted<T>(signal: AbortSignal, work: Promise<T>): Promise<T> {
  if (signal.aborted) return Promise.reject(ConnectError.from(signal.reason));
  return new Promise<T>((resolve, reject) => {
    const abort = () => reject(ConnectError.from(signal.reason));
    signal.addEventListener("abort", abort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener("abort", abort));
  });
}

/**
 * The unary RPCs' handlers, which Batch runs too. Every change a holder
 * commits here (Complete, Release, Abandon) wakes the Reserves of this
 * coordinator waiting on its record (`watch`).
 */
function unaryHandlers({ registry, db, reads = db, metrics }: CoordinatorDeps, watch: RecordWatch): Omit<ServiceImpl<typeof CoordinatorService>, "batch"> {
  return {
    async reserve(req, ctx) {
      const caller = callerOf(ctx.values);
      const input = {
        subject: fromProtoSubject(req.subject),
        operation: req.operation,
        apiRevision: req.apiRevision,
        idempotencyKey: req.idempotencyKey,
        request: requestIdentity(req.request),
        claim: req.claim,
        leaseMs: fromProtoDuration(req.lease),
        writerEpoch: fromUint64(req.writerEpoch, "writer_epoch"),
        effects: req.effects.map(({ effect, provider }) => ({ effect, provider })),
      };
      const budgetMs = waitBudgetMs(fromProtoDuration(req.waitForOwner, "wait_for_owner"), ctx.timeoutMs());
      const decide = () => registry.reserve(db, input, caller);
      let result = await decide();
      const moved = (record: StoredRecord) => registry.ownerMoved(db, record);
      if (budgetMs > 0) result = await waitForOwner(result, { tenant: input.subject.tenant, caller: caller.caller, budgetMs, watch, signal: ctx.signal, decide, moved });
      const record = result.record;
      metrics?.decisions.inc({ operation: req.operation, decision: result.decision, enforced: String(result.enforced) });
      if (result.takenOver) metrics?.takeovers.inc({ operation: req.operation, mode: "RESERVE" });
      return create(ReserveResponseSchema, {
        decision: toProtoDecision(result.decision),
        operationId: record?.operationId ?? "",
        state: record ? toProtoState(record.state) : undefined,
        // The fencing token belongs to the owner only.
        generation: result.decision === "ACCEPTED" && record ? BigInt(record.generation) : 0n,
        leaseExpiresAt: record ? toTimestamp(record.leaseExpiresAt) : undefined,
        retryAfter: result.retryAfterMs !== undefined ? toProtoDuration(result.retryAfterMs) : undefined,
        snapshot: result.decision === "REPLAY" ? toProtoSnapshot(record!.snapshot) : undefined,
        enforced: result.enforced,
        schemaRevision: result.schemaRevision,
        contractVersion: CONTRACT_VERSION,
        effectAttempts: (result.attempts ?? []).map(toProtoAttempt),
        cacheableFor: result.decision === "REPLAY" && result.cacheableForMs !== undefined ? toProtoDuration(result.cacheableForMs) : undefined,
      });
    },

    async claim(req, ctx) {
      const caller = callerOf(ctx.values);
      const mode = fromProtoClaimMode(req.mode);
      const { record, attempts } = await registry.claim(
        db,
        {
          ref: fromProtoRef(req.ref),
          mode,
          generation: fromUint64(req.generation, "generation"),
          leaseMs: fromProtoDuration(req.lease),
          writerEpoch: fromUint64(req.writerEpoch, "writer_epoch"),
        },
        caller,
      );
      if (mode !== "OWNER") metrics?.takeovers.inc({ operation: record.operation, mode });
      return create(ClaimResponseSchema, {
        generation: BigInt(record.generation),
        state: toProtoState(record.state),
        leaseExpiresAt: toTimestamp(record.leaseExpiresAt),
        recovering: record.recovering,
        effectAttempts: attempts.map(toProtoAttempt),
      });
    },

    async renewLease(req, ctx) {
      const caller = callerOf(ctx.values);
      const record = await registry.renewLease(db, { ...holder(req), leaseMs: fromProtoDuration(req.lease) }, caller);
      return create(RenewLeaseResponseSchema, { leaseExpiresAt: toTimestamp(record.leaseExpiresAt) });
    },

    async recordEffectAttempt(req, ctx) {
      const caller = callerOf(ctx.values);
      const attempt = await registry.recordEffectAttempt(db, { ...holder(req), effect: req.effect, provider: req.provider }, caller);
      return create(RecordEffectAttemptResponseSchema, { attempt: toProtoAttempt(attempt) });
    },

    async resolveEffectAttempt(req, ctx) {
      const caller = callerOf(ctx.values);
      const attempt = await registry.resolveEffectAttempt(
        db,
        { ...holder(req), attemptNumber: req.attemptNumber, status: fromProtoEffectStatus(req.status), providerHandle: req.providerHandle },
        caller,
      );
      return create(ResolveEffectAttemptResponseSchema, { attempt: toProtoAttempt(attempt) });
    },

    async complete(req, ctx) {
      const caller = callerOf(ctx.values);
      const resolutions = req.resolutions.map((r) => ({ attemptNumber: r.attemptNumber, status: fromProtoEffectStatus(r.status), providerHandle: r.providerHandle }));
      const record = await registry.complete(db, { ...holder(req), outcome: fromProtoOutcome(req.outcome), snapshot: fromProtoSnapshot(req.snapshot), resolutions }, caller);
      watch.changed(record.tenant, record.operationId);
      return create(CompleteResponseSchema, {
        state: toProtoState(record.state),
        snapshotDigest: record.snapshot!.digest,
        completedAt: toTimestamp(record.completedAt),
      });
    },

    async release(req, ctx) {
      const caller = callerOf(ctx.values);
      const record = await registry.release(db, holder(req), caller);
      watch.changed(record.tenant, record.operationId);
      return create(ReleaseResponseSchema, { state: toProtoState(record.state), generation: BigInt(record.generation) });
    },

    async abandon(req, ctx) {
      const caller = callerOf(ctx.values);
      const record = await registry.abandon(db, holder(req), caller);
      watch.changed(record.tenant, record.operationId);
      return create(AbandonResponseSchema, { state: toProtoState(record.state), generation: BigInt(record.generation) });
    },

    async lookup(req, ctx) {
      const caller = callerOf(ctx.values);
      let view;
      switch (req.by.case) {
        case "ref": {
          const ref = fromProtoRef(req.by.value);
          let principal: string | undefined;
          if (req.subject) {
            const subject = fromProtoSubject(req.subject);
            if (subject.tenant !== ref.tenant) refuse("INVALID_REQUEST", "subject.tenant must equal ref.tenant");
            principal = subject.principal;
          } else if (!caller.isOperator) {
            refuse("INVALID_REQUEST", "subject is required: only operators look up operations of any principal");
          }
          view = await registry.lookupById(reads, { ref, ...(principal !== undefined ? { principal } : {}) }, caller);
          break;
        }
        case "scope": {
          const scope = req.by.value;
          view = await registry.lookupByScope(
            reads,
            { subject: fromProtoSubject(scope.subject, "scope.subject"), operation: scope.operation, apiRevision: scope.apiRevision, idempotencyKey: scope.idempotencyKey },
            caller,
          );
          break;
        }
        default:
          refuse("INVALID_REQUEST", "ref or scope is required");
      }
      return create(LookupResponseSchema, { record: toProtoRecord(view) });
    },

    async listRecoverable(req, ctx) {
      const caller = callerOf(ctx.values);
      const { views, next } = await registry.listRecoverable(
        reads,
        { ...scopeOf(caller, req.tenant, req.operations), pageSize: req.pageSize, after: resumeAfter(req.pageToken) },
        caller,
      );
      return create(ListRecoverableResponseSchema, {
        records: views.map((view) => ({
          record: toProtoRecord(view),
          claimMode: CLAIM_MODES.number(view.record.state === "UNKNOWN" || recoveryOnly(view.record) ? "RECOVER" : "TAKEOVER"),
        })),
        nextPageToken: next ? encodePageToken([next.leaseEnd, next.tenant, next.operationId]) : "",
      });
    },
  };
}

function resumeAfter(token: string): RecoverableCursor | undefined {
  const key = decodePageToken(token, 3);
  return key && { leaseEnd: key[0]!, tenant: key[1]!, operationId: key[2]! };
}

function requestIdentity(request: ReserveRequest["request"]): RequestIdentity {
  switch (request.case) {
    case "parts": {
      const parts = request.value;
      return {
        kind: "parts",
        parts: {
          method: parts.method,
          path: parts.path,
          query: parts.query,
          mediaType: parts.mediaType,
          headers: parts.headers.map((h) => ({ name: h.name, value: h.value })),
          body: parts.body,
        },
      };
    }
    case "fingerprint": {
      const { scheme, schemaRevision, digest } = request.value;
      return { kind: "fingerprint", scheme, schemaRevision, digest };
    }
    default:
      return refuse("INVALID_REQUEST", "parts or fingerprint is required: what identifies the request's content");
  }
}

/** The operation and generation a write by its holder names. */
function holder(req: { ref?: { tenant: string; operationId: string } | undefined; generation: bigint }): HolderInput {
  return { ref: fromProtoRef(req.ref), generation: fromUint64(req.generation, "generation") };
}
