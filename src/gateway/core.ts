import { createHash, randomUUID } from "node:crypto";
import { downstreamKey } from "../contract/effects.js";
import { NO_FAULTS, type FaultHooks } from "../fault-hooks.js";
import type { CoordinatorClient } from "./client.js";
import {
  argumentError,
  arrayOf,
  boolean,
  bytes,
  check,
  checkOptions,
  colocatedCompletion,
  coordinatorClient,
  describe,
  either,
  func,
  httpResponse,
  logger as loggerRule,
  nonEmptyString,
  object,
  optional,
  rule,
  shape,
  string,
  subject as subjectRule,
  wholeNumber,
  withMethods,
  type CallForm,
} from "./arguments.js";
import { AnswerCache, type AnswerCacheStats } from "./answer-cache.js";
import { decisionProblem, MISCONFIGURED, refusalProblem, RETRYABLE_FAILURE, UNAVAILABLE } from "./answers.js";
import { isDefiniteFailure, MalformedJsonBody, toCoordinatorError } from "./errors.js";
import {
  headerText,
  isJsonMediaType,
  KEY_HEADER,
  outcomeForStatus,
  parseJsonBody,
  problemResponse,
  readKeyHeader,
  requestParts,
  responseOfSnapshot,
  sameStatusAndBody,
  snapshotOf,
  type Problem,
} from "./http.js";
import { IdempotencyContext } from "./context.js";
import { checkRoute, type Admission, type GatewayOptions, type GatewayRequest, type HandlerResult, type IdempotentRoute } from "./route.js";
import {
  loggerOf,
  type ColocatedCompletion,
  type GatewayLogger,
  type HttpResponse,
  type LifecycleCalls,
  type OpenTransaction,
  type ReserveInput,
  type ReserveResult,
  type Subject,
} from "./types.js";

/** What the gateway's public calls take. */
const FORMS = {
  constructor: {
    name: "new IdempotencyGateway",
    takes:
      "one object { client, colocated?, writerEpoch?, statusUrl?, problemTypeBase?, forwardHeaders?, maxBodyBytes?, waitForOwnerMs?, isDefinite?, logger?, answerCache?, clock? }",
  },
  admit: {
    name: "IdempotencyGateway.admit",
    takes: "(route: { operation, apiRevision, … }, subject: { tenant, principal } | undefined, request: { method, path, query, headers, body })",
  },
  finish: { name: "IdempotencyGateway.finish", takes: "(context, { response: { status, headers: [[name, value], …], body: bytes } } | { error })" },
  execute: { name: "IdempotencyGateway.execute", takes: "(route, subject, request, handler(context))" },
} satisfies Record<string, CallForm>;

const gatewayRequest = shape({
  method: nonEmptyString,
  path: string,
  query: string,
  headers: object,
  body: bytes,
});

const DEFAULT_PROBLEM_BASE = "urn:problem-type:idempotency:";

/**
 * The framework-agnostic core of the HTTP middleware. `admit` reserves the
 * request and either answers it (replay, conflict, in progress, refusals,
 * coordinator unreachable: never running the handler) or hands back a
 * context to run the handler with; `finish` turns the handler's response (or
 * its exception) into Complete, Release or nothing, and returns what to send.
 */
export class IdempotencyGateway {
  readonly client: CoordinatorClient;
  readonly colocated: ColocatedCompletion | undefined;
  /** Where the operation's lifecycle calls go: co-located mode's own, or the coordinator. */
  private readonly calls: LifecycleCalls;
  /** Where this gateway logs (the `logger` option, or the console), every level callable. */
  readonly logger: Required<GatewayLogger>;
  readonly maxBodyBytes: number;
  private readonly writerEpoch: number;
  private readonly waitForOwnerMs: number;
  private readonly statusUrl: (operationId: string) => string;
  private readonly problemBase: string;
  private readonly forwardHeaders: ReadonlySet<string> | undefined;
  private readonly isDefinite: (error: unknown) => boolean;
  private readonly hooks: FaultHooks;
  /** Exact repeats of finished requests, answered without asking (the `answerCache` option); undefined when off. */
  private readonly answers: AnswerCache | undefined;

  constructor(options: GatewayOptions) {
    checkOptions(FORMS.constructor, options, {
      client: coordinatorClient,
      colocated: optional(colocatedCompletion),
      writerEpoch: optional(wholeNumber(0)),
      statusUrl: optional(func),
      problemTypeBase: optional(string),
      forwardHeaders: optional(arrayOf(nonEmptyString)),
      maxBodyBytes: optional(wholeNumber(1)),
      waitForOwnerMs: optional(rule("a number of milliseconds from 0 to 30000", (v) => typeof v === "number" && v >= 0 && v <= 30_000)),
      isDefinite: optional(func),
      logger: optional(loggerRule),
      answerCache: optional(either("true, false or { maxBytes?, meterProvider? }", boolean, shape({ maxBytes: optional(wholeNumber(1)), meterProvider: optional(object) }))),
      clock: optional(withMethods("an object with a now() method", "now")),
      hooks: optional(object),
    });
    this.client = options.client;
    this.colocated = options.colocated;
    this.calls = options.colocated?.lifecycle ?? options.client;
    this.logger = loggerOf(options.logger);
    this.maxBodyBytes = options.maxBodyBytes ?? 1024 * 1024;
    this.waitForOwnerMs = options.waitForOwnerMs ?? 2000;
    this.writerEpoch = options.writerEpoch ?? 0;
    this.statusUrl = options.statusUrl ?? ((id) => `/operations/${encodeURIComponent(id)}`);
    this.problemBase = options.problemTypeBase ?? DEFAULT_PROBLEM_BASE;
    this.forwardHeaders = options.forwardHeaders ? new Set(options.forwardHeaders.map((h) => h.toLowerCase())) : undefined;
    this.isDefinite = options.isDefinite ?? isDefiniteFailure;
    this.hooks = options.hooks ?? NO_FAULTS;
    if (options.answerCache !== false) {
      const clock = options.clock;
      this.answers = new AnswerCache({ ...(options.answerCache === true ? {} : options.answerCache), ...(clock ? { now: () => clock.now() } : {}) });
    }
  }

  /** What the answer cache has done and holds (undefined when it is off: `answerCache: false`). */
  answerCacheStats(): AnswerCacheStats | undefined {
    return this.answers?.stats();
  }

  /** A problem+json response with this gateway's type URIs. */
  problem(problem: Problem): HttpResponse {
    return problemResponse(problem, this.problemBase);
  }

  /**
   * Reserve (with claim) and decide. Fails closed: when the coordinator
   * cannot be reached the answer is 503 and the handler does not run.
   */
  async admit(route: IdempotentRoute, subject: Subject | undefined, request: GatewayRequest): Promise<Admission> {
    checkRoute(FORMS.admit, route);
    check(FORMS.admit, request, "request", gatewayRequest);
    const key = readKeyHeader(request.headers[KEY_HEADER]);
    if (key === undefined || key === "") {
      if (key === undefined && route.missingKey === "run") {
        return { run: true, context: this.unguardedContext(route, subject, "", undefined, request) };
      }
      return {
        run: false,
        response: this.problem(
          key === undefined
            ? {
                status: 400,
                slug: "idempotency-key-missing",
                title: "Idempotency-Key is required",
                detail: "Send an Idempotency-Key header with a new random value (e.g. a UUIDv4) for each logical request, and the same value on its retries.",
              }
            : { status: 400, slug: "idempotency-key-invalid", title: "Idempotency-Key is malformed", detail: "Send exactly one Idempotency-Key header." },
        ),
      };
    }
    if (subject !== undefined && subjectRule(subject, "subject") !== undefined) {
      // The service's subject resolver, not the client, is wrong: 500, with the cause logged.
      this.logger.error(
        { operation: route.operation, problem: subjectRule(subject, "subject") },
        "the subject resolver returned something other than { tenant, principal } or undefined",
      );
      return { run: false, response: this.misconfigured() };
    }
    if (!subject) {
      return {
        run: false,
        response: this.problem({ status: 401, slug: "unauthenticated", title: "Not authenticated", detail: "The request carries no identity this service accepts." }),
      };
    }
    const parts = requestParts(request, this.forwardHeaders);
    // An exact repeat of a request the coordinator answered with a cacheable
    // replay: the same answer, without asking. (Its body was checked before
    // that request was sent: the same bytes pass the check below again.)
    const cacheKey = this.answers?.keyOf(subject, route.operation, route.apiRevision, key, parts);
    const cached = cacheKey === undefined ? undefined : this.answers!.answer(cacheKey);
    if (cached) return { run: false, decision: "REPLAY", response: cached };
    // A body that says it is JSON and is not is answered before anything is
    // reserved: the same request again gets the same 400, and the corrected
    // one may keep its key (a reservation would bind the key to these bytes).
    const malformed = this.malformedJsonBody(request);
    if (malformed) {
      return {
        run: false,
        response: this.malformedJsonProblem(
          malformed,
          "Nothing was done and nothing was recorded: send the request again with a valid JSON body, with the same Idempotency-Key or a new one.",
        ),
      };
    }

    if (route.localOnly && !this.colocated?.begin) {
      this.logger.error({ operation: route.operation }, "a localOnly route needs co-located mode with its whole lifecycle (a ColocatedRegistry as the gateway's `colocated`)");
      return { run: false, response: this.misconfigured() };
    }
    let reserved: ReserveResult;
    /** When the Reserve that was answered was sent: a cacheable replay is served from then on for as long as it says. */
    let sentAt = this.answers?.time() ?? 0;
    let open: OpenTransaction | undefined;
    try {
      const reserve = {
        subject,
        operation: route.operation,
        apiRevision: route.apiRevision,
        idempotencyKey: key,
        parts,
        claim: true,
        ...(route.leaseMs !== undefined ? { leaseMs: route.leaseMs } : {}),
        writerEpoch: this.writerEpoch,
        ...(route.effects && route.effects.length > 0 ? { effects: route.effects } : {}),
      };
      if (route.localOnly) {
        // Reserved inside the transaction that will hold the rows and the terminal state; kept
        // open only for an owner: any other decision (and its events) commits at once.
        ({ reserved, open } = await reserveInOpenTransaction(this.colocated!.begin!.bind(this.colocated), reserve));
      } else {
        reserved = await this.calls.reserve(reserve);
      }
      // A duplicate of a request still running: asked again, waiting for its
      // owner (its own call), so that only duplicates pay for the wait.
      const waitForOwnerMs = route.waitForOwnerMs ?? this.waitForOwnerMs;
      if (reserved.decision === "IN_PROGRESS" && reserved.enforced && waitForOwnerMs > 0) {
        sentAt = this.answers?.time() ?? 0;
        reserved = await this.calls.reserve({ ...reserve, waitForOwnerMs }).catch((error: unknown) => {
          // The coordinator has as many waiters of this gateway as it allows: the first answer stands.
          if (toCoordinatorError(error).reason === "TOO_MANY_WAITERS") return reserved;
          throw error;
        });
      }
    } catch (error) {
      return { run: false, response: this.problem(refusalProblem(toCoordinatorError(error), route, this.logger)) };
    }

    if (!reserved.enforced) {
      // Shadow mode: the decision was recorded; the request runs as before.
      // Only an ACCEPTED request owns the record (and completes it).
      return { run: true, context: this.unguardedContext(route, subject, key, reserved, request) };
    }
    if (reserved.decision === "ACCEPTED") return { run: true, context: this.ownerContext(route, subject, key, reserved, request, true, open) };
    if (reserved.decision === "REPLAY" && reserved.snapshot) {
      const response = responseOfSnapshot(reserved.snapshot, true);
      if (cacheKey !== undefined && reserved.cacheableForMs !== undefined) this.answers!.store(cacheKey, response, sentAt + reserved.cacheableForMs);
      return { run: false, decision: "REPLAY", response };
    }
    const problem = decisionProblem(reserved, route.statusUrl ?? this.statusUrl);
    if (problem) return { run: false, decision: reserved.decision, response: this.problem(problem) };
    this.logger.error({ decision: reserved.decision }, "the coordinator answered a decision without what it needs");
    return { run: false, response: this.unavailable() };
  }

  /**
   * What to send after the handler, and what to record:
   * - returned 2xx/3xx: Complete SUCCEEDED; 4xx: REJECTED, or FAILED_FINAL
   *   after an effect; 5xx: FAILED_FINAL after an effect, otherwise Release
   *   (retryable, nothing happened);
   * - an effect still unresolved (INDETERMINATE): no Complete (the registry
   *   refuses it); Abandon makes the record UNKNOWN at once and the recovery
   *   worker settles it;
   * - threw before any effect: Release, 503; threw after an effect became
   *   possible: no Complete, Abandon (UNKNOWN at once), 500;
   * - completed inside a co-located transaction: nothing left to record.
   * A Complete that fails leaves the outcome unrecorded: 503, retry later.
   */
  async finish(context: IdempotencyContext, result: HandlerResult): Promise<HttpResponse> {
    if (!(context instanceof IdempotencyContext)) throw argumentError(FORMS.finish, `context must be the one admit() handed out, got ${describe(context)}`);
    check(
      FORMS.finish,
      result,
      "result",
      rule("{ response } or { error }", (v) => typeof v === "object" && v !== null && ("response" in v || "error" in v)),
    );
    if ("response" in result) check(FORMS.finish, result.response, "result.response", httpResponse);
    context.stopLease();
    if (!context.owned) {
      return "response" in result ? result.response : this.handlerFailed(context, result.error, true);
    }
    if (context.completedWithin) {
      const stored = context.completedWithin.snapshot;
      if ("response" in result && sameStatusAndBody(result.response, stored)) return result.response;
      // The transaction stored one response and the handler sent another (or
      // threw after committing): the stored one is the truth every retry gets.
      this.logger.warn({ operationId: context.operationId }, "the handler's response differs from the one completed in its transaction; sending the stored one");
      return responseOfSnapshot(stored, false);
    }
    if ("error" in result) return this.handlerFailed(context, result.error, false);

    const response = result.response;
    if (context.effectsUnresolved && context.localOnly) {
      // A local effect's outcome is unknown: rolled back with everything else, nothing happened.
      await this.abandonQuietly(context);
      return this.problem(RETRYABLE_FAILURE);
    }
    if (context.effectsUnresolved) {
      this.logger.warn({ operationId: context.operationId, status: response.status }, "an effect's outcome is unknown: not completing; the recovery worker settles the operation");
      await this.abandonQuietly(context);
      return response.status >= 500 ? response : this.outcomePending(context);
    }
    const outcome = outcomeForStatus(response.status, context.effectPossible);
    if (outcome === "release") {
      await this.releaseQuietly(context);
      return response;
    }
    try {
      await context.complete(outcome, snapshotOf(response));
      return response;
    } catch (error) {
      const failure = toCoordinatorError(error);
      this.logger.warn({ operationId: context.operationId, outcome, reason: failure.reason, error: failure.message }, "Complete failed");
      if (failure.reason === "SNAPSHOT_TOO_LARGE" && !context.effectPossible) {
        await this.releaseQuietly(context);
        return this.problem({
          status: 500,
          slug: "outcome-not-recorded",
          title: "The response could not be recorded",
          detail: "The response is larger than this operation may store. Nothing was done.",
        });
      }
      return this.problem({
        status: 503,
        slug: "outcome-not-recorded",
        title: "The outcome could not be recorded yet",
        detail: "The request was processed but its outcome is not recorded yet. Retry with the same Idempotency-Key to get the result.",
        retryAfterSeconds: 1,
      });
    }
  }

  /** Convenience: admit, run `handler`, finish. */
  async execute(
    route: IdempotentRoute,
    subject: Subject | undefined,
    request: GatewayRequest,
    handler: (context: IdempotencyContext) => Promise<HttpResponse>,
  ): Promise<HttpResponse> {
    check(FORMS.execute, handler, "handler", func);
    const admission = await this.admit(route, subject, request);
    if (!admission.run) return admission.response;
    let result: HandlerResult;
    try {
      result = { response: await handler(admission.context) };
    } catch (error) {
      result = { error };
    }
    return this.finish(admission.context, result);
  }

  /** 500 for a gateway whose configuration is wrong (logged where it is found): nothing the client can fix. */
  misconfigured(): HttpResponse {
    return this.problem(MISCONFIGURED);
  }

  /** 503 for a coordinator that cannot be reached: fail closed. */
  unavailable(): HttpResponse {
    return this.problem(UNAVAILABLE);
  }

  /** The body's JSON error, when the request declares a JSON body (application/json, …+json) that is not. */
  private malformedJsonBody(request: GatewayRequest): MalformedJsonBody | undefined {
    if (request.body.byteLength === 0 || !isJsonMediaType(headerText(request.headers["content-type"]))) return undefined;
    try {
      parseJsonBody(request.body);
      return undefined;
    } catch (error) {
      return error as MalformedJsonBody;
    }
  }

  /** 400 `malformed-json`: what is wrong with the body and where (`jsonPath`), then `next`, what the client may do. */
  private malformedJsonProblem(malformed: MalformedJsonBody, next: string): HttpResponse {
    return this.problem({
      status: 400,
      slug: "malformed-json",
      title: "The request body is not valid JSON",
      detail: `${malformed.message}. ${next}`,
      extensions: { jsonPath: malformed.path },
    });
  }

  private async handlerFailed(context: IdempotencyContext, error: unknown, unowned: boolean): Promise<HttpResponse> {
    if (error instanceof MalformedJsonBody && !context.effectPossible) {
      // ctx.json() refused a body not declared as JSON (a declared one never
      // gets here): the client's mistake, and nothing happened. Answered 400
      // and, when owned, recorded REJECTED like any 4xx before an effect, so
      // that the same request retried is answered the same without running.
      this.logger.info({ operationId: context.operationId, operation: context.operation, path: error.path }, "the request body is not valid JSON");
      const response = this.malformedJsonProblem(
        error,
        unowned
          ? "Nothing was done: send the request again with a valid JSON body."
          : "Nothing was done. This Idempotency-Key stays bound to this request and answers it the same way: send the corrected request with a new key.",
      );
      return unowned ? response : this.finish(context, { response });
    }
    // The error itself, with its stack: pino serializes `err`, and console prints it whole.
    this.logger.error({ operationId: context.operationId, operation: context.operation, err: error }, "the handler threw");
    if (unowned) {
      return this.problem({ status: 500, slug: "outcome-pending", title: "Internal error", detail: "The request failed." });
    }
    if (!context.effectPossible || context.localOnly) {
      // Nothing happened downstream (a local-only route's effects roll back with its
      // transaction): hand the reservation back, or roll it back; the retry runs it anew.
      await this.releaseQuietly(context);
      return this.problem(RETRYABLE_FAILURE);
    }
    await this.abandonQuietly(context);
    return this.outcomePending(context);
  }

  private outcomePending(context: IdempotencyContext): HttpResponse {
    return this.problem({
      status: 500,
      slug: "outcome-pending",
      title: "The outcome of the request is not known yet",
      detail: "The request may have taken effect. It will be settled; retry later with the same Idempotency-Key to get its result. It will not run twice.",
      extensions: { operationId: context.operationId },
    });
  }

  private async releaseQuietly(context: IdempotencyContext): Promise<void> {
    try {
      await context.release();
    } catch (error) {
      // Unreleased, the record waits for its lease to end; then the next retry takes it over.
      this.logger.warn({ operationId: context.operationId, error: (error as Error).message }, "Release failed; the lease will end on its own");
    }
  }

  /**
   * This owner will not finish an operation whose effect may have happened:
   * it hands it to recovery now instead of leaving it until the lease ends.
   */
  private async abandonQuietly(context: IdempotencyContext): Promise<void> {
    try {
      await context.abandon();
    } catch (error) {
      // Not handed over, the record becomes UNKNOWN when its lease ends; recovery starts then.
      this.logger.warn({ operationId: context.operationId, error: (error as Error).message }, "Abandon failed; recovery starts when the lease ends");
    }
  }

  private ownerContext(
    route: IdempotentRoute,
    subject: Subject,
    key: string,
    reserved: ReserveResult,
    request: GatewayRequest,
    enforced = true,
    open?: OpenTransaction,
  ): IdempotencyContext {
    const context = new IdempotencyContext(
      {
        calls: open?.calls ?? this.calls,
        ...(open ? { open } : {}),
        colocated: this.colocated,
        ref: { tenant: subject.tenant, operationId: reserved.operationId },
        generation: reserved.generation,
        owned: true,
        declared: reserved.attempts ?? [],
        isDefinite: this.isDefinite,
        logger: this.logger,
        hooks: this.hooks,
      },
      { route, subject, key, decision: reserved.decision, enforced, body: request.body },
    );
    // A record in a transaction still open is seen by nobody else: no lease to keep.
    if (!open) context.keepLease({ leaseMs: route.leaseMs, expiresAt: reserved.leaseExpiresAt });
    return context;
  }

  /** A context that does not own the record: shadow mode (owning only when ACCEPTED), or no key. */
  private unguardedContext(route: IdempotentRoute, subject: Subject | undefined, key: string, reserved: ReserveResult | undefined, request: GatewayRequest): IdempotencyContext {
    if (reserved?.decision === "ACCEPTED" && subject) return this.ownerContext(route, subject, key, reserved, request, false);
    const tenant = subject?.tenant ?? "";
    const operationId = reserved?.operationId ?? "";
    return new IdempotencyContext(
      {
        calls: this.calls,
        colocated: this.colocated,
        ref: { tenant, operationId },
        generation: 0,
        owned: false,
        isDefinite: this.isDefinite,
        logger: this.logger,
        // The key the coordinator would give for this operation's effect, so
        // that shadow-mode retries still deduplicate downstream; without an
        // operation (no key, or a conflict) a fresh one: nothing to deduplicate with.
        unownedKey: (effect) => (operationId ? downstreamKey(tenant, operationId, effect) : shortKey(randomUUID(), effect)),
      },
      { route, subject, key, decision: reserved?.decision, enforced: false, body: request.body },
    );
  }
}

/**
 * Reserve inside a transaction opened for a local-only route: kept open for
 * an owner (ACCEPTED, enforced), which runs its rows and completes in it;
 * any other decision commits at once (a conflict's event, a record seen
 * going UNKNOWN), and a refusal rolls it back.
 */
async function reserveInOpenTransaction(begin: () => Promise<OpenTransaction>, input: ReserveInput): Promise<{ reserved: ReserveResult; open: OpenTransaction | undefined }> {
  const open = await begin();
  let reserved: ReserveResult;
  try {
    reserved = await open.calls.reserve(input);
  } catch (error) {
    await open.rollback();
    throw error;
  }
  if (reserved.decision === "ACCEPTED" && reserved.enforced) return { reserved, open };
  await open.commit();
  return { reserved, open: undefined };
}

function shortKey(seed: string, effect: string): string {
  return createHash("sha256").update(`${seed}\0${effect}`).digest("base64url");
}
