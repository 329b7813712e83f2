import { randomBytes } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import type { Tracer } from "@opentelemetry/api";
import type { Logger } from "pino";
import { afterAll, beforeAll } from "vitest";
import { loadConfig, type Config } from "../../src/config.js";
import type { CallerGrant } from "../../src/server/callers.js";
import type { FaultHooks } from "../../src/fault-hooks.js";
import { CoordinatorService, OperationRefSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { CoordinatorClient, type CoordinatorClientOptions } from "../../src/gateway/index.js";
import type { PolicyDocument } from "../../src/policy/document.js";
import type { SnapshotKeyring } from "../../src/crypto/sealing.js";
import { startCoordinator, type RunningCoordinator } from "../../src/server/app.js";
import { tokenHash } from "../../src/server/callers.js";
import type { TestDatabase } from "./database.js";
import { silentLogger } from "./database.js";
import { testDocument } from "./fixtures.js";
import { expireLease } from "./registry-helpers.js";
import { until } from "./wait.js";

/** Tokens of the callers every test server knows. */
export interface TestTokens {
  /** gateway role, tenant acme, operation payments.create */
  gateway: string;
  /** worker role, every tenant and operation */
  worker: string;
  /** operator role, tenant acme */
  operator: string;
  /** operator role, every tenant ("*"): may also take the actions that affect every tenant */
  allTenantsOperator: string;
  /** gateway role, tenant globex only */
  globex: string;
}

export interface TestServer {
  coordinator: RunningCoordinator;
  /** http://127.0.0.1:<rpc port> */
  baseUrl: string;
  adminUrl: string;
  tokens: TestTokens;
  /** application_name of the server's registry connections. */
  applicationName: string;
  /** The key ring the server seals stored bodies with (a co-located service needs the same). */
  snapshotKeys: SnapshotKeyring | undefined;
  stop(): Promise<void>;
}

/** How a test server is started: what it differs in from the default (payments.create@1, every test caller). */
export interface TestServerOptions {
  operations?: PolicyDocument[];
  config?: Partial<Config>;
  tracer?: Tracer;
  hooks?: FaultHooks;
  logger?: Logger;
  /** Another replica of this server: its callers' tokens and its key ring. */
  replicaOf?: TestServer;
  /** Where the server connects instead of the test file's database (a pooler in front of it, say). */
  databaseUrl?: string;
}

/** A real coordinator on ephemeral ports, over the test file's schema. */
export async function startTestServer(t: TestDatabase, options: TestServerOptions = {}): Promise<TestServer> {
  const tokens: TestTokens = options.replicaOf?.tokens ?? {
    gateway: `gw_${randomBytes(16).toString("hex")}`,
    worker: `wk_${randomBytes(16).toString("hex")}`,
    operator: `op_${randomBytes(16).toString("hex")}`,
    allTenantsOperator: `oa_${randomBytes(16).toString("hex")}`,
    globex: `gx_${randomBytes(16).toString("hex")}`,
  };
  const callers: CallerGrant[] = [
    { name: "payments-gateway", tokenSha256: tokenHash(tokens.gateway), tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] },
    { name: "recovery-worker", tokenSha256: tokenHash(tokens.worker), tenants: ["*"], operations: ["*"], roles: ["worker"] },
    { name: "operator", tokenSha256: tokenHash(tokens.operator), tenants: ["acme"], operations: ["*"], roles: ["operator"] },
    { name: "all-tenants-operator", tokenSha256: tokenHash(tokens.allTenantsOperator), tenants: ["*"], operations: ["*"], roles: ["operator"] },
    { name: "globex-gateway", tokenSha256: tokenHash(tokens.globex), tenants: ["globex"], operations: ["payments.create"], roles: ["gateway"] },
  ];
  // Every test server seals stored bodies, as a production one must.
  const keyRing = JSON.stringify({ active: "test", keys: { test: randomBytes(32).toString("base64") } });
  const config: Config = {
    ...loadConfig({ DATABASE_URL: t.url, IDEM_SNAPSHOT_KEYS: keyRing }),
    host: "127.0.0.1",
    rpcPort: 0,
    adminPort: 0,
    callers,
    operations: options.operations ?? [testDocument()],
    shutdownGraceMs: 5000,
    ...(options.replicaOf ? { snapshotKeys: options.replicaOf.snapshotKeys } : {}),
    ...options.config,
  };
  const applicationName = `idem-server-${randomBytes(4).toString("hex")}`;
  const coordinator = await startCoordinator({
    config,
    databaseUrl: options.databaseUrl ?? t.url,
    logger: options.logger ?? silentLogger,
    databaseOptions: `-c search_path=${t.schema}`,
    applicationName,
    ...(options.tracer ? { tracer: options.tracer } : {}),
    ...(options.hooks ? { hooks: options.hooks } : {}),
  });
  return {
    coordinator,
    baseUrl: `http://127.0.0.1:${coordinator.rpcPort}`,
    adminUrl: `http://127.0.0.1:${coordinator.adminPort}`,
    tokens,
    applicationName,
    snapshotKeys: config.snapshotKeys,
    stop: () => coordinator.stop(),
  };
}

/** The test file's coordinator (useTestServer), and the gateway SDK's clients of it. */
export interface TestServerFixture extends TestServer {
  /**
   * A gateway SDK client of this server, acting with the gateway's token
   * unless `options` says otherwise; closed after the file's last test. For
   * the file's hooks and tests (the server is not started before them).
   */
  sdkClient(options?: Partial<CoordinatorClientOptions>): CoordinatorClient;
}

/**
 * Gives the calling test file a coordinator over `t`'s schema
 * (useTestDatabase, called first): started before the file's first test and
 * stopped after its last, the SDK clients made with `sdkClient` closed
 * first. `options` may be a function, called when the server starts, for
 * options that need the schema or what an earlier hook set up. The returned
 * object is filled in by the time the file's hooks and tests run.
 */
export function useTestServer(t: TestDatabase, options: TestServerOptions | (() => TestServerOptions | Promise<TestServerOptions>) = {}): TestServerFixture {
  const clients: CoordinatorClient[] = [];
  const fixture = {
    sdkClient(clientOptions: Partial<CoordinatorClientOptions> = {}) {
      const client = new CoordinatorClient({ baseUrl: fixture.baseUrl, token: fixture.tokens.gateway, ...clientOptions });
      clients.push(client);
      return client;
    },
  } as TestServerFixture;
  beforeAll(async () => {
    Object.assign(fixture, await startTestServer(t, typeof options === "function" ? await options() : options));
  });
  afterAll(async () => {
    for (const client of clients.splice(0)) client.close();
    await fixture.stop?.();
  });
  return fixture;
}

/** A Connect client of `server` over HTTP/2, and the call options that act as its gateway caller. */
export function gatewayClient(server: Pick<TestServer, "baseUrl" | "tokens">): {
  client: Client<typeof CoordinatorService>;
  call: { headers: { authorization: string } };
} {
  return {
    client: createClient(CoordinatorService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" })),
    call: { headers: { authorization: `Bearer ${server.tokens.gateway}` } },
  };
}

/** How many Reserves wait for an owner on `server` (wait_for_owner): its idem_reserves_waiting gauge on the admin port. */
export async function reservesWaiting(server: Pick<TestServer, "adminUrl">): Promise<number> {
  const text = await (await fetch(`${server.adminUrl}/metrics`)).text();
  return Number(/^idem_reserves_waiting (\d+)$/m.exec(text)?.[1] ?? NaN);
}

/**
 * Takes an operation its gateway owns (generation 1, tenant acme, or globex
 * by its own gateway) to UNKNOWN the way production does: an effect attempt
 * is registered, the lease ends (in database time), and the server's
 * recoverer finds it.
 */
export async function driveToUnknown(t: TestDatabase, server: TestServer, operationId: string, tenant: "acme" | "globex" = "acme"): Promise<void> {
  const { client } = gatewayClient(server);
  const call = { headers: { authorization: `Bearer ${tenant === "acme" ? server.tokens.gateway : server.tokens.globex}` } };
  const ref = create(OperationRefSchema, { tenant, operationId });
  await client.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "card-provider" }, call);
  await expireLease(t.pool, operationId);
  // The recoverer's next pass finds it, within one of the server's intervals.
  await until(async () => {
    const { rows } = await t.pool.query<{ state: string }>("SELECT state FROM idem_record WHERE operation_id = $1", [operationId]);
    return rows[0]?.state === "UNKNOWN";
  }, `the recoverer to turn ${operationId} UNKNOWN`);
}
