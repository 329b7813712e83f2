import type http from "node:http";
import { IdempotencyError, REFUSALS, STATUS_CODES } from "../contract/errors.js";
import type { Db } from "../registry/db.js";
import type { PolicyStore } from "../registry/policy-store.js";
import type { Registry } from "../registry/registry.js";
import type { RecordState } from "../registry/types.js";
import { reply, type AdminRoute } from "./admin-http.js";
import { requireRole, type Caller, type Callers } from "./callers.js";
import { CONSOLE_PAGE } from "./console-page.js";

const STATES: readonly RecordState[] = ["RESERVED", "EXECUTING", "SUCCEEDED", "FAILED_FINAL", "REJECTED", "UNKNOWN"];
const MAX_BODY = 1024 * 1024;

/**
 * The operator console on the admin port: `/console` is a self-contained page;
 * `/console/api/*` are the JSON endpoints it calls, each authenticated with an
 * operator's bearer token exactly like the RPCs (the page keeps the token in
 * the tab's session storage only).
 */
export function consoleRoutes(deps: {
  db: Db;
  /** Where the console's views read (the reader's Db when one is configured; default `db`); reconciling writes on `db`. */
  reads?: Db;
  registry: Registry;
  /** Read for the operations' switches (over `reads`). */
  store: PolicyStore;
  callers: Callers;
}): AdminRoute {
  const { db, reads = db, registry, store, callers } = deps;
  return async (req, res, path) => {
    if (path === "/console" || path === "/console/") {
      res.writeHead(200, {
        "content-type": "text/html; charset=utf-8",
        "cache-control": "no-store",
        // Everything is inline and same-origin; nothing is loaded from elsewhere.
        "content-security-policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        "x-frame-options": "DENY",
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
    const tenants = caller.tenants === "*" ? undefined : [...caller.tenants];
    const operations = caller.operations === "*" ? undefined : [...caller.operations];
    const visible = (tenant: string, operation: string | null) => (tenant === "" || caller.mayUseTenant(tenant)) && (!operation || caller.mayOperate(operation));
    if (endpoint === "overview" && req.method === "GET") {
      // Counts, ages and conflicts of the caller's tenants and operations only.
      const scope = { ...(tenants ? { tenants } : {}), ...(operations ? { operations } : {}) };
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
    if (endpoint === "records" && req.method === "GET") {
      const state = new URL(req.url ?? "", "http://admin").searchParams.get("state") ?? "UNKNOWN";
      if (!STATES.includes(state as RecordState)) return reply(res, 400, { reason: "INVALID_REQUEST", message: `state must be one of ${STATES.join(", ")}` });
      const views = await registry.listRecords(reads, { states: [state as RecordState], ...(tenants ? { tenants } : {}), ...(operations ? { operations } : {}), pageSize: 200 });
      return reply(res, 200, {
        records: views.map(({ record, attempts }) => ({
          tenant: record.tenant,
          operationId: record.operationId,
          operation: `${record.operation}@${record.apiRevision}`,
          principal: record.principal,
          state: record.state,
          generation: record.generation,
          recovering: record.recovering,
          createdAt: record.createdAt,
          attempts: attempts.map((a) => ({
            number: a.attemptNumber,
            effect: a.effect,
            provider: a.provider,
            status: a.status,
            downstreamKey: a.downstreamKey,
            handle: a.providerHandle,
          })),
        })),
      });
    }
    if (endpoint === "reconcile" && req.method === "POST") {
      const input = (await jsonBody(req)) as Record<string, unknown>;
      const text = (name: string) => (typeof input[name] === "string" ? input[name] : "");
      const outcome = text("outcome");
      if (outcome !== "SUCCEEDED" && outcome !== "FAILED_FINAL") return reply(res, 400, { reason: "INVALID_REQUEST", message: "outcome must be SUCCEEDED or FAILED_FINAL" });
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
