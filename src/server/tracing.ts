import { context, SpanKind, SpanStatusCode, trace, type TextMapGetter, type Tracer } from "@opentelemetry/api";
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
 * A span per RPC: `rpc.service`, `rpc.method`, the status code, and the
 * operation id when the request names one. Keys and bodies are never attributes.
 */
export function tracingInterceptor(tracer: Tracer): Interceptor {
  return (next) => async (req) => {
    const parent = propagator.extract(context.active(), req.header, headerGetter);
    const span = tracer.startSpan(
      `${req.service.typeName}/${req.method.name}`,
      {
        kind: SpanKind.SERVER,
        attributes: { "rpc.system": "connect_rpc", "rpc.service": req.service.typeName, "rpc.method": req.method.name },
      },
      parent,
    );
    const operationId = (req.message as { ref?: { operationId?: unknown } } | undefined)?.ref?.operationId;
    if (typeof operationId === "string" && operationId !== "") span.setAttribute("idempotency.operation_id", operationId);
    try {
      const res = await context.with(trace.setSpan(parent, span), () => next(req));
      span.setAttribute("rpc.grpc.status_code", 0);
      return res;
    } catch (error) {
      const code = ConnectError.from(error).code;
      span.setAttribute("rpc.grpc.status_code", code);
      span.setStatus({ code: SpanStatusCode.ERROR, message: Code[code] });
      throw error;
    } finally {
      span.end();
    }
  };
}
