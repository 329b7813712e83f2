import { createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import pino from "pino";
import { beforeAll, describe, expect, it } from "vitest";
import { Health } from "../../src/gen/grpc/health/v1/health_pb.js";
import { AdminService } from "../../src/gen/idempotency/v1/admin_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { gatewayClient, useTestServer } from "../support/server.js";
import { until } from "../support/wait.js";

/**
 * A client that stops following a stream (Ctrl-C on `idemctl events --follow`,
 * a load balancer dropping its Health/Watch) does nothing wrong: the server
 * logs it at debug, never as an error with a stack.
 */
interface LogLine {
  level: number;
  msg: string;
  [field: string]: unknown;
}

const lines: LogLine[] = [];
const t = useTestDatabase();
const server = useTestServer(t, { logger: pino({ level: "debug" }, { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) }) });

beforeAll(async () => {
  // An event for StreamEvents to send before it follows.
  const { client, call } = gatewayClient(server);
  await client.reserve(
    {
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: newKey(),
      request: { case: "parts", value: { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode("{}") } },
    },
    call,
  );
});

const WARN = 40;
const DEBUG = 20;

/** Follows a stream until its first message, then cancels it as a client's Ctrl-C does. */
async function cancelAfterFirst(follow: (signal: AbortSignal) => AsyncIterable<unknown>): Promise<void> {
  const cancel = new AbortController();
  try {
    for await (const _ of follow(cancel.signal)) cancel.abort();
  } catch (error) {
    if (!cancel.signal.aborted) throw error;
  }
}

const transports: Record<string, () => Transport> = {
  gRPC: () => createGrpcTransport({ baseUrl: server.baseUrl }),
  Connect: () => createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "1.1" }),
};

describe("a client cancelling a stream", () => {
  for (const [protocol, transport] of Object.entries(transports)) {
    it(`is logged at debug, not as an error, over ${protocol}: Health/Watch and a followed StreamEvents`, async () => {
      const from = lines.length;
      const health = createClient(Health, transport());
      await cancelAfterFirst((signal) => health.watch({ service: "" }, { signal }));
      const admin = createClient(AdminService, transport());
      await cancelAfterFirst((signal) => admin.streamEvents({ follow: true }, { signal, headers: { authorization: `Bearer ${server.tokens.allTenantsOperator}` } }));
      const cancelled = () => lines.slice(from).filter((line) => line.level === DEBUG && /cancel/.test(line.msg));
      await until(() => cancelled().length >= 2, "both cancellations to be logged");
      const rpcs = cancelled().map((line) => line.rpc);
      expect(rpcs.sort()).toEqual(["StreamEvents", "Watch"]);
      const loud = lines.slice(from).filter((line) => line.level >= WARN);
      expect(loud).toEqual([]);
    });
  }

  it("is logged at debug when a grpc-js client cancels its call", async () => {
    const from = lines.length;
    const client = new grpc.Client(`127.0.0.1:${server.coordinator.rpcPort}`, grpc.credentials.createInsecure());
    try {
      const call = client.makeServerStreamRequest(
        "/grpc.health.v1.Health/Watch",
        (b: Uint8Array) => Buffer.from(b),
        (b: Buffer) => b,
        new Uint8Array(0),
        new grpc.Metadata(),
      );
      await new Promise<void>((resolve) => {
        call.once("data", () => {
          call.cancel();
          resolve();
        });
      });
      call.on("error", () => undefined);
      const cancelled = () =>
        lines
          .slice(from)
          .filter((line) => line.level === DEBUG && /cancel/.test(line.msg))
          .map((line) => line.rpc);
      await until(() => cancelled().length >= 1, "the cancellation to be logged");
      expect(cancelled()).toEqual(["Watch"]);
      expect(lines.slice(from).filter((line) => line.level >= WARN)).toEqual([]);
    } finally {
      client.close();
    }
  });
});
