import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { AdminService } from "../../src/gen/idempotency/v1/admin_pb.js";
import { ReserveRequestSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { gatewayClient, startTestServer, type TestServer } from "../support/server.js";

/** The access log: a line per RPC at info level by default (IDEM_ACCESS_LOG), as the README says. */
interface LogLine {
  level: number;
  msg: string;
  [field: string]: unknown;
}

const INFO = 30;
let t: TestDatabase;

/** A server logging at the default level (info) into `lines`, configured from `env` as a start would be. */
async function serverLoggingTo(lines: LogLine[], env: NodeJS.ProcessEnv, replicaOf?: TestServer): Promise<TestServer> {
  const logger = pino({ level: loadConfig(env).logLevel }, { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) });
  return startTestServer(t, { logger, config: { accessLog: loadConfig(env).accessLog }, ...(replicaOf ? { replicaOf } : {}) });
}

const reserve = (key: string) =>
  create(ReserveRequestSchema, {
    subject: { tenant: "acme", principal: "alice" },
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: key,
    request: {
      case: "parts",
      value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode("{}") }),
    },
  });

const defaultLines: LogLine[] = [];
const offLines: LogLine[] = [];
let byDefault: TestServer;
let turnedOff: TestServer;

beforeAll(async () => {
  t = await createTestDatabase();
  byDefault = await serverLoggingTo(defaultLines, {});
  turnedOff = await serverLoggingTo(offLines, { IDEM_ACCESS_LOG: "false" }, byDefault);
});
afterAll(async () => {
  await turnedOff?.stop();
  await byDefault?.stop();
  await t?.drop();
});

const rpcLines = (lines: LogLine[], from: number) => lines.slice(from).filter((line) => line.msg === "rpc");

describe("the access log", () => {
  it("writes one info line per RPC with its method, caller, code and duration, by default", async () => {
    const from = defaultLines.length;
    const { client, call } = gatewayClient(byDefault);
    const accepted = await client.reserve(reserve(newKey()), call);
    await client.reserve(reserve("too-short"), call).catch(() => undefined);
    const events = createClient(AdminService, createGrpcTransport({ baseUrl: byDefault.baseUrl }));
    for await (const _ of events.streamEvents({}, { headers: { authorization: `Bearer ${byDefault.tokens.allTenantsOperator}` } })) {
      // read to its end: the stream's line is written then
    }
    const lines = rpcLines(defaultLines, from);
    expect(lines.map(({ level, rpc, caller, code, operationId }) => ({ level, rpc, caller, code, operationId }))).toEqual([
      { level: INFO, rpc: "Reserve", caller: "payments-gateway", code: "ok", operationId: accepted.operationId },
      { level: INFO, rpc: "Reserve", caller: "payments-gateway", code: "InvalidArgument", operationId: undefined },
      { level: INFO, rpc: "StreamEvents", caller: "all-tenants-operator", code: "ok", operationId: undefined },
    ]);
    for (const line of lines) expect(line.ms).toEqual(expect.any(Number));
    // Never the key or a token.
    expect(JSON.stringify(lines)).not.toContain(byDefault.tokens.gateway);
    expect(JSON.stringify(lines)).not.toContain("too-short");
  });

  it("writes none at info with IDEM_ACCESS_LOG=false", async () => {
    expect(loadConfig({}).accessLog).toBe(true);
    expect(() => loadConfig({ IDEM_ACCESS_LOG: "sometimes" })).toThrow(/IDEM_ACCESS_LOG: must be true or false/);
    const from = offLines.length;
    const { client, call } = gatewayClient(turnedOff);
    await client.reserve(reserve(newKey()), call);
    await client.reserve(reserve("too-short"), call).catch(() => undefined);
    expect(rpcLines(offLines, from)).toEqual([]);
  });
});
