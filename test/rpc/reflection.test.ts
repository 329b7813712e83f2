import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../support/database.js";
import { useTestServer } from "../support/server.js";

/**
 * Server reflection: buf curl, with no copy of proto/, lists the methods of
 * a running coordinator and calls them, over both reflection versions; with
 * IDEM_REFLECTION=false there is nothing to ask.
 */
const run = promisify(execFile);
const t = useTestDatabase();
const server = useTestServer(t);
const closed = useTestServer(t, { config: { reflection: false } });

/** `buf curl` from the project's own devDependency, without --schema: what it knows comes from the server. */
function bufCurl(args: string[]) {
  return run("npx", ["buf", "curl", "--http2-prior-knowledge", ...args], { timeout: 60_000 });
}

describe("server reflection", () => {
  it.each(["grpc-v1", "grpc-v1alpha"])("lists every method of the coordinator's services to buf curl (%s)", async (protocol) => {
    const { stdout } = await bufCurl(["--reflect-protocol", protocol, "--list-methods", server.baseUrl]);
    const methods = stdout.trim().split("\n");
    expect(methods).toEqual(
      expect.arrayContaining([
        "idempotency.v1.CoordinatorService/Reserve",
        "idempotency.v1.CoordinatorService/Complete",
        "idempotency.v1.CoordinatorService/Batch",
        "idempotency.v1.AdminService/Reconcile",
        "grpc.health.v1.Health/Check",
      ]),
    );
  });

  it("lets buf curl call Reserve with the schema it learned, over gRPC, with the caller's token", async () => {
    const request = {
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: randomUUID(),
      parts: { method: "POST", path: "/v1/payments", mediaType: "application/json", body: Buffer.from('{"amount":10}').toString("base64") },
    };
    const { stdout } = await bufCurl([
      "--protocol",
      "grpc",
      "-H",
      `Authorization: Bearer ${server.tokens.gateway}`,
      "-d",
      JSON.stringify(request),
      `${server.baseUrl}/idempotency.v1.CoordinatorService/Reserve`,
    ]);
    expect(JSON.parse(stdout)).toMatchObject({ decision: "DECISION_ACCEPTED", state: "RECORD_STATE_RESERVED", contractVersion: "http.idempotency.v1" });
  });

  it("answers nothing when switched off (IDEM_REFLECTION=false)", async () => {
    const failed = await bufCurl(["--list-methods", closed.baseUrl]).then(
      () => undefined,
      (error: { stderr: string }) => error,
    );
    expect(failed?.stderr).toMatch(/unimplemented|not implemented/i);
  });
});
