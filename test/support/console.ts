import { create } from "@bufbuild/protobuf";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { gatewayClient, type TestServer } from "./server.js";

/** The two tenants of the console's tests, each with its principal and the gateway token that acts for it. */
export const TENANTS = {
  acme: { principal: "alice", token: (server: TestServer) => server.tokens.gateway },
  globex: { principal: "gus", token: (server: TestServer) => server.tokens.globex },
} as const;
export type Tenant = keyof typeof TENANTS;

/** A Reserve of payments.create@1 for a tenant's principal, by that tenant's gateway. */
export function reserveFor(server: TestServer, tenant: Tenant, key: string, body: string, claim = false) {
  const { principal, token } = TENANTS[tenant];
  return gatewayClient(server).client.reserve(
    {
      subject: { tenant, principal },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: key,
      claim,
      request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", body: new TextEncoder().encode(body) }) },
    },
    { headers: { authorization: `Bearer ${token(server)}` } },
  );
}

/** An endpoint of the console's API called as the page calls it: its status and JSON answer. */
export async function consoleCall<T = Record<string, unknown>>(server: TestServer, token: string, endpoint: string, body?: unknown): Promise<{ status: number; body: T }> {
  const response = await fetch(`${server.adminUrl}/console/api/${endpoint}`, {
    method: body === undefined ? "GET" : "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  return { status: response.status, body: (await response.json()) as T };
}
