import { context, SpanKind, SpanStatusCode, trace, type Attributes, type Context, type TextMapGetter, type Tracer } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";

/**
 * OpenTelemetry tracing, on when a collector is configured with the standard
 * OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): one
 * server span per RPC, continuing the caller's trace (W3C traceparent), sent
 * to the collector over OTLP/HTTP in batches.
 */
export function startTracing(env: NodeJS.ProcessEnv): { tracer: Tracer; shutdown(): Promise<void> } | undefined {
  if (!env.OTEL_EXPORTER_OTLP_ENDPOINT && !env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return undefined;
  const provider = new TracerProvider({
    resource: resourceFromAttributes({ "service.name": env.OTEL_SERVICE_NAME ?? "idempotency-coordinator" }),
    // The exporter reads the endpoint, headers and timeout from the standard OTEL_* variables.
    spanProcessors: [new BatchSpanProcessor({ exporter: new OTLPTraceExporter() })],
  });
  return { tracer: provider.getTracer("idempotency-coordinator"), shutdown: () => provider.shutdown() };
}

const propagator = new W3CTraceContextPropagator();
/** Reads the caller's trace context (traceparent, tracestate) from the request's headers. */
const headerGetter: TextMapGetter<Headers> = {
  get: (headers, key) => headers.get(key) ?? undefined,
  keys: (headers) => [...headers.keys()],
};

/**
 * Makes the active span follow an RPC across its awaits (AsyncLocalStorage),
 * so that its database transactions become its child spans and its log lines
 * carry its trace id. Once per process; a context manager the process set up
 * already (its own OpenTelemetry SDK) is kept.
 */
function followSpansAcrossAwaits(): void {
  if (contextFollowed) return;
  contextFollowed = true;
  const manager = new AsyncLocalStorageContextManager().enable();
  if (!context.setGlobalContextManager(manager)) manager.disable();
}
let contextFollowed = false;

/** The trace and span ids of the active span, for every log line (pino's `mixin`); nothing outside one. */
export function traceFields(): { traceId?: string; spanId?: string } {
  const span = trace.getActiveSpan();
  if (!span) return {};
  const { traceId, spanId } = span.spanContext();
  return { traceId, spanId };
}

/**
 * A span per RPC: `rpc.service`, `rpc.method`, the status code, and the
 * operation id when the request names one. Keys and bodies are never attributes.
 */
export function tracingInterceptor(tracer: Tracer): Interceptor {
  followSpansAcrossAwaits();
  return (next) => (req) => {
    const operationId = (req.message as { ref?: { operationId?: unknown } } | undefined)?.ref?.operationId;
    return inServerSpan(
      tracer,
      propagator.extract(context.active(), req.header, headerGetter),
      req.service.typeName,
      req.method.name,
      typeof operationId === "string" && operationId !== "" ? { "idempotency.operation_id": operationId } : {},
      () => next(req),
    );
  };
}

/** Reads a batched call's trace context from its `trace_context` map. */
const mapGetter: TextMapGetter<Record<string, string>> = {
  get: (carrier, key) => carrier[key],
  keys: (carrier) => Object.keys(carrier),
};

/**
 * Runs one call of a Batch in a span of its own, as the RPC it stands for: a
 * child of the call's own trace context when it carries one (its request's
 * trace), otherwise of the batch's span. Without a tracer, runs `work` alone.
 */
export function tracedBatchCall<T>(tracer: Tracer | undefined, service: string, method: string, traceContext: Record<string, string>, work: () => Promise<T>): Promise<T> {
  if (!tracer) return work();
  const parent = Object.keys(traceContext).length > 0 ? propagator.extract(context.active(), traceContext, mapGetter) : context.active();
  return inServerSpan(tracer, parent, service, method, { "idempotency.batched": true }, work);
}

/** `work` in a server span of `service/method` under `parent`, with the gRPC status code it ended with. */
async function inServerSpan<T>(tracer: Tracer, parent: Context, service: string, method: string, attributes: Attributes, work: () => Promise<T>): Promise<T> {
  const span = tracer.startSpan(
    `${service}/${method}`,
    { kind: SpanKind.SERVER, attributes: { "rpc.system": "connect_rpc", "rpc.service": service, "rpc.method": method, ...attributes } },
    parent,
  );
  try {
    const result = await context.with(trace.setSpan(parent, span), work);
    span.setAttribute("rpc.grpc.status_code", 0);
    return result;
  } catch (error) {
    const code = ConnectError.from(error).code;
    span.setAttribute("rpc.grpc.status_code", code);
    span.setStatus({ code: SpanStatusCode.ERROR, message: Code[code] });
    throw error;
  } finally {
    span.end();
  }
}
