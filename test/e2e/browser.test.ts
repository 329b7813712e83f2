import { existsSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { chromium, type Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Decision, LookupRequestSchema, LookupResponseSchema, ReserveRequestSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { gatewayClient, startTestServer, type TestServer } from "../support/server.js";

// A real page in headless Chromium calls Lookup over Connect and over gRPC-Web
// on a coordinator that allows the page's origin (IDEM_CORS_ORIGINS), and
// cannot from another origin. CI installs Chromium (.ci/run); without it here
// the file is skipped with a warning.
const CHROMIUM = "/usr/bin/chromium";
const skipHere = !existsSync(CHROMIUM) && process.env.CI !== "true";
if (skipHere) process.stderr.write(`skipping the browser test: ${CHROMIUM} is missing (apt-get install -y chromium)\n`);

const t = useTestDatabase();
let server: TestServer;
let browser: Browser;
let allowedPage: Server;
let otherPage: Server;

/** A server of one empty page: what a page of that origin runs is given by the test. */
async function pageServer(): Promise<Server> {
  const page = createServer((_req, res) => res.writeHead(200, { "content-type": "text/html" }).end("<!doctype html><title>page</title>"));
  await new Promise<void>((resolve) => page.listen(0, "127.0.0.1", resolve));
  return page;
}
const originOf = (page: Server) => `http://127.0.0.1:${(page.address() as AddressInfo).port}`;

beforeAll(async () => {
  allowedPage = await pageServer();
  otherPage = await pageServer();
  server = await startTestServer(t, { config: { corsOrigins: [originOf(allowedPage)] } });
  if (skipHere) return;
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
});
afterAll(async () => {
  await browser?.close();
  await server?.stop();
  await new Promise((resolve) => allowedPage?.close(resolve));
  await new Promise((resolve) => otherPage?.close(resolve));
});

/** A record of alice's, and the Lookup that reads it. */
async function aliceRecord() {
  const { client, call } = gatewayClient(server);
  const reserved = await client.reserve(
    create(ReserveRequestSchema, {
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: newKey(),
      request: {
        case: "parts",
        value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode("{}") }),
      },
    }),
    call,
  );
  expect(reserved.decision).toBe(Decision.ACCEPTED);
  const lookup = create(LookupRequestSchema, {
    by: { case: "ref", value: { tenant: "acme", operationId: reserved.operationId } },
    subject: { tenant: "acme", principal: "alice" },
  });
  return { operationId: reserved.operationId, lookup };
}

describe.skipIf(skipHere)("a browser page calling the coordinator (CORS)", () => {
  it("reads a record over Connect (JSON) from an allowed origin", async () => {
    const { operationId } = await aliceRecord();
    const page = await browser.newPage();
    await page.goto(originOf(allowedPage));
    const answer = await page.evaluate(
      async ({ url, token, id }) => {
        const res = await fetch(`${url}/idempotency.v1.CoordinatorService/Lookup`, {
          method: "POST",
          headers: { "content-type": "application/json", "connect-protocol-version": "1", authorization: `Bearer ${token}` },
          body: JSON.stringify({ ref: { tenant: "acme", operationId: id }, subject: { tenant: "acme", principal: "alice" } }),
        });
        return { status: res.status, body: (await res.json()) as { record?: { operationId?: string; state?: string } } };
      },
      { url: server.baseUrl, token: server.tokens.gateway, id: operationId },
    );
    expect(answer.status).toBe(200);
    expect(answer.body.record).toMatchObject({ operationId, state: "RECORD_STATE_RESERVED" });
    await page.close();
  });

  it("reads a record over gRPC-Web (binary frames) from an allowed origin, the status trailer readable", async () => {
    const { operationId, lookup } = await aliceRecord();
    const message = toBinary(LookupRequestSchema, lookup);
    const frame = [0, (message.length >>> 24) & 255, (message.length >>> 16) & 255, (message.length >>> 8) & 255, message.length & 255, ...message];
    const page = await browser.newPage();
    await page.goto(originOf(allowedPage));
    const answer = await page.evaluate(
      async ({ url, token, frame }) => {
        const res = await fetch(`${url}/idempotency.v1.CoordinatorService/Lookup`, {
          method: "POST",
          headers: { "content-type": "application/grpc-web+proto", "x-grpc-web": "1", authorization: `Bearer ${token}` },
          body: new Uint8Array(frame),
        });
        return { status: res.status, bytes: [...new Uint8Array(await res.arrayBuffer())] };
      },
      { url: server.baseUrl, token: server.tokens.gateway, frame },
    );
    expect(answer.status).toBe(200);
    const bytes = Uint8Array.from(answer.bytes);
    // The first frame is the message, the last (flag 0x80) the trailers.
    expect(bytes[0]).toBe(0);
    const length = (bytes[1]! << 24) | (bytes[2]! << 16) | (bytes[3]! << 8) | bytes[4]!;
    expect(fromBinary(LookupResponseSchema, bytes.subarray(5, 5 + length)).record?.operationId).toBe(operationId);
    const trailers = new TextDecoder().decode(bytes.subarray(5 + length + 5));
    expect(bytes[5 + length]).toBe(0x80);
    expect(trailers).toMatch(/grpc-status:\s*0/);
    await page.close();
  });

  it("gives a page of any other origin nothing: its browser refuses the call", async () => {
    const page = await browser.newPage();
    await page.goto(originOf(otherPage));
    const failure = await page.evaluate(
      async ({ url, token }) => {
        try {
          await fetch(`${url}/idempotency.v1.CoordinatorService/Lookup`, {
            method: "POST",
            headers: { "content-type": "application/json", "connect-protocol-version": "1", authorization: `Bearer ${token}` },
            body: "{}",
          });
          return "answered";
        } catch (error) {
          return (error as Error).name;
        }
      },
      { url: server.baseUrl, token: server.tokens.gateway },
    );
    expect(failure).toBe("TypeError");
    await page.close();
  });
});

describe("the preflight", () => {
  it("answers an allowed origin with the methods and headers Connect and gRPC-Web send, and another origin with no CORS header", async () => {
    const ask = (origin: string) =>
      fetch(`${server.baseUrl}/idempotency.v1.CoordinatorService/Lookup`, {
        method: "OPTIONS",
        headers: { origin, "access-control-request-method": "POST", "access-control-request-headers": "content-type,authorization,x-grpc-web" },
      });
    const allowed = await ask(originOf(allowedPage));
    expect(allowed.status).toBe(204);
    expect(allowed.headers.get("access-control-allow-origin")).toBe(originOf(allowedPage));
    expect(allowed.headers.get("access-control-allow-methods")).toMatch(/POST/);
    const headers = allowed.headers.get("access-control-allow-headers")!.toLowerCase();
    for (const header of ["content-type", "authorization", "x-grpc-web", "connect-protocol-version"]) expect(headers).toContain(header);
    const other = await ask(originOf(otherPage));
    expect(other.headers.get("access-control-allow-origin")).toBeNull();
  });
});
