import { context, propagation } from "@opentelemetry/api";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, durationMs, timestampDate, type Duration, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { getAbortSignalReason } from "@connectrpc/connect/protocol";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { MAX_BATCH_CALLS } from "../contract/batch.js";
import { CLAIM_MODES, DECISIONS, EFFECT_STATUSES, OUTCOMES, RECORD_STATES, type UnknownValue, type Vocabulary } from "../contract/words.js";
import {
  AbandonRequestSchema,
  type BatchCall,
  BatchCallSchema,
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
import {
  HttpRequestPartsSchema,
  type EffectAttempt as ProtoEffectAttempt,
  type OperationRecord as ProtoOperationRecord,
  type ResponseSnapshot as ProtoResponseSnapshot,
} from "../gen/idempotency/v1/types_pb.js";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";
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
import { CoordinatorError, errorOfStatus, toCoordinatorError } from "./errors.js";
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
  type ResponseSnapshot,
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
   * them to be answered, and go out together.
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
        client: createClient(CoordinatorService, createGrpcTransport({ baseUrl, sessionManager, interceptors: options.interceptors ?? [] })),
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

/** The deadline and signal of one attempt of a call. */
interface AttemptOptions {
  timeoutMs: number;
  signal?: AbortSignal;
}

/** A unary method of the Connect client. */
type UnaryMethod = (request: unknown, options: AttemptOptions & { headers: Record<string, string> }) => Promise<unknown>;

/** The kinds of call a batch carries, named as the client's methods of their RPCs. */
type CallKind = NonNullable<BatchCall["call"]["case"]>;
type RequestOf<K extends CallKind> = Extract<BatchCall["call"], { case: K }>["value"];
type ResponseOf<K extends CallKind> = Extract<BatchResult["result"], { case: K }>["value"];

/** A call waiting for its batch's answer. */
interface Pending {
  readonly call: BatchCall;
  readonly bytes: number;
  /** When this call stops waiting (Date.now() time). */
  readonly deadline: number;
  /** Settles the call once (with its result, an error, or by sending it alone); later answers are ignored. */
  readonly settle: (outcome: { result: BatchResult["result"] } | { error: Error } | { alone: true }) => void;
  settled: boolean;
  /** Told when the call has settled, once it is in a batch. */
  onSettled?: () => void;
}

interface BatcherOptions {
  inFlight: number;
  maxCalls: number;
  maxBytes: number;
  /** Sends one Batch RPC. */
  send: (calls: BatchCall[], options: AttemptOptions) => Promise<{ results: BatchResult[] }>;
  /** The coordinator does not serve Batch: called once, before the calls are sent alone. */
  unsupported: () => void;
}

/**
 * Coalesces concurrent calls into Batch RPCs: a call made while fewer than
 * `inFlight` batches are in flight goes out at once (calls made in the same
 * turn of the event loop go together); the calls made while the limit is
 * reached wait for the first batch to be answered and go together in the
 * next one. Each call keeps its own deadline and signal: it stops waiting
 * when either ends, as its own RPC would, whatever its batch does.
 */
class Batcher {
  private readonly queue: Pending[] = [];
  private inFlight = 0;
  private flushing = false;
  /** Set when the coordinator answered UNIMPLEMENTED: queued calls go alone. */
  private unsupported = false;

  constructor(private readonly options: BatcherOptions) {}

  /** Sends `call` in a batch, or alone when it is too large to share one; answers its response or throws its refusal. */
  call(call: BatchCall["call"], traceContext: Record<string, string>, attempt: AttemptOptions, alone: (options: AttemptOptions) => Promise<unknown>): Promise<unknown> {
    const bytes = approximateBytes(call);
    // Too large to share a batch: alone, exactly as without batching.
    if (bytes > this.options.maxBytes) return alone(attempt);
    const { signal } = attempt;
    if (signal?.aborted) return Promise.reject(ConnectError.from(getAbortSignalReason(signal), Code.Canceled));
    return new Promise<unknown>((resolve, reject) => {
      const deadline = Date.now() + attempt.timeoutMs;
      const onAbort = () => pending.settle({ error: ConnectError.from(getAbortSignalReason(signal!), Code.Canceled) });
      // The same error as the deadline of a call sent alone.
      const timer = setTimeout(() => pending.settle({ error: new ConnectError("the operation timed out", Code.DeadlineExceeded) }), attempt.timeoutMs);
      signal?.addEventListener("abort", onAbort, { once: true });
      const pending: Pending = {
        call: create(BatchCallSchema, { call, traceContext }),
        bytes,
        deadline,
        settled: false,
        settle: (outcome) => {
          if (pending.settled) return;
          pending.settled = true;
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          pending.onSettled?.();
          if ("alone" in outcome) alone({ ...attempt, timeoutMs: Math.max(0, deadline - Date.now()) }).then(resolve, reject);
          else if ("error" in outcome) reject(outcome.error);
          else if (outcome.result.case === call.case) resolve(outcome.result.value);
          else if (outcome.result.case === "error") reject(errorOfStatus(outcome.result.value));
          else reject(new CoordinatorError(`the coordinator answered a ${String(call.case)} call with ${outcome.result.case ?? "nothing"}`, Code.Internal, "INTERNAL"));
        },
      };
      this.queue.push(pending);
      this.scheduleFlush();
    });
  }

  /** Flushes after the calls of the current turn of the event loop have joined the queue, without waiting for a timer. */
  private scheduleFlush(): void {
    if (this.flushing) return;
    this.flushing = true;
    queueMicrotask(() => {
      this.flushing = false;
      this.flush();
    });
  }

  private flush(): void {
    while (this.inFlight < this.options.inFlight || this.unsupported) {
      const batch = this.take();
      if (batch.length === 0) return;
      if (this.unsupported) {
        for (const pending of batch) pending.settle({ alone: true });
        continue;
      }
      this.inFlight++;
      void this.dispatch(batch).finally(() => {
        this.inFlight--;
        this.flush();
      });
    }
  }

  /** The next batch: waiting calls in order, up to the bounds; calls that stopped waiting are dropped. */
  private take(): Pending[] {
    const batch: Pending[] = [];
    let bytes = 0;
    while (this.queue.length > 0 && batch.length < this.options.maxCalls) {
      const next = this.queue[0]!;
      if (next.settled) {
        this.queue.shift();
        continue;
      }
      if (batch.length > 0 && bytes + next.bytes > this.options.maxBytes) break;
      batch.push(this.queue.shift()!);
      bytes += next.bytes;
    }
    return batch;
  }

  private async dispatch(batch: Pending[]): Promise<void> {
    // The batch lives as long as its longest-waiting call; when every call has stopped waiting, it is cancelled.
    const controller = new AbortController();
    const timeoutMs = Math.max(1, ...batch.map((pending) => pending.deadline - Date.now()));
    let waiting = batch.length;
    for (const pending of batch) {
      pending.onSettled = () => {
        if (--waiting === 0) controller.abort();
      };
    }
    try {
      const { results } = await this.options.send(
        batch.map((pending) => pending.call),
        { timeoutMs, signal: controller.signal },
      );
      if (results.length !== batch.length) {
        const error = new CoordinatorError(`the coordinator answered ${results.length} results to a batch of ${batch.length} calls`, Code.Internal, "INTERNAL");
        for (const pending of batch) pending.settle({ error });
        return;
      }
      batch.forEach((pending, i) => pending.settle({ result: results[i]!.result }));
    } catch (error) {
      const failure = ConnectError.from(error);
      if (failure.code === Code.Unimplemented) {
        // An older coordinator: nothing was decided; every call goes alone, now and from now on.
        if (!this.unsupported) {
          this.unsupported = true;
          this.options.unsupported();
        }
        for (const pending of batch) pending.settle({ alone: true });
        this.flush();
        return;
      }
      if (failure.code === Code.ResourceExhausted && failure.findDetails(ErrorInfoSchema).length === 0) {
        // The batch was larger than the coordinator reads (refused before any call was decided): each call goes alone, as it would have.
        for (const pending of batch) pending.settle({ alone: true });
        return;
      }
      // What failed the whole batch (the transport, authentication) fails each of its calls as it would have failed each alone.
      for (const pending of batch) pending.settle({ error: failure });
    }
  }
}

/**
 * About how many bytes a call adds to a batch: the request's variable parts
 * (bodies, headers, path) and a generous allowance for the rest, without
 * encoding it twice.
 */
function approximateBytes(call: BatchCall["call"]): number {
  const fixed = 1024;
  const headerBytes = (headers: ReadonlyArray<{ name: string; value: string }>) => headers.reduce((sum, h) => sum + h.name.length + h.value.length + 8, 0);
  switch (call.case) {
    case "reserve": {
      const identity = call.value.request;
      return fixed + (identity.case === "parts" ? identity.value.body.length + identity.value.path.length + identity.value.query.length + headerBytes(identity.value.headers) : 0);
    }
    case "complete": {
      const snapshot = call.value.snapshot;
      return fixed + (snapshot ? snapshot.body.length + snapshot.location.length + headerBytes(snapshot.headers) : 0);
    }
    default:
      return fixed;
  }
}

const leaseOf = (leaseMs: number | undefined): Duration | undefined => (leaseMs && leaseMs > 0 ? durationFromMs(leaseMs) : undefined);

function dateField<K extends string>(key: K, ts: Timestamp | undefined): { [P in K]?: Date } {
  return (ts ? { [key]: timestampDate(ts) } : {}) as { [P in K]?: Date };
}

/**
 * The word of an enum field of the coordinator's answer. A number that is no
 * word of this SDK (a value of a newer contract, or UNSPECIFIED where the
 * contract always sets one) is never taken for another word: the call fails,
 * saying so.
 */
function answered<Word extends string>(vocabulary: Vocabulary<Word, number>, value: number): Word {
  return vocabulary.word(value, unknownAnswer);
}

function unknownAnswer(unknown: UnknownValue): never {
  throw new CoordinatorError(
    `the coordinator answered ${unknown.described}, a value this version of the gateway SDK does not know: upgrade idempotency-gateway`,
    Code.Internal,
    "INTERNAL",
  );
}

function fromAttempt(a: ProtoEffectAttempt): EffectAttempt {
  return {
    attemptNumber: a.attemptNumber,
    effect: a.effect,
    provider: a.provider,
    downstreamKey: a.downstreamKey,
    status: answered(EFFECT_STATUSES, a.status),
    providerHandle: a.providerHandle,
    generation: Number(a.generation),
    ...dateField("createdAt", a.createdAt),
    ...dateField("resolvedAt", a.resolvedAt),
  };
}

function fromSnapshot(s: ProtoResponseSnapshot): ResponseSnapshot {
  return {
    statusCode: s.statusCode,
    mediaType: s.mediaType,
    location: s.location,
    businessVersion: s.businessVersion,
    headers: s.headers.map((h): [string, string] => [h.name, h.value]),
    body: s.body,
    digest: s.digest,
  };
}

function fromRecord(r: ProtoOperationRecord): OperationRecord {
  return {
    operationId: r.operationId,
    subject: { tenant: r.subject?.tenant ?? "", principal: r.subject?.principal ?? "" },
    operation: r.operation,
    apiRevision: r.apiRevision,
    schemaRevision: r.schemaRevision,
    state: answered(RECORD_STATES, r.state),
    generation: Number(r.generation),
    recovering: r.recovering,
    ...dateField("leaseExpiresAt", r.leaseExpiresAt),
    ...dateField("createdAt", r.createdAt),
    ...dateField("updatedAt", r.updatedAt),
    ...dateField("completedAt", r.completedAt),
    ...(r.snapshot ? { snapshot: fromSnapshot(r.snapshot) } : {}),
    effectAttempts: r.effectAttempts.map(fromAttempt),
    contractVersion: r.contractVersion,
  };
}
