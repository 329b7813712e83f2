import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { SpanKind, SpanStatusCode } from "@opentelemetry/api";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CoordinatorService } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { startTestServer, type TestServer } from "../support/server.js";

const t = useTestDatabase();
const exporter = new InMemorySpanExporter();
const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] });
let server: TestServer;

beforeAll(async () => {
  server = await startTestServer(t, { tracer: provider.getTracer("test") });
});
afterAll(async () => {
  await server?.stop();
  await provider.shutdown();
});

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

    const spans = exporter.getFinishedSpans();
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
});
