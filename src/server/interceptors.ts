import { Code, ConnectError, createContextKey, type Interceptor } from "@connectrpc/connect";
import type { Logger } from "pino";
import { refuse } from "../contract/errors.js";
import { Health } from "../gen/grpc/health/v1/health_pb.js";
import { ServerReflection as ReflectionV1 } from "../gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ReflectionV1alpha } from "../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { CoordinatorService } from "../gen/idempotency/v1/coordinator_pb.js";
import { authorize } from "./authorization.js";
import type { Caller, Callers, PeerCertificate } from "./callers.js";

/** What mutual TLS says of the client, set from the connection (contextValues of the adapter). */
export const peerKey = createContextKey<PeerCertificate | undefined>(undefined, { description: "client certificate" });

/** The authenticated caller of the current RPC. */
export const callerKey = createContextKey<Caller | undefined>(undefined, { description: "authenticated caller" });

/** Reads the caller set by the authentication interceptor (every coordinator RPC has one). */
export function callerOf(values: { get<T>(key: { id: symbol; defaultValue: T }): T }): Caller {
  const caller = values.get(callerKey);
  if (!caller) throw new Error("no authenticated caller in context");
  return caller;
}

/** Services anyone may call: health checks (probes call them without credentials) and reflection (the published schema). */
const OPEN_SERVICES = new Set([Health.typeName, ReflectionV1.typeName, ReflectionV1alpha.typeName]);

/**
 * Authenticates every RPC except those of OPEN_SERVICES (by client
 * certificate or bearer token), and authorizes it by the table of roles
 * (authorization.ts), before the handler runs.
 */
export function authentication(callers: Callers): Interceptor {
  return (next) => async (req) => {
    if (!OPEN_SERVICES.has(req.service.typeName)) {
      const caller = callers.authenticate(req.header.get("authorization"), req.contextValues.get(peerKey));
      authorize(caller, req.method, req.stream ? undefined : req.message);
      req.contextValues.set(callerKey, caller);
    }
    return next(req);
  };
}

/**
 * Refuses requests carrying fields this server does not know. Protobuf
 * normally ignores them for forward compatibility, but here an ignored field
 * could be an input the client believes is fingerprinted or checked; refusing
 * is the only answer that cannot be silently wrong. (Connect JSON requests
 * with unknown fields are already refused by the JSON decoder.)
 */
export function unknownFieldsRefused(): Interceptor {
  return (next) => async (req) => {
    // A streaming RPC's request messages are checked as the handler reads them.
    if (req.stream) return next({ ...req, message: checkedEach(req.message) });
    // The Batch handler checks each of its calls, so that an unknown field refuses that call only, as its unary RPC would be refused.
    refuseUnknownFields(req.method === CoordinatorService.method.batch ? { ...req.message, calls: [] } : req.message);
    return next(req);
  };
}

/** Refuses a message carrying fields this server does not know, naming where (UNKNOWN_FIELD). */
export function refuseUnknownFields(message: unknown): void {
  const path = unknownFieldPath(message, "");
  if (path !== undefined) {
    refuse("UNKNOWN_FIELD", `the request carries fields this coordinator does not know${path ? ` (in ${path})` : ""}; upgrade the coordinator or the client's proto`);
  }
}

async function* checkedEach<M>(messages: AsyncIterable<M>): AsyncIterable<M> {
  for await (const message of messages) {
    refuseUnknownFields(message);
    yield message;
  }
}

function unknownFieldPath(value: unknown, path: string): string | undefined {
  if (typeof value !== "object" || value === null || value instanceof Uint8Array) return undefined;
  if (Array.isArray(value)) {
    for (const [i, item] of value.entries()) {
      const found = unknownFieldPath(item, `${path}[${i}]`);
      if (found !== undefined) return found;
    }
    return undefined;
  }
  const record = value as Record<string, unknown>;
  if (Array.isArray(record.$unknown) && record.$unknown.length > 0) return path;
  for (const [key, child] of Object.entries(record)) {
    if (key === "$unknown" || key === "$typeName") continue;
    const found = unknownFieldPath(child, path ? `${path}.${key}` : key);
    if (found !== undefined) return found;
  }
  return undefined;
}

/** Counts RPCs in flight, so that shutdown can wait for them. */
export class InFlight {
  private count = 0;
  private waiters: Array<() => void> = [];

  readonly interceptor: Interceptor = (next) => async (req) => {
    this.count++;
    try {
      return await next(req);
    } finally {
      this.count--;
      if (this.count === 0) this.waiters.splice(0).forEach((wake) => wake());
    }
  };

  get size(): number {
    return this.count;
  }

  /** Resolves when no RPC is in flight, or after `ms`; true when drained. */
  drained(ms: number): Promise<boolean> {
    if (this.count === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), ms);
      this.waiters.push(() => {
        clearTimeout(timer);
        resolve(true);
      });
    });
  }
}

/**
 * One log line per RPC ("rpc"): method, caller, code, duration, and the
 * operation id when the request or response names one; a stream's when it
 * ends, with how it ended. At info level, or at debug when the operator turned
 * it off (IDEM_ACCESS_LOG=false). Never a key, a body or a token: those stay
 * out of logs.
 */
export function accessLog(logger: Logger, level: "info" | "debug" = "info"): Interceptor {
  // The logger's level is set once, at start: lines it would drop cost nothing per call.
  if (!logger.isLevelEnabled(level)) return (next) => next;
  return (next) => async (req) => {
    const started = performance.now();
    const requested = operationIdOf(req.message);
    const line = (code: string, operationId: string | undefined) =>
      logger[level]({ rpc: req.method.name, caller: req.contextValues.get(callerKey)?.caller, code, ms: Math.round(performance.now() - started), operationId }, "rpc");
    let res;
    try {
      res = await next(req);
    } catch (error) {
      line(codeOf(error), requested);
      throw error;
    }
    if (!res.stream) {
      line("ok", requested ?? operationIdOf(res.message));
      return res;
    }
    const messages = res.message;
    return {
      ...res,
      message: (async function* () {
        // Not read to its end nor failed: the client stopped reading.
        let code = Code[Code.Canceled];
        try {
          yield* messages;
          code = "ok";
        } catch (error) {
          code = codeOf(error);
          throw error;
        } finally {
          line(code, requested);
        }
      })(),
    };
  };
}

function codeOf(error: unknown): string {
  return error instanceof ConnectError ? Code[error.code] : "unknown";
}

function operationIdOf(message: unknown): string | undefined {
  if (typeof message !== "object" || message === null) return undefined;
  const m = message as { operationId?: unknown; ref?: { operationId?: unknown } };
  const id = m.operationId ?? m.ref?.operationId;
  return typeof id === "string" && id !== "" ? id : undefined;
}
