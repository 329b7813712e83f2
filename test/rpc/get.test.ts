import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { create, toJsonString } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { Decision, LookupRequestSchema, ReserveRequestSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { wireReason } from "../support/refusals.js";
import { gatewayClient, useTestServer } from "../support/server.js";

/**
 * The RPCs that only read (idempotency_level = NO_SIDE_EFFECTS in the proto)
 * answer Connect GET requests: a plain URL with curl (or a Connect client
 * created with `useHttpGet: true`). Every other RPC refuses GET.
 */
const curl = promisify(execFile);
const t = useTestDatabase();
const server = useTestServer(t);

const subject = { tenant: "acme", principal: "alice" };

function reserveRequest(key: string) {
  return create(ReserveRequestSchema, {
    subject,
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: key,
    request: {
      case: "parts",
      value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode("{}") }),
    },
  });
}

/** curl --get of a Connect GET URL; its status line and body. */
async function get(path: string, message: string, token: string): Promise<{ status: number; body: string }> {
  const { stdout } = await curl("curl", [
    "-sS",
    "--get",
    `${server.baseUrl}${path}`,
    "--data-urlencode",
    "connect=v1",
    "--data-urlencode",
    "encoding=json",
    "--data-urlencode",
    `message=${message}`,
    "-H",
    `Authorization: Bearer ${token}`,
    "-w",
    "\n%{http_code}",
  ]);
  const at = stdout.lastIndexOf("\n");
  return { status: Number(stdout.slice(at + 1)), body: stdout.slice(0, at) };
}

describe("Connect GET for the RPCs that only read", () => {
  it("answers Lookup at a plain URL (curl), as the POST would", async () => {
    const { client, call } = gatewayClient(server);
    const key = newKey();
    const reserved = await client.reserve(reserveRequest(key), call);
    expect(reserved.decision).toBe(Decision.ACCEPTED);
    const lookup = create(LookupRequestSchema, { subject, by: { case: "ref", value: { tenant: "acme", operationId: reserved.operationId } } });
    const answer = await get("/idempotency.v1.CoordinatorService/Lookup", toJsonString(LookupRequestSchema, lookup), server.tokens.gateway);
    expect(answer.status).toBe(200);
    expect(JSON.parse(answer.body)).toMatchObject({ record: { operationId: reserved.operationId, state: "RECORD_STATE_RESERVED" } });
  });

  it("answers the operators' reads over GET too (ListPolicies), and refuses a caller without a token as the POST does", async () => {
    const listed = await get("/idempotency.v1.AdminService/ListPolicies", "{}", server.tokens.operator);
    expect(listed.status).toBe(200);
    const { policies } = JSON.parse(listed.body) as { policies: Array<{ policy: { operation: string } }> };
    expect(policies.map((p) => p.policy.operation)).toContain("payments.create");
    const anonymous = await get("/idempotency.v1.AdminService/ListPolicies", "{}", "not-a-token");
    expect(anonymous.status).toBe(401);
    expect(JSON.parse(anonymous.body)).toMatchObject({ code: "unauthenticated" });
  });

  it("answers every read with Cache-Control: no-store, private, so that no cache between keeps a caller's records", async () => {
    const { client, call } = gatewayClient(server);
    const reserved = await client.reserve(reserveRequest(newKey()), call);
    const lookup = create(LookupRequestSchema, { subject, by: { case: "ref", value: { tenant: "acme", operationId: reserved.operationId } } });
    const reads: Array<[string, string, string]> = [
      ["/idempotency.v1.CoordinatorService/Lookup", toJsonString(LookupRequestSchema, lookup), server.tokens.gateway],
      ["/idempotency.v1.CoordinatorService/ListRecoverable", "{}", server.tokens.worker],
      ["/idempotency.v1.AdminService/ListRecords", "{}", server.tokens.operator],
      ["/idempotency.v1.AdminService/ListPolicies", "{}", server.tokens.operator],
      ["/idempotency.v1.AdminService/ListOperationControls", "{}", server.tokens.operator],
      ["/idempotency.v1.AdminService/ListNewestRecords", "{}", server.tokens.operator],
      ["/idempotency.v1.AdminService/GetRecordHistory", JSON.stringify({ ref: { tenant: "acme", operationId: reserved.operationId } }), server.tokens.operator],
      // A refusal is not to be kept either.
      ["/idempotency.v1.AdminService/ListRecords", "{}", server.tokens.gateway],
    ];
    for (const [path, message, token] of reads) {
      const url = `${server.baseUrl}${path}?${new URLSearchParams({ connect: "v1", encoding: "json", message }).toString()}`;
      const response = await fetch(url, { headers: { authorization: `Bearer ${token}` } });
      expect(response.status, path).toBe(token === server.tokens.gateway && path.includes("AdminService") ? 403 : 200);
      expect(response.headers.get("cache-control"), path).toBe("no-store, private");
    }
    // The same read over POST says the same.
    const posted = await fetch(`${server.baseUrl}/idempotency.v1.CoordinatorService/Lookup`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${server.tokens.gateway}` },
      body: toJsonString(LookupRequestSchema, lookup),
    });
    expect(posted.headers.get("cache-control")).toBe("no-store, private");
  });

  it("refuses GET for an RPC that writes, and stores nothing", async () => {
    const key = newKey();
    const count = async () => (await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record")).rows[0]!.n;
    const before = await count();
    const refused = await get("/idempotency.v1.CoordinatorService/Reserve", toJsonString(ReserveRequestSchema, reserveRequest(key)), server.tokens.gateway);
    expect(refused.status).toBe(405);
    expect(await count()).toBe(before);
    const { client, call } = gatewayClient(server);
    const lookup = client.lookup({ subject, by: { case: "scope", value: { subject, operation: "payments.create", apiRevision: 1, idempotencyKey: key } } }, call);
    expect(await wireReason(lookup)).toBe("NOT_FOUND");
  });
});
