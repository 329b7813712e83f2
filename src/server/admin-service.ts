import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { refuse } from "../contract/errors.js";
import { pageSize } from "../contract/page-size.js";
import { validateApiRevision, validateOperationName } from "../contract/scope.js";
import { choice } from "../contract/words.js";
import {
  AdminService,
  GetPolicyResponseSchema,
  ListOperationControlsResponseSchema,
  ListPoliciesResponseSchema,
  ListRecordsResponseSchema,
  OperationControlSchema,
  PublishPolicyResponseSchema,
  RaiseWriterEpochResponseSchema,
  ReconcileResponseSchema,
  RunRetentionSweepResponseSchema,
  SetOperationModeResponseSchema,
  StreamEventsResponseSchema,
} from "../gen/idempotency/v1/admin_pb.js";
import type { PolicyCache } from "../policy/cache.js";
import { OPERATION_MODES, type OperationControl } from "../policy/operations.js";
import type { Db } from "../registry/db.js";
import type { ControlRow, PolicyStore } from "../registry/policy-store.js";
import type { Registry } from "../registry/registry.js";
import type { EventCursor, LoggedEvent, ReconcileInput } from "../registry/types.js";
import { Outcome } from "../gen/idempotency/v1/types_pb.js";
import { adminViews, eventFields } from "./admin-views.js";
import { requireAllTenants, scopeOf, type Caller } from "./callers.js";
import { fromProtoDuration, fromProtoOutcome, fromProtoRef, fromProtoSnapshot, fromProtoState, fromUint64, toProtoRecord } from "./convert.js";
import type { DecisionSampler } from "./event-series.js";
import { decodePageToken, encodePageToken } from "./page-token.js";
import { callerOf } from "./interceptors.js";
import { policyFromProto, publishedToProto } from "./policy-convert.js";

export interface AdminDeps {
  db: Db;
  registry: Registry;
  /** Published policies and the operations' switches. */
  store: PolicyStore;
  /**
   * Where the listings, GetPolicy and ListPolicies read: the reader's Db and a
   * PolicyStore over it when one is configured (default `db` and `store`).
   * Publishing, switches, Reconcile and the event stream stay on `db`.
   */
  reads?: Db;
  readStore?: PolicyStore;
  /** Re-read after a change, so that this replica applies it at once. */
  policies: PolicyCache;
  /** How often other replicas re-read (reported to the operator). */
  policyRefreshMs: number;
  /** This replica's Reserve decisions, sampled for GetEventSeries (none: it answers without them). */
  decisions?: DecisionSampler;
}

/** AdminService: operator actions, and the reads of the operator console (admin-views.ts); only operators call them (authorization.ts). */
export function adminService({ db, registry, store, reads = db, readStore = store, policies, policyRefreshMs, decisions }: AdminDeps): ServiceImpl<typeof AdminService> {
  /**
   * Sets switches and logs the change in one transaction, and applies it here
   * at once (elsewhere within the refresh interval). A switch applies to every
   * tenant's records: only a caller granted all tenants may set it.
   */
  const changeControl = async (caller: Caller, operation: string, apiRevision: number, change: Partial<OperationControl>, action: string) => {
    requireAllTenants(caller, action);
    validateOperationName(operation);
    validateApiRevision(apiRevision);
    if (!caller.mayOperate(operation)) refuse("PERMISSION_DENIED", `this caller is not granted operation ${operation}`);
    if (!(await policies.current(operation, apiRevision))) {
      refuse("NOT_FOUND", `${operation} API revision ${apiRevision} has no published policy`);
    }
    const control = await store.setControl({ operation, apiRevision, change, updatedBy: caller.caller, detail: { appliesEverywhereWithinMs: policyRefreshMs } });
    if (control.changed) await policies.refresh();
    return toProtoControl(control);
  };

  return {
    ...adminViews({ registry, reads, readStore, ...(decisions ? { decisions } : {}) }),

    async publishPolicy(req, ctx) {
      const caller = callerOf(ctx.values);
      // A policy decides for every tenant's requests of the operation.
      requireAllTenants(caller, "publishing a policy");
      const document = policyFromProto(req.policy);
      if (!caller.mayOperate(document.operation)) refuse("PERMISSION_DENIED", `this caller is not granted operation ${document.operation}`);
      const { stored, created } = await store.publish(document, caller.caller);
      if (created) await policies.refresh();
      return create(PublishPolicyResponseSchema, { published: publishedToProto(stored), created });
    },

    async getPolicy(req) {
      validateOperationName(req.operation);
      validateApiRevision(req.apiRevision);
      const revisions = (await readStore.list(req.operation)).filter((p) => p.document.apiRevision === req.apiRevision);
      const found = req.schemaRevision === 0 ? revisions.at(-1) : revisions.find((p) => p.document.schemaRevision === req.schemaRevision);
      if (!found) {
        refuse("NOT_FOUND", `no published policy for ${req.operation} API revision ${req.apiRevision}${req.schemaRevision ? ` schema revision ${req.schemaRevision}` : ""}`);
      }
      return create(GetPolicyResponseSchema, { published: publishedToProto(found) });
    },

    async listPolicies(req) {
      if (req.operation) validateOperationName(req.operation);
      const all = await readStore.list(req.operation || undefined);
      // Without an operation: only the newest revision of each operation.
      const shown = req.operation
        ? all
        : all.filter((p, i) => {
            const next = all[i + 1]?.document;
            return !next || next.operation !== p.document.operation || next.apiRevision !== p.document.apiRevision;
          });
      return create(ListPoliciesResponseSchema, { policies: shown.map(publishedToProto) });
    },

    async setOperationMode(req, ctx) {
      const caller = callerOf(ctx.values);
      const mode = OPERATION_MODES.word(req.mode, () => refuse("INVALID_REQUEST", `mode must be ${choice(OPERATION_MODES.words)}`));
      return create(SetOperationModeResponseSchema, { control: await changeControl(caller, req.operation, req.apiRevision, { mode }, "setting an operation's mode") });
    },

    async raiseWriterEpoch(req, ctx) {
      const caller = callerOf(ctx.values);
      const writerEpoch = fromUint64(req.writerEpoch, "writer_epoch");
      return create(RaiseWriterEpochResponseSchema, {
        control: await changeControl(caller, req.operation, req.apiRevision, { writerEpoch }, "raising a writer epoch"),
      });
    },

    async listOperationControls(_req, ctx) {
      const caller = callerOf(ctx.values);
      const controls = (await readStore.listControls()).filter((c) => caller.mayOperate(c.operation));
      return create(ListOperationControlsResponseSchema, { controls: controls.map(toProtoControl) });
    },

    async listRecords(req, ctx) {
      const caller = callerOf(ctx.values);
      const size = pageSize(req.pageSize);
      const key = decodePageToken(req.pageToken, 3);
      const views = await registry.listRecords(
        reads,
        {
          ...scopeOf(caller, req.tenant, req.operations),
          states: req.states.length > 0 ? req.states.map(fromProtoState) : undefined,
          olderThanMs: fromProtoDuration(req.olderThan, "older_than"),
          pageSize: size,
          after: key && { createdAt: key[0]!, tenant: key[1]!, operationId: key[2]! },
        },
        caller,
      );
      const last = views.at(-1);
      return create(ListRecordsResponseSchema, {
        records: views.map((view) => toProtoRecord(registry.opened(view))),
        nextPageToken: last && views.length === size ? encodePageToken([last.createdAtText, last.record.tenant, last.record.operationId]) : "",
      });
    },

    async reconcile(req, ctx) {
      const caller = callerOf(ctx.values);
      const ref = fromProtoRef(req.ref);
      const common = { ref, evidence: req.evidence, operatorName: req.operator };
      if (req.reopen && (req.outcome !== Outcome.UNSPECIFIED || req.snapshot)) {
        refuse("INVALID_REQUEST", "a reopening sets neither outcome nor snapshot: the operation runs again and its new owner completes it");
      }
      const input: ReconcileInput = req.reopen ? { ...common, reopen: true } : { ...common, outcome: fromProtoOutcome(req.outcome), snapshot: fromProtoSnapshot(req.snapshot) };
      const record = await registry.reconcile(db, input, caller);
      const view = await registry.lookupById(db, { ref }, caller);
      return create(ReconcileResponseSchema, { record: toProtoRecord({ ...view, record: registry.opened(record) }) });
    },

    async *streamEvents(req, ctx) {
      const caller = callerOf(ctx.values);
      const key = decodePageToken(req.after, 2);
      let after: EventCursor | undefined = key && { txid: key[0]!, eventId: key[1]! };
      for (;;) {
        // The caller's events (operation-level ones, of tenant "", concern every tenant of the operation), and where to resume.
        const { events, next, full } = await registry.readEvents(
          db,
          {
            ...(after ? { after } : {}),
            limit: 500,
            ...(req.tenant ? { tenant: req.tenant } : {}),
            ...(req.operation ? { operation: req.operation } : {}),
          },
          caller,
        );
        for (const event of events) yield toProtoEvent(event);
        after = next ?? after;
        if (full) continue;
        if (!req.follow) return;
        await sleep(EVENT_POLL_MS, ctx.signal);
      }
    },

    async runRetentionSweep(req, ctx) {
      const caller = callerOf(ctx.values);
      // The sweep runs over every tenant's records (and reports how many it tombstoned).
      requireAllTenants(caller, "the retention sweep");
      const batchSize = req.batchSize || 500;
      if (batchSize > 10_000) refuse("INVALID_REQUEST", "batch_size must be from 1 to 10000");
      const { tombstoned, batches } = await registry.sweepRetention(db, { batchSize, ...(req.maxBatches ? { maxBatches: req.maxBatches } : {}), caller: caller.caller });
      return create(RunRetentionSweepResponseSchema, { tombstoned: BigInt(tombstoned), batches });
    },
  };
}

/** How often a followed event stream looks for new events. */
const EVENT_POLL_MS = 500;

function toProtoControl(control: ControlRow) {
  return create(OperationControlSchema, {
    operation: control.operation,
    apiRevision: control.apiRevision,
    mode: OPERATION_MODES.number(control.mode),
    writerEpoch: BigInt(control.writerEpoch),
    updatedAt: timestampFromDate(control.updatedAt),
    updatedBy: control.updatedBy,
  });
}

function toProtoEvent(event: LoggedEvent) {
  return create(StreamEventsResponseSchema, {
    ...eventFields(event),
    generation: BigInt(event.generation ?? 0),
    cursor: encodePageToken([event.cursor.txid, event.cursor.eventId]),
  });
}

/**
 * Waits `ms`, or until the call ends. A follower sleeps on the same signal
 * every poll for as long as it follows: each wait removes its own listener
 * when its timer fires, so that listeners do not pile up on the signal.
 */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors -- the abort's own reason, whatever the aborter gave, passed on as signal.throwIfAborted() would
    if (signal.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors -- the abort's own reason, as above
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
