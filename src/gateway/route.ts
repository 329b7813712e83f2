import type { Decision } from "../contract/words.js";
import { checkOptions, routeFields, type CallForm } from "./arguments.js";
import type { IdempotencyContext } from "./context.js";
import type { FaultHooks } from "../fault-hooks.js";
import type { Clock } from "../clock.js";
import type { AnswerCacheOptions } from "./answer-cache.js";
import type { CoordinatorClient } from "./client.js";
import type { ColocatedCompletion, GatewayLogger, HttpResponse, Subject } from "./types.js";

/**
 * What the gateway (src/gateway/core.ts) is configured with, and what a
 * framework adapter hands it: the route, the request as the gateway sees
 * it, and what comes back.
 */

/** How an IdempotencyGateway is set up. */
export interface GatewayOptions {
  /** The coordinator (gateway-role token). */
  client: CoordinatorClient;
  /**
   * Co-located mode: complete inside the service's own transactions
   * (`ctx.transaction`); a `ColocatedRegistry` of `idempotency-coordinator/colocated`.
   */
  colocated?: ColocatedCompletion;
  /** The writer epoch this deployment was built with (rollback fence; default 0). */
  writerEpoch?: number;
  /**
   * Where a client can watch an operation that is still in progress; sent as
   * `Location` and `Link: <…>; rel="monitor"` with 409. Default
   * `/operations/<operation id>` (mount a status route there, e.g. with `Lookup`).
   */
  statusUrl?: (operationId: string) => string;
  /** Prefix of problem `type` URIs (default `urn:problem-type:idempotency:`). */
  problemTypeBase?: string;
  /**
   * Request headers forwarded to the coordinator for the fingerprint (only
   * those the policy names count). Default: every header except credentials,
   * cookies, hop-by-hop and per-delivery ones, and the key itself.
   */
  forwardHeaders?: readonly string[];
  /** Largest request body read, in bytes (default 1 MiB); larger ones get 413. */
  maxBodyBytes?: number;
  /**
   * A request whose key's first request is still running waits up to this
   * long for it on the coordinator and is answered with its response (or
   * runs, if the first let go), instead of 409 and a retry (default 2000 ms;
   * 0 answers 409 at once; at most 30 s).
   */
  waitForOwnerMs?: number;
  /** Whether an effect's error means "definitely nothing happened" (default: `DefiniteFailure`). */
  isDefinite?: (error: unknown) => boolean;
  /**
   * Where warnings and errors go: a misconfigured gateway, a handler that
   * threw, a Complete, Release or Abandon that failed. Default `console`
   * (consoleLogger); a pino logger fits (GatewayLogger).
   */
  logger?: GatewayLogger;
  /**
   * Answers exact repeats of finished requests from memory, without asking
   * the coordinator, for as long as its REPLAY said they may be (at most its
   * IDEM_ANSWER_CACHE_MAX_AGE_MS, 30 s by default): on by default, bounded by
   * `maxBytes` (16 MiB); `false` asks the coordinator every time.
   */
  answerCache?: boolean | AnswerCacheOptions;
  /** The time the answer cache's entries are judged by (default a monotonic clock); tests give one they move by hand. */
  clock?: Pick<Clock, "now">;
  /** Fault tests' hooks at exact steps (src/fault-hooks.ts); none by default. */
  hooks?: FaultHooks;
}

/** One idempotent route. */
export interface IdempotentRoute {
  /** The operation, e.g. `payments.create`, as published in its policy. */
  operation: string;
  /** The API major revision of the route. */
  apiRevision: number;
  /** The lease to ask for (default: the policy's). */
  leaseMs?: number;
  /** Overrides the gateway's `statusUrl` for this route. */
  statusUrl?: (operationId: string) => string;
  /** Overrides the gateway's `waitForOwnerMs` for this route (a handler known to run long may say 0). */
  waitForOwnerMs?: number;
  /**
   * Effects the handler calls (`ctx.effect` with these names), registered
   * with Reserve instead of one RecordEffectAttempt each: one RPC and one
   * commit fewer per effect. An effect is possible from the acceptance on:
   * one the handler did not call is resolved NO_EFFECT with the Complete (or
   * before a Release); should the process die first, recovery decides.
   */
  effects?: ReadonlyArray<{ effect: string; provider: string }>;
  /**
   * Co-located mode with its whole lifecycle (a ColocatedRegistry): the
   * handler's effects are all local, rows of the registry's database written
   * through `ctx.transaction`, and nothing it does reaches another system.
   * Reserve, the rows, the effects' attempts and the terminal state then
   * commit in one transaction, or none of them does: a handler that fails
   * (or a 5xx with nothing possible) rolls all of it back, leaving no
   * record, and the retry runs anew. Refused without such a registry.
   */
  localOnly?: boolean;
  /**
   * A request without Idempotency-Key: `reject` (400, the default) or `run`
   * (unguarded, e.g. while clients adopt keys during a shadow rollout).
   */
  missingKey?: "reject" | "run";
}

/** How a route finds the end user: from the service's own authentication, never the body. */
export type SubjectResolver<Req> = (request: Req) => Subject | undefined | Promise<Subject | undefined>;

/** A request as the gateway sees it, whatever the framework. */
export interface GatewayRequest {
  method: string;
  /** The path without the query. */
  path: string;
  /** The raw query string without `?`. */
  query: string;
  /** Headers with lower-case names (Node's `IncomingHttpHeaders` fits). */
  headers: Record<string, string | readonly string[] | undefined>;
  body: Uint8Array;
}

/** What to do with a request: answer it now, or run the handler with a context. */
export type Admission = { run: false; response: HttpResponse; decision?: Decision } | { run: true; context: IdempotencyContext };

/** How a handler ended: with a response (captured from the framework), or by throwing. */
export type HandlerResult = { response: HttpResponse } | { error: unknown };

/** Checks a route given to the gateway or an adapter (`extra`: the adapter's own fields, e.g. `subject`). */
export function checkRoute(call: CallForm, route: unknown, extra: Record<string, (value: unknown, at: string) => string | undefined> = {}): void {
  checkOptions(call, route, { ...routeFields, ...extra }, "route");
}
