import { create } from "@bufbuild/protobuf";
import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { AdminService } from "../../src/gen/idempotency/v1/admin_pb.js";
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

/** AdminService as the console page calls it: Connect JSON on the admin port, under /console/. */
export function consoleClient(server: Pick<TestServer, "adminUrl">): Client<typeof AdminService> {
  return createClient(AdminService, createConnectTransport({ baseUrl: `${server.adminUrl}/console`, httpVersion: "1.1" }));
}

/** The call options of a caller with this token. */
export const as = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });

/** An AdminService method called as the page's Connect client calls it (a JSON POST on the admin port): the HTTP answer as it is. */
export async function consoleCall<T = Record<string, unknown>>(
  server: Pick<TestServer, "adminUrl">,
  token: string,
  method: string,
  body: unknown = {},
): Promise<{ status: number; headers: Headers; body: T }> {
  const response = await fetch(`${server.adminUrl}/console/idempotency.v1.AdminService/${method}`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: response.status, headers: response.headers, body: (await response.json()) as T };
}
