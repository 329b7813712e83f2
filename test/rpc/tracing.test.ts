import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { context, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import pino from "pino";
import { CoordinatorClient } from "../../src/gateway/client.js";
import { traceFields } from "../../src/server/tracing.js";
import { jsonParts } from "../support/fixtures.js";
import { afterAll, describe, expect, it } from "vitest";
import { CoordinatorService } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";

const t = useTestDatabase();
const exporter = new InMemorySpanExporter();
const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] });
/** The server's log lines, as JSON. */
const logLines: Array<Record<string, unknown>> = [];
// After the server has stopped.
afterAll(() => provider.shutdown());
// Logs at debug (the per-RPC lines), with the trace fields as a coordinator started by `npm start` writes them.
const logger = pino({ level: "debug", mixin: traceFields }, { write: (line: string) => void logLines.push(JSON.parse(line) as Record<string, unknown>) });
const server = useTestServer(t, { tracer: provider.getTracer("test"), logger });

describe("OpenTelemetry", () => {
  it("makes one server span per RPC that continues the caller's trace, with the status code", async () => {
    const client = createClient(CoordinatorService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" }));
    const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
    const headers = { authorization: `Bearer ${server.tokens.gateway}`, traceparent: `00-${traceId}-00f067aa0ba902b7-01` };
    await client.reserve(
      {
        subject: { tenant: "acme", principal: "alice" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: newKey(),
        request: {
          case: "parts",
          value: { $typeName: "idempotency.v1.HttpRequestParts", method: "POST", path: "/v1/p", query: "", mediaType: "", headers: [], body: new Uint8Array() },
        },
      },
      { headers },
    );
    await client.reserve({}, { headers }).catch(() => undefined);

    const spans = exporter.getFinishedSpans().filter((span) => span.kind === SpanKind.SERVER);
    expect(spans).toHaveLength(2);
    for (const span of spans) {
      expect(span.name).toBe("idempotency.v1.CoordinatorService/Reserve");
      expect(span.kind).toBe(SpanKind.SERVER);
      expect(span.spanContext().traceId).toBe(traceId);
      expect(span.parentSpanContext?.spanId).toBe("00f067aa0ba902b7");
    }
    expect(spans[0]!.attributes).toMatchObject({ "rpc.system": "connect_rpc", "rpc.method": "Reserve", "rpc.grpc.status_code": 0 });
    expect(spans[1]!.attributes["rpc.grpc.status_code"]).toBe(3);
    expect(spans[1]!.status.code).toBe(SpanStatusCode.ERROR);
    expect(JSON.stringify(spans.map((s) => s.attributes))).not.toMatch(/idempotencyKey|alice/);
  });

  it("writes the trace and span ids on the log lines of a traced RPC", async () => {
    const client = createClient(CoordinatorService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" }));
    const traceId = "0af7651916cd43dd8448eb211c80319c";
    await client
      .lookup(
        { by: { case: "ref", value: { tenant: "acme", operationId: "01890000-0000-7000-8000-000000000000" } }, subject: { tenant: "acme", principal: "alice" } },
        { headers: { authorization: `Bearer ${server.tokens.gateway}`, traceparent: `00-${traceId}-b7ad6b7169203331-01` } },
      )
      .catch(() => undefined);
    const lines = logLines.filter((line) => line.traceId === traceId);
    expect(lines.length).toBeGreaterThan(0);
    expect(lines.some((line) => line.rpc === "Lookup")).toBe(true);
    for (const line of lines) expect(line.spanId).toMatch(/^[0-9a-f]{16}$/);
  });

  it("continues each batched call's own trace from the gateway SDK, with its database transactions as child spans", async () => {
    propagation.setGlobalPropagator(new W3CTraceContextPropagator());
    const callers = new TracerProvider().getTracer("gateway");
    const gateway = new CoordinatorClient({ baseUrl: server.baseUrl, token: server.tokens.gateway });
    try {
      exporter.reset();
      const requests = ["first", "second"].map((name) => callers.startSpan(`POST /v1/payments (${name})`));
      // Both in one turn: the SDK carries them in one Batch RPC, each with its own trace context.
      await Promise.all(
        requests.map((span) =>
          context.with(trace.setSpan(ROOT_CONTEXT, span), () =>
            gateway.reserve({
              subject: { tenant: "acme", principal: "alice" },
              operation: "payments.create",
              apiRevision: 1,
              idempotencyKey: newKey(),
              parts: jsonParts({ amount: 10 }),
            }),
          ),
        ),
      );
      const spans = exporter.getFinishedSpans();
      expect(spans.some((span) => span.name === "idempotency.v1.CoordinatorService/Batch")).toBe(true);
      const reserves = spans.filter((span) => span.name === "idempotency.v1.CoordinatorService/Reserve");
      expect(reserves).toHaveLength(2);
      for (const request of requests) {
        const own = reserves.find((span) => span.spanContext().traceId === request.spanContext().traceId);
        expect(own?.parentSpanContext?.spanId, "a Reserve span in its request's trace").toBe(request.spanContext().spanId);
        expect(own!.attributes["idempotency.batched"]).toBe(true);
      }
      const transactions = spans.filter((span) => span.name === "registry reserve");
      expect(transactions.length).toBeGreaterThan(0);
      for (const transaction of transactions) {
        expect(transaction.kind).toBe(SpanKind.CLIENT);
        expect(reserves.map((span) => span.spanContext().spanId)).toContain(transaction.parentSpanContext?.spanId);
      }
    } finally {
      gateway.close();
      propagation.disable();
    }
  });
});
