import type http from "node:http";
import type { Counter } from "prom-client";
import { IdempotencyError, REFUSALS, STATUS_CODES } from "../contract/errors.js";
import { bodyLength } from "../crypto/sealing.js";
import type { Db } from "../registry/db.js";
import type { PolicyStore } from "../registry/policy-store.js";
import type { Registry } from "../registry/registry.js";
import type { LoggedEvent, RecordState, RecordView, StoredAttempt, StoredRecord, ViewScope } from "../registry/types.js";
import { AdminService } from "../gen/idempotency/v1/admin_pb.js";
import { reply, type AdminRoute } from "./admin-http.js";
import { requireRole, type Caller, type Callers } from "./callers.js";
import { CHART_WINDOWS, DecisionSampler, eventLogCharts } from "./event-series.js";
import { CONSOLE_PAGE } from "./console-page.js";
import type { DualHandler } from "./listener.js";
import { decodePageToken, encodePageToken } from "./page-token.js";

const STATES: readonly RecordState[] = ["RESERVED", "EXECUTING", "SUCCEEDED", "FAILED_FINAL", "REJECTED", "UNKNOWN"];
const MAX_BODY = 1024 * 1024;
/** Most records a listing by state returns at once (the page asks for more with its token). */
const MAX_PAGE = 100;
/** Most records the UNKNOWN queue shows: the longest UNKNOWN. */
const QUEUE_LIMIT = 200;
/** Most events a record's timeline shows: its newest. */
const TIMELINE_LIMIT = 500;

/**
 * The operator console on the admin port: `/console` is a self-contained page;
 * `/console/api/*` are the JSON endpoints it calls, each authenticated with an
 * operator's bearer token exactly like the RPCs (the page keeps the token in
 * the tab's session storage only). Everything an endpoint answers is of the
 * caller's granted tenants and operations: the scope is applied in the
 * registry's statements, before any limit, and each record is checked again.
 *
 * - `GET overview`: records per state, the oldest UNKNOWN age, the operations' modes, recent conflicts;
 * - `GET records?state=&pageToken=`: records by state (or of every state), newest first, a page at a time;
 * - `POST search`: `{operationId}`, or `{tenant, principal, operation[@apiRevision], idempotencyKey}`
 *   (the scope hashed by the registry's own lookup); a POST so that keys stay out of URLs and logs;
 * - `GET unknown`: the UNKNOWN queue, longest UNKNOWN first, with each record's age and attempts;
 * - `GET record?tenant=&operationId=`: one record with its generations, attempts, snapshot metadata and timeline;
 * - `GET charts?minutes=`: the event log's series over the last minutes (and this replica's decisions);
 * - `POST reconcile`: settles an UNKNOWN record (on the primary).
 */
export function consoleRoutes(deps: {
  db: Db;
  /** Where the console's views read (the reader's Db when one is configured; default `db`); reconciling writes on `db`. */
  reads?: Db;
  registry: Registry;
  /** Read for the operations' switches (over `reads`). */
  store: PolicyStore;
  callers: Callers;
  /** This replica's count of Reserve decisions (metrics), for the decisions the event log does not hold. */
  decisions?: Counter<"operation" | "decision" | "enforced">;
}): AdminRoute {
  const { db, reads = db, registry, store, callers } = deps;
  const sampler = deps.decisions ? new DecisionSampler(deps.decisions) : undefined;
  return async (req, res, path) => {
    if (path === "/console" || path === "/console/") {
      res.writeHead(200, {
        "content-type": "text/html; charset=utf-8",
        "cache-control": "no-store",
        // Everything is inline and same-origin; nothing is loaded from elsewhere.
        "content-security-policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        "x-frame-options": "DENY",
        "referrer-policy": "no-referrer",
      });
      res.end(CONSOLE_PAGE);
      return true;
    }
    if (!path.startsWith("/console/api/")) return false;
    try {
      const caller = callers.authenticate(req.headers.authorization ?? null);
      requireRole(caller, "operator");
      await api(path.slice("/console/api/".length), req, res, caller);
    } catch (error) {
      if (!(error instanceof IdempotencyError)) throw error;
      reply(res, STATUS_CODES[REFUSALS[error.reason].code].http, { reason: error.reason, message: error.message });
    }
    return true;
  };

  async function api(endpoint: string, req: http.IncomingMessage, res: http.ServerResponse, caller: Caller): Promise<void> {
    const scope: ViewScope = {
      ...(caller.tenants === "*" ? {} : { tenants: [...caller.tenants] }),
      ...(caller.operations === "*" ? {} : { operations: [...caller.operations] }),
    };
    const visible = (tenant: string, operation: string | null) => (tenant === "" || caller.mayUseTenant(tenant)) && (!operation || caller.mayOperate(operation));
    const mine = (views: RecordView[]) => views.filter((v) => visible(v.record.tenant, v.record.operation)).map(summary);
    const query = new URL(req.url ?? "", "http://admin").searchParams;
    const invalid = (message: string) => reply(res, 400, { reason: "INVALID_REQUEST", message });
    const route = `${req.method ?? "GET"} ${endpoint}`;

    if (route === "GET overview") {
      const [census, controls, conflicts] = await Promise.all([
        registry.census(reads, scope),
        store.listControls(),
        registry.recentEvents(reads, { ...scope, kinds: ["CONFLICT"], limit: 20 }),
      ]);
      return reply(res, 200, {
        records: Object.fromEntries(STATES.map((state) => [state, census.byState.get(state) ?? 0])),
        oldestUnknownSeconds: Math.round(census.oldestUnknownSeconds),
        controls: controls.filter((c) => caller.mayOperate(c.operation)),
        conflicts: conflicts
          .filter((e) => visible(e.tenant, e.operation))
          .map((e) => ({ at: e.at, tenant: e.tenant, operationId: e.operationId, operation: e.operation, caller: e.caller })),
      });
    }
    if (route === "GET records") {
      const state = query.get("state") ?? "";
      if (state !== "" && !STATES.includes(state as RecordState)) return invalid(`state must be one of ${STATES.join(", ")}, or empty for every state`);
      const pageSize = Math.min(Math.max(Number(query.get("limit")) || 50, 1), MAX_PAGE);
      const before = decodePageToken(query.get("pageToken") ?? "", 3);
      const views = await registry.newestRecords(reads, {
        ...scope,
        ...(state ? { states: [state as RecordState] } : {}),
        pageSize,
        ...(before ? { before: { createdAt: before[0]!, tenant: before[1]!, operationId: before[2]! } } : {}),
      });
      const last = views.at(-1);
      return reply(res, 200, {
        records: mine(views),
        ...(last && views.length === pageSize ? { nextPageToken: encodePageToken([last.createdAtText, last.record.tenant, last.record.operationId]) } : {}),
      });
    }
    if (route === "POST search") {
      const input = (await jsonBody(req)) as Record<string, unknown>;
      const text = (name: string) => (typeof input[name] === "string" ? input[name].trim() : "");
      if (text("operationId")) return reply(res, 200, { records: mine(await registry.recordsById(reads, text("operationId"), scope.tenants)) });
      const [operation = "", revision] = text("operation").split("@");
      if (!text("tenant") || !text("principal") || !operation || !text("idempotencyKey")) {
        return invalid("search by an operation id, or by a scope: tenant, principal, operation (name@apiRevision) and idempotency key");
      }
      if (revision !== undefined && !/^[1-9][0-9]{0,8}$/.test(revision)) return invalid("the API revision after @ must be a positive number");
      // Without a revision, the scope at each published revision of the operation: the key is hashed with it.
      const revisions = revision ? [Number(revision)] : [...new Set((await store.list(operation)).map((p) => p.document.apiRevision))];
      const found: RecordView[] = [];
      for (const apiRevision of revisions.length > 0 ? revisions : [1]) {
        const lookup = { subject: { tenant: text("tenant"), principal: text("principal") }, operation, apiRevision, idempotencyKey: text("idempotencyKey") };
        try {
          found.push(await registry.lookupByScope(reads, lookup, caller));
        } catch (error) {
          if (!(error instanceof IdempotencyError) || error.reason !== "NOT_FOUND") throw error;
        }
      }
      return reply(res, 200, { records: mine(found) });
    }
    if (route === "GET unknown") {
      const views = (await registry.unknownQueue(reads, { ...scope, limit: QUEUE_LIMIT })).filter((v) => visible(v.record.tenant, v.record.operation));
      return reply(res, 200, { limit: QUEUE_LIMIT, records: views.map((v) => ({ ...summary(v), unknownSince: v.record.updatedAt, ageSeconds: ageOf(v.record) })) });
    }
    if (route === "GET record") {
      const ref = { tenant: query.get("tenant") ?? "", operationId: query.get("operationId") ?? "" };
      return reply(res, 200, detail(await registry.recordHistory(reads, ref, caller, TIMELINE_LIMIT)));
    }
    if (route === "GET charts") {
      const minutes = Number(query.get("minutes") ?? 10);
      if (!CHART_WINDOWS.includes(minutes)) return invalid(`minutes must be one of ${CHART_WINDOWS.join(", ")}`);
      const { grid, now, series } = await eventLogCharts(registry, reads, scope, minutes);
      // This replica's metrics count decisions of every tenant: shown only to operators granted them all.
      const replica = sampler && caller.tenants === "*" ? await sampler.series(grid, (operation) => caller.mayOperate(operation)) : undefined;
      return reply(res, 200, { minutes, ...grid, now: new Date(now * 1000).toISOString(), series, ...(replica ? { replica } : {}) });
    }
    if (route === "POST reconcile") {
      const input = (await jsonBody(req)) as Record<string, unknown>;
      const text = (name: string) => (typeof input[name] === "string" ? input[name] : "");
      const outcome = text("outcome");
      if (outcome !== "SUCCEEDED" && outcome !== "FAILED_FINAL") return invalid("outcome must be SUCCEEDED or FAILED_FINAL");
      const record = await registry.reconcile(
        db,
        {
          ref: { tenant: text("tenant"), operationId: text("operationId") },
          outcome,
          snapshot: {
            statusCode: Number(input.statusCode),
            mediaType: text("mediaType") || "application/json",
            location: "",
            businessVersion: "",
            headers: [],
            body: new TextEncoder().encode(text("body")),
          },
          evidence: text("evidence"),
          operatorName: text("operator"),
        },
        caller,
      );
      return reply(res, 200, { operationId: record.operationId, state: record.state, generation: record.generation });
    }
    reply(res, 404, { reason: "NOT_FOUND", message: "no such console endpoint" });
  }
}

/**
 * AdminService for the console page, on the admin port under `/console/`
 * (`/console/idempotency.v1.AdminService/<Method>`): the same service as on
 * the RPC port, with the same interceptors, so that the page calls it on its
 * own origin.
 */
export function consoleRpcRoute(rpc: DualHandler): AdminRoute {
  const prefix = `/console/${AdminService.typeName}/`;
  const methods = new Set(AdminService.methods.map((method) => method.name));
  return (req, res, path) => {
    if (!path.startsWith(prefix) || !methods.has(path.slice(prefix.length))) return Promise.resolve(false);
    // The RPC handler routes by the path the RPC port serves the method at.
    req.url = req.url!.slice("/console".length);
    rpc(req, res);
    return Promise.resolve(true);
  };
}

/** A record as the console's lists show it. */
function summary({ record, attempts }: RecordView) {
  return {
    tenant: record.tenant,
    operationId: record.operationId,
    operation: `${record.operation}@${record.apiRevision}`,
    principal: record.principal,
    state: record.state,
    generation: record.generation,
    recovering: record.recovering,
    tombstoned: record.tombstonedAt !== null,
    createdAt: record.createdAt,
    updatedAt: record.updatedAt,
    attempts: attempts.map(attemptOf),
  };
}

function attemptOf(a: StoredAttempt) {
  return {
    number: a.attemptNumber,
    generation: a.generation,
    effect: a.effect,
    provider: a.provider,
    status: a.status,
    downstreamKey: a.downstreamKey,
    handle: a.providerHandle,
    createdAt: a.createdAt,
    resolvedAt: a.resolvedAt,
  };
}

/** Seconds since a record last changed, in database time: for an UNKNOWN one, how long it has been UNKNOWN. */
function ageOf(record: StoredRecord): number {
  return Math.max(0, Math.round((record.dbNow.getTime() - record.updatedAt.getTime()) / 1000));
}

/** A record's page: the record, its lease and owner, its snapshot's metadata, its generations and its timeline. */
function detail(view: RecordView & { events: Array<Omit<LoggedEvent, "cursor">> }) {
  const { record, attempts, events } = view;
  const generations = generationsOf(events, attempts);
  const current = generations.find((g) => g.generation === record.generation);
  const unfinished = record.state === "RESERVED" || record.state === "EXECUTING";
  return {
    ...summary(view),
    apiRevision: record.apiRevision,
    effectPossible: record.effectPossible,
    writerEpoch: record.writerEpoch,
    completedAt: record.completedAt,
    retainUntil: record.retainUntil,
    tombstonedAt: record.tombstonedAt,
    readAt: record.dbNow,
    lease: record.leaseExpiresAt ? { expiresAt: record.leaseExpiresAt, live: record.leaseExpiresAt > record.dbNow } : null,
    // Who holds an unfinished record: the caller whose acceptance, claim or takeover began its generation.
    owner: unfinished && record.leaseExpiresAt && current?.caller ? { generation: record.generation, caller: current.caller, since: current.since } : null,
    snapshot: snapshotFacts(record),
    generations,
    events: events.map((e) => ({ at: e.at, kind: e.kind, generation: e.generation, state: e.state, caller: e.caller, detail: e.detail })),
    eventsLimit: TIMELINE_LIMIT,
  };
}

/**
 * What the console shows of a stored response: its status, media type, body
 * size, header names, whether its body is sealed (and under which key id),
 * and its digest. Never the body, the header values or the location: they
 * are the end user's data as the service answered it (an account, an
 * address, a token), which settling a record never needs (an operator goes
 * by the effect attempts and the downstream system), and a browser page is
 * where data leaks most easily: screenshots, shared screens, a tab left
 * open. An operator who must read a body has `idemctl lookup`, a deliberate
 * act with the same grant. Nor does the page open sealed bodies: a record
 * whose key has left the ring still shows.
 */
function snapshotFacts(record: StoredRecord) {
  const snapshot = record.snapshot;
  if (!snapshot) return null;
  return {
    statusCode: record.tombstonedAt ? null : snapshot.statusCode,
    mediaType: snapshot.mediaType,
    bodyBytes: record.tombstonedAt ? null : bodyLength(snapshot.body, snapshot.keyId),
    headerNames: snapshot.headers.map(([name]) => name),
    sealedWith: snapshot.keyId,
    // Base64, as the RPCs and idemctl print digests: one spelling to compare.
    digest: Buffer.from(snapshot.digest).toString("base64"),
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

async function jsonBody(req: http.IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY) throw new IdempotencyError("INVALID_REQUEST", "the request body is too large");
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    throw new IdempotencyError("INVALID_REQUEST", "the request body must be JSON");
  }
}
