import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Writable } from "node:stream";
import pino from "pino";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { CoordinatorClient, IdempotencyGateway, type GatewayLogger, type GatewayOptions } from "../../src/gateway/index.js";
import { withIdempotency, writeResponse } from "../../src/gateway/node.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";
import { post } from "./helpers.js";

/**
 * What the gateway logs by default: the cause of a 500 `gateway-misconfigured`
 * and of a handler's exception, which the answer itself never tells.
 */

const t = useTestDatabase();
const coordinator = useTestServer(t, { operations: [testDocument({ operation: "payments.create" })] });
let client: CoordinatorClient;
const servers: Server[] = [];

beforeAll(async () => {
  // The worker token is granted every operation: an unpublished one is refused as UNKNOWN_OPERATION.
  client = coordinator.sdkClient({ token: coordinator.tokens.worker });
});

afterEach(() => {
  vi.restoreAllMocks();
});

afterAll(async () => {
  for (const server of servers) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

const boom = new Error("the business handler failed");

/** A server with two routes behind one gateway: an operation never published, and a handler that throws. */
async function serve(options: Partial<GatewayOptions> = {}): Promise<string> {
  const gateway = new IdempotencyGateway({ client, ...options });
  const subject = () => ({ tenant: "acme", principal: "alice" });
  const routes = new Map<string, (req: IncomingMessage, res: ServerResponse) => Promise<void>>([
    ["/unpublished", withIdempotency(gateway, { operation: "unpublished.create", apiRevision: 1, subject }, (_req, res) => writeResponse(res, { status: 201 }))],
    [
      "/throws",
      withIdempotency(gateway, { operation: "payments.create", apiRevision: 1, subject }, () => {
        throw boom;
      }),
    ],
  ]);
  const server = createServer((req, res) => void routes.get(req.url ?? "")?.(req, res));
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

describe("logging by default", () => {
  it("logs why a route is misconfigured to console.error, while the client gets 500 gateway-misconfigured", async () => {
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    const base = await serve();

    const answer = await post(`${base}/unpublished`, randomUUID(), { amount: 1 });

    expect(answer.status).toBe(500);
    expect(answer.json?.type).toBe("urn:problem-type:idempotency:gateway-misconfigured");
    expect(errors).toHaveBeenCalledWith(
      expect.stringContaining("refused this gateway's request"),
      expect.objectContaining({ operation: "unpublished.create", reason: "UNKNOWN_OPERATION" }),
    );
  });

  it("logs a handler's exception, with the error itself, to console.error", async () => {
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    const base = await serve();

    const answer = await post(`${base}/throws`, randomUUID(), { amount: 1 });

    expect(answer.status).toBe(503);
    expect(answer.json?.type).toBe("urn:problem-type:idempotency:retryable-failure");
    expect(errors).toHaveBeenCalledWith(expect.stringContaining("the handler threw"), expect.objectContaining({ operation: "payments.create", err: boom }));
  });
});

describe("the logger option", () => {
  it("takes any object with warn and error, and the console is left alone", async () => {
    const consoleErrors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    const logged: Array<{ obj: object; msg: string | undefined }> = [];
    const base = await serve({ logger: { warn: () => undefined, error: (obj, msg) => logged.push({ obj, msg }) } });

    expect((await post(`${base}/unpublished`, randomUUID(), { amount: 1 })).status).toBe(500);
    expect((await post(`${base}/throws`, randomUUID(), { amount: 1 })).status).toBe(503);

    expect(logged).toEqual([
      { obj: expect.objectContaining({ reason: "UNKNOWN_OPERATION" }) as object, msg: expect.stringContaining("refused") as string },
      { obj: expect.objectContaining({ err: boom }) as object, msg: "the handler threw" },
    ]);
    expect(consoleErrors).not.toHaveBeenCalled();
  });

  it("takes a pino logger, which serializes the handler's error with its stack", async () => {
    const lines: string[] = [];
    const destination = new Writable({
      write(chunk: Buffer, _encoding, done) {
        lines.push(chunk.toString());
        done();
      },
    });
    const base = await serve({ logger: pino({ level: "warn" }, destination) });

    expect((await post(`${base}/throws`, randomUUID(), { amount: 1 })).status).toBe(503);

    const entries = lines.map((line) => JSON.parse(line) as { msg: string; err?: { message: string; stack: string } });
    const thrown = entries.find((entry) => entry.msg === "the handler threw");
    expect(thrown?.err?.message).toBe(boom.message);
    expect(thrown?.err?.stack).toContain("logging.test.ts");
  });

  it("takes console itself", async () => {
    const errors = vi.spyOn(console, "error").mockImplementation(() => undefined);
    const logger: GatewayLogger = console;
    const base = await serve({ logger });

    expect((await post(`${base}/throws`, randomUUID(), { amount: 1 })).status).toBe(503);

    expect(errors).toHaveBeenCalledWith(expect.objectContaining({ err: boom }), "the handler threw");
  });
});
