import { afterAll, beforeAll } from "vitest";
import { startPaymentsApp, type PaymentsApp, type PaymentsAppOptions } from "../../examples/payments/app.js";
import { paymentsPolicy } from "../../examples/payments/policy.js";
import type { TestDatabase } from "../support/database.js";
import { startTestServer, type TestServer } from "../support/server.js";

export type PaymentsMode = "co-located" | "remote";

/**
 * A coordinator and the payments example in both of its modes, for all the
 * tests of a file: started before the first, stopped after the last.
 * Co-located: the service's tables share the registry's schema, and each
 * payment's final state, outbox row and terminal state commit together.
 * Remote: the tables in a schema of their own (`remoteSchema`); Complete over RPC.
 */
export function usePaymentsApps(
  t: TestDatabase,
  options: Omit<PaymentsAppOptions, "coordinatorUrl" | "gatewayToken" | "workerToken" | "pool" | "schema" | "colocated">,
): { apps: Record<PaymentsMode, PaymentsApp>; server: () => TestServer; remoteSchema: () => string } {
  const apps = {} as Record<PaymentsMode, PaymentsApp>;
  const remoteSchema = () => `${t.schema}_svc`;
  let server: TestServer | undefined;
  beforeAll(async () => {
    server = await startTestServer(t, { operations: [paymentsPolicy()] });
    const common = { ...options, coordinatorUrl: server.baseUrl, gatewayToken: server.tokens.gateway, workerToken: server.tokens.worker };
    // Co-located completion seals with the coordinator's key ring, as a deployment must.
    apps["co-located"] = await startPaymentsApp({ ...common, pool: t.openPool(), colocated: true, ...(server.snapshotKeys ? { snapshotKeys: server.snapshotKeys } : {}) });
    apps.remote = await startPaymentsApp({ ...common, pool: t.openPool(), schema: remoteSchema(), colocated: false });
  });
  afterAll(async () => {
    await apps["co-located"]?.close();
    await apps.remote?.close();
    await server?.stop();
    await t.pool?.query(`DROP SCHEMA IF EXISTS "${remoteSchema()}" CASCADE`);
  });
  return { apps, server: () => server!, remoteSchema };
}
