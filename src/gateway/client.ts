import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, durationMs, timestampDate, type Duration, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, createClient, type Client, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { ClaimMode as ProtoClaimMode, CoordinatorService, Decision as ProtoDecision, LookupRequestSchema } from "../gen/idempotency/v1/coordinator_pb.js";
import {
  EffectStatus as ProtoEffectStatus,
  HttpRequestPartsSchema,
  Outcome as ProtoOutcome,
  RecordState as ProtoRecordState,
  type EffectAttempt as ProtoEffectAttempt,
  type OperationRecord as ProtoOperationRecord,
  type ResponseSnapshot as ProtoResponseSnapshot,
} from "../gen/idempotency/v1/types_pb.js";
import { CoordinatorError, toCoordinatorError } from "./errors.js";
import {
  silentLogger,
  type ClaimInput,
  type ClaimMode,
  type ClaimResult,
  type CompleteInput,
  type CompleteResult,
  type Decision,
  type EffectAttempt,
  type EffectStatus,
  type GatewayLogger,
  type HandOverResult,
  type ListRecoverableInput,
  type ListRecoverableResult,
  type LookupInput,
  type OperationRecord,
  type Outcome,
  type OwnedRef,
  type RecordEffectAttemptInput,
  type RecordState,
  type RenewLeaseInput,
  type ReserveInput,
  type ResolveEffectAttemptInput,
  type ReserveResult,
  type ResponseSnapshot,
} from "./types.js";

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
  /** The coordinator's RPC address, e.g. `http://127.0.0.1:7070` (gRPC over HTTP/2 cleartext, or https). */
  baseUrl?: string;
  /** The caller's bearer token (a gateway or worker token minted with `idemctl token`). */
  token?: string;
  /** Deadline of every attempt of every call, unless a call names its own (default 2000 ms). */
  timeoutMs?: number;
  retry?: RetryOptions;
  /**
   * HTTP/2 connections to spread calls over (default 1). One connection
   * multiplexes many concurrent calls; more spread the load of very busy
   * gateways over several coordinator replicas behind a load balancer.
   */
  connections?: number;
  /** Close an HTTP/2 connection idle this long (default 60 s); the next call reconnects. */
  idleConnectionTimeoutMs?: number;
  /** A ready transport instead of `baseUrl` (tests: `createRouterTransport`). */
  transport?: Transport;
  logger?: GatewayLogger;
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
  private readonly clients: Array<Client<typeof CoordinatorService>>;
  private readonly sessions: Http2SessionManager[] = [];
  private next = 0;
  private readonly timeoutMs: number;
  private readonly attempts: number;
  private readonly baseDelayMs: number;
  private readonly maxDelayMs: number;
  private readonly logger: GatewayLogger;
  private readonly headers: Record<string, string>;

  constructor(options: CoordinatorClientOptions) {
    this.timeoutMs = options.timeoutMs ?? 2000;
    this.attempts = Math.max(1, options.retry?.attempts ?? 4);
    this.baseDelayMs = options.retry?.baseDelayMs ?? 50;
    this.maxDelayMs = options.retry?.maxDelayMs ?? 1000;
    this.logger = options.logger ?? silentLogger;
    this.headers = options.token ? { authorization: `Bearer ${options.token}` } : {};
    if (options.transport) {
      this.clients = [createClient(CoordinatorService, options.transport)];
      return;
    }
    if (!options.baseUrl) throw new Error("CoordinatorClient needs baseUrl (or a transport)");
    const baseUrl = options.baseUrl;
    const count = Math.max(1, options.connections ?? 1);
    this.clients = [];
    for (let i = 0; i < count; i++) {
      // One session manager per connection: it reconnects after failures,
      // verifies idle connections with a PING before reuse, and closes them
      // when idle, so a coordinator restart costs one failed (retried) call.
      const sessionManager = new Http2SessionManager(baseUrl, {
        idleConnectionTimeoutMs: options.idleConnectionTimeoutMs ?? 60_000,
        pingIdleConnection: true,
        pingTimeoutMs: Math.min(this.timeoutMs, 2000),
      });
      this.sessions.push(sessionManager);
      this.clients.push(createClient(CoordinatorService, createGrpcTransport({ baseUrl, sessionManager })));
    }
  }

  /** Decides what to do with a request (the acceptance point). */
  async reserve(input: ReserveInput, call?: CallOptions): Promise<ReserveResult> {
    const res = await this.call("Reserve", call, (client, options) =>
      client.reserve(
        {
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
        },
        options,
      ),
    );
    return {
      decision: fromDecision(res.decision),
      operationId: res.operationId,
      ...(res.state ? { state: fromState(res.state) } : {}),
      generation: Number(res.generation),
      ...dateField("leaseExpiresAt", res.leaseExpiresAt),
      ...(res.retryAfter ? { retryAfterMs: durationMs(res.retryAfter) } : {}),
      ...(res.snapshot ? { snapshot: fromSnapshot(res.snapshot) } : {}),
      enforced: res.enforced,
      schemaRevision: res.schemaRevision,
      contractVersion: res.contractVersion,
    };
  }

  /** Takes ownership for execution: OWNER, TAKEOVER or RECOVER. */
  async claim(input: ClaimInput, call?: CallOptions): Promise<ClaimResult> {
    const res = await this.call("Claim", call, (client, options) =>
      client.claim(
        {
          ref: input.ref,
          mode: toClaimMode(input.mode),
          generation: BigInt(input.generation),
          lease: leaseOf(input.leaseMs),
          writerEpoch: BigInt(input.writerEpoch ?? 0),
        },
        options,
      ),
    );
    return {
      generation: Number(res.generation),
      state: fromState(res.state),
      ...dateField("leaseExpiresAt", res.leaseExpiresAt),
      recovering: res.recovering,
      effectAttempts: res.effectAttempts.map(fromAttempt),
    };
  }

  /** Extends the lease of the generation held; returns the new expiry. */
  async renewLease(input: RenewLeaseInput, call?: CallOptions): Promise<Date | undefined> {
    const res = await this.call("RenewLease", call, (client, options) =>
      client.renewLease({ ref: input.ref, generation: BigInt(input.generation), lease: leaseOf(input.leaseMs) }, options),
    );
    return res.leaseExpiresAt ? timestampDate(res.leaseExpiresAt) : undefined;
  }

  /** Registers a downstream call before making it; the attempt carries the stable downstream key. */
  async recordEffectAttempt(input: RecordEffectAttemptInput, call?: CallOptions): Promise<EffectAttempt> {
    const res = await this.call("RecordEffectAttempt", call, (client, options) =>
      client.recordEffectAttempt({ ref: input.ref, generation: BigInt(input.generation), effect: input.effect, provider: input.provider }, options),
    );
    if (!res.attempt) throw new CoordinatorError("RecordEffectAttempt answered without an attempt", Code.Internal, "INTERNAL");
    return fromAttempt(res.attempt);
  }

  /** Records what a downstream call did. */
  async resolveEffectAttempt(input: ResolveEffectAttemptInput, call?: CallOptions): Promise<EffectAttempt> {
    const res = await this.call("ResolveEffectAttempt", call, (client, options) =>
      client.resolveEffectAttempt(
        {
          ref: input.ref,
          generation: BigInt(input.generation),
          attemptNumber: input.attemptNumber,
          status: toEffectStatus(input.status),
          providerHandle: input.providerHandle ?? "",
        },
        options,
      ),
    );
    if (!res.attempt) throw new CoordinatorError("ResolveEffectAttempt answered without an attempt", Code.Internal, "INTERNAL");
    return fromAttempt(res.attempt);
  }

  /** Finishes the operation with an outcome and the response to replay. */
  async complete(input: CompleteInput, call?: CallOptions): Promise<CompleteResult> {
    const { snapshot } = input;
    const res = await this.call("Complete", call, (client, options) =>
      client.complete(
        {
          ref: input.ref,
          generation: BigInt(input.generation),
          outcome: toOutcome(input.outcome),
          snapshot: {
            statusCode: snapshot.statusCode,
            mediaType: snapshot.mediaType,
            location: snapshot.location,
            businessVersion: snapshot.businessVersion,
            headers: snapshot.headers.map(([name, value]) => ({ name, value })),
            body: snapshot.body,
          },
        },
        options,
      ),
    );
    return { state: fromState(res.state), snapshotDigest: res.snapshotDigest, ...dateField("completedAt", res.completedAt) };
  }

  /** Hands a reservation back without any effect: the next identical retry takes it over. */
  async release(input: OwnedRef, call?: CallOptions): Promise<HandOverResult> {
    const res = await this.call("Release", call, (client, options) => client.release({ ref: input.ref, generation: BigInt(input.generation) }, options));
    return { state: fromState(res.state), generation: Number(res.generation) };
  }

  /**
   * The owner stops at once: released when nothing can have happened,
   * otherwise UNKNOWN now, for a recovery worker to settle without waiting
   * for the lease to end.
   */
  async abandon(input: OwnedRef, call?: CallOptions): Promise<HandOverResult> {
    const res = await this.call("Abandon", call, (client, options) => client.abandon({ ref: input.ref, generation: BigInt(input.generation) }, options));
    return { state: fromState(res.state), generation: Number(res.generation) };
  }

  /** Reads an operation by id (with the asking subject) or by scope. */
  async lookup(input: LookupInput, call?: CallOptions): Promise<OperationRecord> {
    const by: MessageInitShape<typeof LookupRequestSchema>["by"] =
      "ref" in input ? { case: "ref", value: { tenant: input.ref.tenant, operationId: input.ref.operationId } } : { case: "scope", value: input.scope };
    const subject = "ref" in input ? input.subject : undefined;
    const res = await this.call("Lookup", call, (client, options) => client.lookup({ by, ...(subject ? { subject } : {}) }, options));
    if (!res.record) throw new CoordinatorError("Lookup answered without a record", Code.Internal, "INTERNAL");
    return fromRecord(res.record);
  }

  /** Lists records a recovery worker should act on (worker role). */
  async listRecoverable(input: ListRecoverableInput = {}, call?: CallOptions): Promise<ListRecoverableResult> {
    const res = await this.call("ListRecoverable", call, (client, options) =>
      client.listRecoverable({ tenant: input.tenant ?? "", operations: [...(input.operations ?? [])], pageSize: input.pageSize ?? 0, pageToken: input.pageToken ?? "" }, options),
    );
    return {
      records: res.records.map((r) => ({ record: fromRecord(r.record!), claimMode: fromClaimMode(r.claimMode) })),
      nextPageToken: res.nextPageToken,
    };
  }

  /** Closes the HTTP/2 connections; calls made afterwards reconnect. */
  close(): void {
    for (const session of this.sessions) session.abort();
  }

  /**
   * One call with its deadline, repeated on transport failures only, with
   * exponential backoff and full jitter so that many gateways hitting a
   * restarting coordinator do not retry in lockstep.
   */
  private async call<T>(
    rpc: string,
    call: CallOptions | undefined,
    invoke: (client: Client<typeof CoordinatorService>, options: { timeoutMs: number; headers: Record<string, string>; signal?: AbortSignal }) => Promise<T>,
  ): Promise<T> {
    const timeoutMs = call?.timeoutMs ?? this.timeoutMs;
    for (let attempt = 1; ; attempt++) {
      const client = this.clients[this.next++ % this.clients.length]!;
      try {
        return await invoke(client, { timeoutMs, headers: this.headers, ...(call?.signal ? { signal: call.signal } : {}) });
      } catch (error) {
        const failure = toCoordinatorError(error);
        if (!failure.retryable || attempt >= this.attempts || call?.signal?.aborted) throw failure;
        const delay = Math.random() * Math.min(this.maxDelayMs, this.baseDelayMs * 2 ** (attempt - 1));
        this.logger.debug({ rpc, attempt, reason: failure.reason, code: failure.code, delayMs: Math.round(delay) }, "coordinator call failed in transit; retrying");
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
  }
}

const leaseOf = (leaseMs: number | undefined): Duration | undefined => (leaseMs && leaseMs > 0 ? durationFromMs(leaseMs) : undefined);

function dateField<K extends string>(key: K, ts: Timestamp | undefined): { [P in K]?: Date } {
  return (ts ? { [key]: timestampDate(ts) } : {}) as { [P in K]?: Date };
}

const DECISIONS: Record<number, Decision> = {
  [ProtoDecision.ACCEPTED]: "ACCEPTED",
  [ProtoDecision.REPLAY]: "REPLAY",
  [ProtoDecision.IN_PROGRESS]: "IN_PROGRESS",
  [ProtoDecision.PAYLOAD_CONFLICT]: "PAYLOAD_CONFLICT",
  [ProtoDecision.EXPIRED]: "EXPIRED",
};

function fromDecision(decision: ProtoDecision): Decision {
  const known = DECISIONS[decision];
  if (!known) throw new CoordinatorError(`the coordinator answered an unknown decision ${decision}`, Code.Internal, "INTERNAL");
  return known;
}

const STATES: Record<number, RecordState> = {
  [ProtoRecordState.RESERVED]: "RESERVED",
  [ProtoRecordState.EXECUTING]: "EXECUTING",
  [ProtoRecordState.SUCCEEDED]: "SUCCEEDED",
  [ProtoRecordState.FAILED_FINAL]: "FAILED_FINAL",
  [ProtoRecordState.REJECTED]: "REJECTED",
  [ProtoRecordState.UNKNOWN]: "UNKNOWN",
};

function fromState(state: ProtoRecordState): RecordState {
  return STATES[state] ?? "UNKNOWN";
}

const EFFECT_STATUSES: Record<number, EffectStatus> = {
  [ProtoEffectStatus.PENDING]: "PENDING",
  [ProtoEffectStatus.CONFIRMED]: "CONFIRMED",
  [ProtoEffectStatus.NO_EFFECT]: "NO_EFFECT",
  [ProtoEffectStatus.INDETERMINATE]: "INDETERMINATE",
};

const toEffectStatus = (status: EffectStatus): ProtoEffectStatus => ProtoEffectStatus[status];
const toOutcome = (outcome: Outcome): ProtoOutcome => ProtoOutcome[outcome];
const toClaimMode = (mode: ClaimMode): ProtoClaimMode => ProtoClaimMode[mode];

function fromClaimMode(mode: ProtoClaimMode): ClaimMode {
  return mode === ProtoClaimMode.TAKEOVER ? "TAKEOVER" : mode === ProtoClaimMode.OWNER ? "OWNER" : "RECOVER";
}

function fromAttempt(a: ProtoEffectAttempt): EffectAttempt {
  return {
    attemptNumber: a.attemptNumber,
    effect: a.effect,
    provider: a.provider,
    downstreamKey: a.downstreamKey,
    // PENDING when unset: an unknown status is never taken as resolved.
    status: EFFECT_STATUSES[a.status] ?? "PENDING",
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
    state: fromState(r.state),
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
