import { randomBytes } from "node:crypto";
import type { Tracer } from "@opentelemetry/api";
import { loadConfig, type CallerGrant, type Config } from "../../src/config.js";
import type { PolicyDocument } from "../../src/policy/document.js";
import { parseKeyring } from "../../src/registry/sealing.js";
import { startCoordinator, type RunningCoordinator } from "../../src/server/app.js";
import { tokenHash } from "../../src/server/callers.js";
import type { TestDatabase } from "./database.js";
import { silentLogger } from "./database.js";
import { testDocument } from "./fixtures.js";

/** Tokens of the callers every test server knows. */
export interface TestTokens {
  /** gateway role, tenant acme, operation payments.create */
  gateway: string;
  /** worker role, every tenant and operation */
  worker: string;
  /** operator role, tenant acme */
  operator: string;
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
  stop(): Promise<void>;
}

/** A real coordinator on ephemeral ports, over the test file's schema. */
export async function startTestServer(
  t: TestDatabase,
  options: { operations?: PolicyDocument[]; config?: Partial<Config>; tracer?: Tracer } = {},
): Promise<TestServer> {
  const tokens: TestTokens = {
    gateway: `gw_${randomBytes(16).toString("hex")}`,
    worker: `wk_${randomBytes(16).toString("hex")}`,
    operator: `op_${randomBytes(16).toString("hex")}`,
    globex: `gx_${randomBytes(16).toString("hex")}`,
  };
  const callers: CallerGrant[] = [
    { name: "payments-gateway", tokenSha256: tokenHash(tokens.gateway), tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] },
    { name: "recovery-worker", tokenSha256: tokenHash(tokens.worker), tenants: ["*"], operations: ["*"], roles: ["worker"] },
    { name: "operator", tokenSha256: tokenHash(tokens.operator), tenants: ["acme"], operations: ["*"], roles: ["operator"] },
    { name: "globex-gateway", tokenSha256: tokenHash(tokens.globex), tenants: ["globex"], operations: ["payments.create"], roles: ["gateway"] },
  ];
  const config: Config = {
    ...loadConfig({ DATABASE_URL: t.url }),
    host: "127.0.0.1",
    rpcPort: 0,
    adminPort: 0,
    callers,
    operations: options.operations ?? [testDocument()],
    // Every test server seals stored bodies, as a production one should.
    snapshotKeys: parseKeyring({ active: "test", keys: { test: randomBytes(32).toString("base64") } }),
    shutdownGraceMs: 5000,
    ...options.config,
  };
  const applicationName = `idem-server-${randomBytes(4).toString("hex")}`;
  const coordinator = await startCoordinator({
    config,
    databaseUrl: t.url,
    logger: silentLogger,
    databaseOptions: `-c search_path=${t.schema}`,
    applicationName,
    ...(options.tracer ? { tracer: options.tracer } : {}),
  });
  return {
    coordinator,
    baseUrl: `http://127.0.0.1:${coordinator.rpcPort}`,
    adminUrl: `http://127.0.0.1:${coordinator.adminPort}`,
    tokens,
    applicationName,
    stop: () => coordinator.stop(),
  };
}
