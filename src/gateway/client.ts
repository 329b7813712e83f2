import { context, propagation } from "@opentelemetry/api";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, durationMs, timestampDate, type Duration } from "@bufbuild/protobuf/wkt";
import { Code, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import { MAX_BATCH_CALLS } from "../contract/batch.js";
import { CLAIM_MODES, DECISIONS, EFFECT_STATUSES, OUTCOMES, RECORD_STATES } from "../contract/words.js";
import {
  AbandonRequestSchema,
  type BatchCall,
  type BatchResult,
  ClaimRequestSchema,
  CompleteRequestSchema,
  CoordinatorService,
  LookupRequestSchema,
  RecordEffectAttemptRequestSchema,
  ReleaseRequestSchema,
  RenewLeaseRequestSchema,
  ReserveRequestSchema,
  ResolveEffectAttemptRequestSchema,
} from "../gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../gen/idempotency/v1/types_pb.js";
import {
  argumentError,
  arrayOf,
  boolean,
  bytes,
  checkInput,
  checkOptions,
  claimMode,
  either,
  func,
  isObject,
  logger as loggerRule,
  nonEmptyString,
  nonNegativeNumber,
  object,
  oneOf,
  operationRef,
  optional,
  outcome,
  positiveNumber,
  shape,
  snapshot as snapshotRule,
  string,
  subject as subjectRule,
  effectStatus,
  wholeNumber,
  type CallForm,
  type Rule,
} from "./arguments.js";
import { Batcher, type AttemptOptions } from "./batcher.js";
import { CoordinatorError, toCoordinatorError } from "./errors.js";
import { directGrpcTransport } from "./transport.js";
import { answered, dateField, fromAttempt, fromRecord, fromSnapshot } from "./wire.js";
import {
  loggerOf,
  type ClaimInput,
  type ClaimResult,
  type CompleteInput,
  type CompleteResult,
  type EffectAttempt,
  type GatewayLogger,
  type HandOverResult,
  type ListRecoverableInput,
  type ListRecoverableResult,
  type LookupInput,
  type OperationRecord,
  type OwnedRef,
  type RecordEffectAttemptInput,
  type RenewLeaseInput,
  type ReserveInput,
  type ResolveEffectAttemptInput,
  type ReserveResult,
  type SdkLogger,
} from "./types.js";

const WITH_CALL_OPTIONS = " (and call options { timeoutMs?, signal? })";
/** What each public call of the client takes, and its positional form before idempotency-gateway 0.1.0. */
const FORMS = {
  constructor: {
    name: "new CoordinatorClient",
    takes:
      "one object { baseUrl, token?, timeoutMs?, retry?, connections?, replicaBackoffMs?, idleConnectionTimeoutMs?, interceptors?, logger?, batching? } (or { transport, … } instead of baseUrl)",
  },
  reserve: {
    name: "CoordinatorClient.reserve",
    takes: `one object { subject, operation, apiRevision, idempotencyKey, parts, claim?, leaseMs?, writerEpoch?, waitForOwnerMs?, effects? }${WITH_CALL_OPTIONS}`,
  },
  claim: { name: "CoordinatorClient.claim", takes: `one object { ref, mode, generation, leaseMs?, writerEpoch? }${WITH_CALL_OPTIONS}` },
  renewLease: {
    name: "CoordinatorClient.renewLease",
    takes: `one object { ref, generation, leaseMs? }${WITH_CALL_OPTIONS}`,
    earlier: "renewLease(ref, generation, leaseMs)",
  },
  recordEffectAttempt: {
    name: "CoordinatorClient.recordEffectAttempt",
    takes: `one object { ref, generation, effect, provider }${WITH_CALL_OPTIONS}`,
    earlier: "recordEffectAttempt(ref, generation, effect, provider)",
  },
  resolveEffectAttempt: {
    name: "CoordinatorClient.resolveEffectAttempt",
    takes: `one object { ref, generation, attemptNumber, status, providerHandle? }${WITH_CALL_OPTIONS}`,
    earlier: "resolveEffectAttempt(ref, generation, attemptNumber, status, providerHandle)",
  },
  complete: {
    name: "CoordinatorClient.complete",
    takes: `one object { ref, generation, outcome, snapshot, resolutions? }${WITH_CALL_OPTIONS}`,
    earlier: "complete(ref, generation, outcome, snapshot)",
  },
  release: { name: "CoordinatorClient.release", takes: `one object { ref, generation }${WITH_CALL_OPTIONS}`, earlier: "release(ref, generation)" },
  abandon: { name: "CoordinatorClient.abandon", takes: `one object { ref, generation }${WITH_CALL_OPTIONS}`, earlier: "abandon(ref, generation)" },
  lookup: { name: "CoordinatorClient.lookup", takes: `one object { ref, subject? } or { scope: { subject, operation, apiRevision, idempotencyKey } }${WITH_CALL_OPTIONS}` },
  listRecoverable: { name: "CoordinatorClient.listRecoverable", takes: `one object { tenant?, operations?, pageSize?, pageToken? } or nothing${WITH_CALL_OPTIONS}` },
} satisfies Record<string, CallForm>;

const generation = wholeNumber(0);
const owned: Record<string, Rule> = { ref: operationRef, generation };
const leaseMs = optional(positiveNumber);
const writerEpoch = optional(wholeNumber(0));

/** How transport failures are retried. */
export interface RetryOptions {
  /** Most attempts of one call, the first included (default 4). */
  attempts?: number;
  /** First backoff; doubles each time, with full jitter (default 50 ms). */
  baseDelayMs?: number;
  /** Longest backoff (default 1000 ms). */
  maxDelayMs?: number;
}

export interface CoordinatorClientOptions {
  /**
   * The coordinator's RPC address, e.g. `http://127.0.0.1:7070` (gRPC over
   * HTTP/2 cleartext, or https), or the addresses of several replicas: calls
   * go round them, and a replica whose connection failed is passed over for
   * `replicaBackoffMs` while another one is up, so that the retry of a call
   * it failed goes to the next replica.
   */
  baseUrl?: string | readonly string[];
  /** How long a replica whose connection failed is passed over (default 1000 ms); only with several addresses. */
  replicaBackoffMs?: number;
  /** The caller's bearer token (a gateway or worker token minted with `idemctl token`). */
  token?: string;
  /** Deadline of every attempt of every call, unless a call names its own (default 2000 ms). */
  timeoutMs?: number;
  retry?: RetryOptions;
  /**
   * HTTP/2 connections to spread calls over (default 1, and at least one per
   * address of `baseUrl`). One connection multiplexes many concurrent calls;
   * more spread the load of very busy gateways over several coordinator
   * replicas behind a load balancer.
   */
  connections?: number;
  /** Close an HTTP/2 connection idle this long (default 60 s); the next call reconnects. */
  idleConnectionTimeoutMs?: number;
  /** A ready transport instead of `baseUrl` (tests: `createRouterTransport`). */
  transport?: Transport;
  /** Connect interceptors for every RPC (headers, logging, metrics of your own), as any connect-es client takes them; not with `transport`. */
  interceptors?: Interceptor[];
  /** Where warnings go (the coordinator does not serve Batch, …); default `console` (GatewayLogger). */
  logger?: GatewayLogger;
  /**
   * Carry concurrent calls together in Batch RPCs (default true), so that
   * the cost of an RPC, on both sides, is paid once for many calls. Each
   * call keeps its own deadline, signal, retries and refusals, exactly as
   * when sent alone. `false` sends every call as its own RPC; so does a
   * client whose coordinator does not serve Batch yet (it says so once).
   */
  batching?: boolean | BatchingOptions;
}

/** How concurrent calls are carried in Batch RPCs. */
export interface BatchingOptions {
  /**
   * Batch RPCs in flight at once (default 4). A call made while fewer are
   * in flight goes out at once; calls made meanwhile wait for the first of
   * them to be answered, and go out together. A call that goes out with no
   * other is sent as its own RPC, in one of these places.
   */
  inFlight?: number;
  /** Most calls in one batch (default and at most 256, the contract's bound). */
  maxCalls?: number;
  /**
   * About the most bytes of calls in one batch (default 1 MiB): keep it well
   * under the coordinator's IDEM_MAX_REQUEST_BYTES. A larger call goes out
   * as its own RPC.
   */
  maxBytes?: number;
}

/** Per-call options. */
export interface CallOptions {
  /** Deadline of each attempt of this call. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/**
 * A client of `idempotency.v1.CoordinatorService` over pooled HTTP/2
 * connections (gRPC), with a deadline on every call and bounded, jittered
 * retries of transport failures only: UNAVAILABLE without a reason, or with
 * REGISTRY_UNAVAILABLE / REGISTRY_BUSY, where nothing was decided. Every
 * other refusal is an answer and is thrown at once as a CoordinatorError.
 * Repeating any of these calls is safe: Reserve, Complete, Release and
 * ResolveEffectAttempt are idempotent; a repeated RecordEffectAttempt adds an
 * attempt with the same downstream key.
 */
export class CoordinatorClient {
  private readonly endpoints: Endpoint[];
  private batcher: Batcher | undefined;
  private readonly sessions: Http2SessionManager[] = [];
  private next = 0;
  private readonly timeoutMs: number;
  private readonly attempts: number;
  private readonly baseDelayMs: number;
  private readonly maxDelayMs: number;
  private readonly logger: SdkLogger;
  private readonly headers: Record<string, string>;
  private readonly replicaBackoffMs: number;

  constructor(options: CoordinatorClientOptions) {
    checkOptions(FORMS.constructor, options, {
      baseUrl: optional(
        either("an address or a non-empty array of addresses", nonEmptyString, (v, at) => (Array.isArray(v) && v.length > 0 ? arrayOf(nonEmptyString)(v, at) : `${at} is empty`)),
      ),
      token: optional(string),
      timeoutMs: optional(positiveNumber),
      retry: optional(shape({ attempts: optional(wholeNumber(1)), baseDelayMs: optional(nonNegativeNumber), maxDelayMs: optional(nonNegativeNumber) })),
      connections: optional(wholeNumber(1)),
      replicaBackoffMs: optional(nonNegativeNumber),
      idleConnectionTimeoutMs: optional(positiveNumber),
      transport: optional(object),
      interceptors: optional(arrayOf(func)),
      logger: optional(loggerRule),
      batching: optional(
        either(
          "true, false or { inFlight?, maxCalls?, maxBytes? }",
          boolean,
          shape({ inFlight: optional(wholeNumber(1)), maxCalls: optional(wholeNumber(1)), maxBytes: optional(wholeNumber(1)) }),
        ),
      ),
    });
    if (options.baseUrl === undefined && options.transport === undefined) throw argumentError(FORMS.constructor, "needs baseUrl (the coordinator's address) or a transport");
    this.timeoutMs = options.timeoutMs ?? 2000;
    this.attempts = Math.max(1, options.retry?.attempts ?? 4);
    this.baseDelayMs = options.retry?.baseDelayMs ?? 50;
    this.maxDelayMs = options.retry?.maxDelayMs ?? 1000;
    this.logger = loggerOf(options.logger);
    this.headers = options.token ? { authorization: `Bearer ${options.token}` } : {};
    this.replicaBackoffMs = options.replicaBackoffMs ?? 1000;
    if (options.batching !== false) {
      const batching = options.batching === true || options.batching === undefined ? {} : options.batching;
      this.batcher = new Batcher({
        inFlight: Math.max(1, batching.inFlight ?? 4),
        maxCalls: Math.min(MAX_BATCH_CALLS, Math.max(1, batching.maxCalls ?? MAX_BATCH_CALLS)),
        maxBytes: batching.maxBytes ?? 1024 * 1024,
        send: (calls, options) => this.send((client) => client.batch({ calls }, { ...options, headers: this.headers })),
        unsupported: () => {
          // An older coordinator: every later call goes as its own RPC, without asking again.
          this.batcher = undefined;
          this.logger.warn({}, "the coordinator does not serve Batch (UNIMPLEMENTED): sending every call as its own RPC from now on");
        },
      });
    }
    if (options.transport) {
      this.endpoints = [{ client: createClient(CoordinatorService, options.transport), passedOverUntil: 0 }];
      return;
    }
    const baseUrls = typeof options.baseUrl === "string" ? [options.baseUrl] : [...(options.baseUrl ?? [])];
    if (baseUrls.length === 0) throw new Error("CoordinatorClient needs baseUrl (or a transport)");
    const count = Math.max(baseUrls.length, options.connections ?? 1);
    this.endpoints = [];
    for (let i = 0; i < count; i++) {
      const baseUrl = baseUrls[i % baseUrls.length]!;
      // One session manager per connection: it reconnects after failures,
      // verifies idle connections with a PING before reuse, and closes them
      // when idle, so a coordinator restart costs one failed (retried) call.
      const sessionManager = new Http2SessionManager(baseUrl, {
        idleConnectionTimeoutMs: options.idleConnectionTimeoutMs ?? 60_000,
        pingIdleConnection: true,
        pingTimeoutMs: Math.min(this.timeoutMs, 2000),
      });
      this.sessions.push(sessionManager);
      this.endpoints.push({
        client: createClient(CoordinatorService, directGrpcTransport({ baseUrl, sessionManager, interceptors: options.interceptors ?? [] })),
        passedOverUntil: 0,
      });
    }
  }

  /**
   * Decides what to do with a request (the acceptance point). With
   * `waitForOwnerMs`, a duplicate of a request still running waits for it on
   * the coordinator (sent as its own RPC, never holding a batch, with that
   * much added to its deadline).
   */
  async reserve(input: ReserveInput, call?: CallOptions): Promise<ReserveResult> {
    checkInput(
      FORMS.reserve,
      input,
      {
        subject: subjectRule,
        operation: nonEmptyString,
        apiRevision: wholeNumber(1),
        idempotencyKey: string,
        parts: shape({ method: nonEmptyString, path: string, query: string, mediaType: string, headers: arrayOf(shape({ name: string, value: string })), body: bytes }),
        claim: optional(boolean),
        leaseMs,
        writerEpoch,
        waitForOwnerMs: optional(nonNegativeNumber),
        effects: optional(arrayOf(shape({ effect: nonEmptyString, provider: nonEmptyString }))),
      },
      { value: call },
    );
    const waitMs = input.waitForOwnerMs && input.waitForOwnerMs > 0 ? input.waitForOwnerMs : 0;
    const request = create(ReserveRequestSchema, {
      subject: input.subject,
      operation: input.operation,
      apiRevision: input.apiRevision,
      idempotencyKey: input.idempotencyKey,
      request: {
        case: "parts",
        value: create(HttpRequestPartsSchema, {
          method: input.parts.method,
          path: input.parts.path,
          query: input.parts.query,
          mediaType: input.parts.mediaType,
          headers: input.parts.headers.map((h) => ({ name: h.name, value: h.value })),
          body: input.parts.body,
        }),
      },
      claim: input.claim ?? false,
      lease: leaseOf(input.leaseMs),
      writerEpoch: BigInt(input.writerEpoch ?? 0),
      ...(waitMs > 0 ? { waitForOwner: durationFromMs(waitMs) } : {}),
      effects: (input.effects ?? []).map(({ effect, provider }) => ({ effect, provider })),
    });
    const res = await (waitMs > 0
      ? this.call("reserve", request, { ...call, timeoutMs: (call?.timeoutMs ?? this.timeoutMs) + waitMs }, { alone: true })
      : this.call("reserve", request, call));
    return {
      decision: answered(DECISIONS, res.decision),
      operationId: res.operationId,
      ...(res.state ? { state: answered(RECORD_STATES, res.state) } : {}),
      generation: Number(res.generation),
      ...dateField("leaseExpiresAt", res.leaseExpiresAt),
      ...(res.retryAfter ? { retryAfterMs: durationMs(res.retryAfter) } : {}),
      ...(res.snapshot ? { snapshot: fromSnapshot(res.snapshot) } : {}),
      enforced: res.enforced,
      schemaRevision: res.schemaRevision,
      contractVersion: res.contractVersion,
      ...(res.effectAttempts.length > 0 ? { attempts: res.effectAttempts.map(fromAttempt) } : {}),
      ...(res.cacheableFor ? { cacheableForMs: durationMs(res.cacheableFor) } : {}),
    };
  }

  /** Takes ownership for execution: OWNER, TAKEOVER or RECOVER. */
  async claim(input: ClaimInput, call?: CallOptions): Promise<ClaimResult> {
    checkInput(FORMS.claim, input, { ref: operationRef, mode: claimMode, generation, leaseMs, writerEpoch }, { value: call });
    const request = create(ClaimRequestSchema, {
      ref: input.ref,
      mode: CLAIM_MODES.number(input.mode),
      generation: BigInt(input.generation),
      lease: leaseOf(input.leaseMs),
      writerEpoch: BigInt(input.writerEpoch ?? 0),
    });
    const res = await this.call("claim", request, call);
    return {
      generation: Number(res.generation),
      state: answered(RECORD_STATES, res.state),
      ...dateField("leaseExpiresAt", res.leaseExpiresAt),
      recovering: res.recovering,
      effectAttempts: res.effectAttempts.map(fromAttempt),
    };
  }

  /** Extends the lease of the generation held; returns the new expiry. */
  async renewLease(input: RenewLeaseInput, call?: CallOptions): Promise<Date | undefined> {
    checkInput(FORMS.renewLease, input, { ...owned, leaseMs }, { value: call });
    const request = create(RenewLeaseRequestSchema, { ref: input.ref, generation: BigInt(input.generation), lease: leaseOf(input.leaseMs) });
    const res = await this.call("renewLease", request, call);
    return res.leaseExpiresAt ? timestampDate(res.leaseExpiresAt) : undefined;
  }

  /** Registers a downstream call before making it; the attempt carries the stable downstream key. */
  async recordEffectAttempt(input: RecordEffectAttemptInput, call?: CallOptions): Promise<EffectAttempt> {
    checkInput(FORMS.recordEffectAttempt, input, { ...owned, effect: nonEmptyString, provider: nonEmptyString }, { value: call });
    const request = create(RecordEffectAttemptRequestSchema, { ref: input.ref, generation: BigInt(input.generation), effect: input.effect, provider: input.provider });
    const res = await this.call("recordEffectAttempt", request, call);
    if (!res.attempt) throw new CoordinatorError("RecordEffectAttempt answered without an attempt", Code.Internal, "INTERNAL");
    return fromAttempt(res.attempt);
  }

  /** Records what a downstream call did. */
  async resolveEffectAttempt(input: ResolveEffectAttemptInput, call?: CallOptions): Promise<EffectAttempt> {
    checkInput(FORMS.resolveEffectAttempt, input, { ...owned, attemptNumber: wholeNumber(1), status: effectStatus, providerHandle: optional(string) }, { value: call });
    const request = create(ResolveEffectAttemptRequestSchema, {
      ref: input.ref,
      generation: BigInt(input.generation),
      attemptNumber: input.attemptNumber,
      status: EFFECT_STATUSES.number(input.status),
      providerHandle: input.providerHandle ?? "",
    });
    const res = await this.call("resolveEffectAttempt", request, call);
    if (!res.attempt) throw new CoordinatorError("ResolveEffectAttempt answered without an attempt", Code.Internal, "INTERNAL");
    return fromAttempt(res.attempt);
  }

  /** Finishes the operation with an outcome and the response to replay. */
  async complete(input: CompleteInput, call?: CallOptions): Promise<CompleteResult> {
    checkInput(FORMS.complete, input, { ...owned, outcome, snapshot: snapshotRule, resolutions: optional(arrayOf(resolution)) }, { value: call });
    const { snapshot } = input;
    const request = create(CompleteRequestSchema, {
      ref: input.ref,
      generation: BigInt(input.generation),
      outcome: OUTCOMES.number(input.outcome),
      snapshot: {
        statusCode: snapshot.statusCode,
        mediaType: snapshot.mediaType,
        location: snapshot.location,
        businessVersion: snapshot.businessVersion,
        headers: snapshot.headers.map(([name, value]) => ({ name, value })),
        body: snapshot.body,
      },
      resolutions: (input.resolutions ?? []).map((r) => ({ attemptNumber: r.attemptNumber, status: EFFECT_STATUSES.number(r.status), providerHandle: r.providerHandle ?? "" })),
    });
    const res = await this.call("complete", request, call);
    return { state: answered(RECORD_STATES, res.state), snapshotDigest: res.snapshotDigest, ...dateField("completedAt", res.completedAt) };
  }

  /** Hands a reservation back without any effect: the next identical retry takes it over. */
  async release(input: OwnedRef, call?: CallOptions): Promise<HandOverResult> {
    checkInput(FORMS.release, input, owned, { value: call });
    const res = await this.call("release", create(ReleaseRequestSchema, { ref: input.ref, generation: BigInt(input.generation) }), call);
    return { state: answered(RECORD_STATES, res.state), generation: Number(res.generation) };
  }

  /**
   * The owner stops at once: released when nothing can have happened,
   * otherwise UNKNOWN now, for a recovery worker to settle without waiting
   * for the lease to end.
   */
  async abandon(input: OwnedRef, call?: CallOptions): Promise<HandOverResult> {
    checkInput(FORMS.abandon, input, owned, { value: call });
    const res = await this.call("abandon", create(AbandonRequestSchema, { ref: input.ref, generation: BigInt(input.generation) }), call);
    return { state: answered(RECORD_STATES, res.state), generation: Number(res.generation) };
  }

  /** Reads an operation by id (with the asking subject) or by scope. */
  async lookup(input: LookupInput, call?: CallOptions): Promise<OperationRecord> {
    checkInput(
      FORMS.lookup,
      input,
      isObject(input) && "scope" in input
        ? { scope: shape({ subject: subjectRule, operation: nonEmptyString, apiRevision: wholeNumber(1), idempotencyKey: string }) }
        : { ref: operationRef, subject: optional(subjectRule) },
      { value: call },
    );
    const by: MessageInitShape<typeof LookupRequestSchema>["by"] =
      "ref" in input ? { case: "ref", value: { tenant: input.ref.tenant, operationId: input.ref.operationId } } : { case: "scope", value: input.scope };
    const subject = "ref" in input ? input.subject : undefined;
    const res = await this.call("lookup", create(LookupRequestSchema, { by, ...(subject ? { subject } : {}) }), call);
    if (!res.record) throw new CoordinatorError("Lookup answered without a record", Code.Internal, "INTERNAL");
    return fromRecord(res.record);
  }

  /** Lists records a recovery worker should act on (worker role); always its own RPC. */
  async listRecoverable(input: ListRecoverableInput = {}, call?: CallOptions): Promise<ListRecoverableResult> {
    checkInput(
      FORMS.listRecoverable,
      input,
      { tenant: optional(string), operations: optional(arrayOf(nonEmptyString)), pageSize: optional(wholeNumber(0)), pageToken: optional(string) },
      { value: call },
    );
    const res = await this.retrying("ListRecoverable", call, (options) =>
      this.send((client) =>
        client.listRecoverable(
          { tenant: input.tenant ?? "", operations: [...(input.operations ?? [])], pageSize: input.pageSize ?? 0, pageToken: input.pageToken ?? "" },
          { ...options, headers: this.headers },
        ),
      ),
    );
    return {
      records: res.records.map((r) => ({ record: fromRecord(r.record!), claimMode: answered(CLAIM_MODES, r.claimMode) })),
      nextPageToken: res.nextPageToken,
    };
  }

  /** Closes the HTTP/2 connections; calls made afterwards reconnect. */
  close(): void {
    for (const session of this.sessions) session.abort();
  }

  /**
   * Sends one RPC on the next connection in turn, passing over replicas whose
   * connection failed lately while another one is up (with every one failed,
   * the next in turn is tried anyway). A transport failure marks the replica
   * passed over, so that the retry of that call goes elsewhere.
   */
  private async send<T>(rpc: (client: Client<typeof CoordinatorService>) => Promise<T>): Promise<T> {
    const now = Date.now();
    let endpoint = this.endpoints[this.next++ % this.endpoints.length]!;
    for (let i = 1; i < this.endpoints.length && endpoint.passedOverUntil > now; i++) endpoint = this.endpoints[this.next++ % this.endpoints.length]!;
    try {
      return await rpc(endpoint.client);
    } catch (error) {
      if (toCoordinatorError(error).transportFailed) endpoint.passedOverUntil = Date.now() + this.replicaBackoffMs;
      throw error;
    }
  }

  /**
   * One call of the request path: in a batch with concurrent ones, or as its
   * own RPC (always, with `alone`). The caller's trace context (W3C, from the
   * active OpenTelemetry context and the globally registered propagator, if
   * the service traces) goes with it: as headers alone, in the batched call.
   */
  private call<K extends CallKind>(kind: K, request: RequestOf<K>, call: CallOptions | undefined, how?: { alone: true }): Promise<ResponseOf<K>> {
    const traceContext: Record<string, string> = {};
    propagation.inject(context.active(), traceContext);
    // The client's method of each RPC is named as the case of BatchCall that carries its request.
    const alone = (options: AttemptOptions) =>
      this.send((client) => (client[kind] as unknown as UnaryMethod)(request, { ...options, headers: { ...this.headers, ...traceContext } }));
    const batched = { case: kind, value: request } as BatchCall["call"];
    const attempt = (options: AttemptOptions) =>
      (this.batcher && !how?.alone ? this.batcher.call(batched, traceContext, options, alone) : alone(options)) as Promise<ResponseOf<K>>;
    return this.retrying(CoordinatorService.method[kind].name, call, attempt);
  }

  /**
   * One call with its deadline, repeated on transport failures only, with
   * exponential backoff and full jitter so that many gateways hitting a
   * restarting coordinator do not retry in lockstep.
   */
  private async retrying<T>(rpc: string, call: CallOptions | undefined, attempt: (options: AttemptOptions) => Promise<T>): Promise<T> {
    const timeoutMs = call?.timeoutMs ?? this.timeoutMs;
    for (let n = 1; ; n++) {
      try {
        return await attempt({ timeoutMs, ...(call?.signal ? { signal: call.signal } : {}) });
      } catch (error) {
        const failure = toCoordinatorError(error);
        if (!failure.retryable || n >= this.attempts || call?.signal?.aborted) throw failure;
        const delay = Math.random() * Math.min(this.maxDelayMs, this.baseDelayMs * 2 ** (n - 1));
        this.logger.debug({ rpc, attempt: n, reason: failure.reason, code: failure.code, delayMs: Math.round(delay) }, "coordinator call failed in transit; retrying");
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
  }
}

/** One connection to a coordinator (replica), and until when it is passed over after its connection failed (Date.now() time). */
interface Endpoint {
  readonly client: Client<typeof CoordinatorService>;
  passedOverUntil: number;
}

/** One resolution Complete carries. */
const resolution = shape({ attemptNumber: wholeNumber(1), status: oneOf("CONFIRMED", "NO_EFFECT"), providerHandle: optional(string) });

/** A unary method of the Connect client. */
type UnaryMethod = (request: unknown, options: AttemptOptions & { headers: Record<string, string> }) => Promise<unknown>;

/** The kinds of call a batch carries, named as the client's methods of their RPCs. */
type CallKind = NonNullable<BatchCall["call"]["case"]>;
type RequestOf<K extends CallKind> = Extract<BatchCall["call"], { case: K }>["value"];
type ResponseOf<K extends CallKind> = Extract<BatchResult["result"], { case: K }>["value"];

const leaseOf = (leaseMs: number | undefined): Duration | undefined => (leaseMs && leaseMs > 0 ? durationFromMs(leaseMs) : undefined);
