import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import type { Charge, ProviderFaults } from "../../examples/payments/provider.js";
import { paymentsPolicy } from "../../examples/payments/policy.js";
import { tokenHash } from "../../src/server/callers.js";
import { freePort } from "../../src/net.js";
import { startChild, type Child } from "./process.js";

/**
 * The coordinator (one or several replicas on one registry), the card
 * provider and the payments service as processes, each of which can be killed
 * (SIGKILL: a crash) and started again on the same port: what the fault suite
 * and the launch gate drive. The service spreads its calls over the replicas
 * (the SDK's list of addresses), passing over one that is down.
 */
export interface ClusterOptions {
  /** The registry's (and, co-located, the service's) PostgreSQL. */
  databaseUrl: string;
  /** A schema for everything (PGOPTIONS search_path); default: the connection's. */
  schema?: string;
  /** The service's co-located mode (PAYMENTS_COLOCATED): true (default) the whole lifecycle in it, "completion" only Complete, false none. */
  colocated?: boolean | "completion";
  /** Coordinator replicas on the registry (default 1). */
  replicas?: number;
  /** Extra environment of the coordinator and the service (IDEM_FAILPOINTS, short leases, …). */
  coordinatorEnv?: Record<string, string>;
  serviceEnv?: Record<string, string>;
  /** Print the processes' output (for debugging). */
  verbose?: boolean;
}

/** One child process that can die and be started again. */
export interface Member {
  url: string;
  /** Kills the process (default SIGKILL) and waits for it to be gone. */
  kill(signal?: NodeJS.Signals): Promise<void>;
  /** Starts it again on the same port, with extra environment for this start. */
  restart(env?: Record<string, string>): Promise<void>;
  /** Whether the process is running. */
  alive(): boolean;
  /** Its process id while it runs. */
  pid(): number | undefined;
  /** Everything it printed. */
  output(): string;
  /** A coordinator's admin address (/metrics, /readyz). */
  adminUrl?: string;
}

export interface Cluster {
  /** Every coordinator replica, the first one first. */
  coordinators: Member[];
  provider: Member;
  service: Member;
  tokens: { gateway: string; worker: string; operator: string };
  /** The provider's charges and the keys of every charge request it received. */
  providerState(): Promise<{ charges: Charge[]; chargeRequests: string[] }>;
  setProviderFaults(faults: Partial<ProviderFaults>): Promise<void>;
  stop(): Promise<void>;
}

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

export async function startCluster(options: ClusterOptions): Promise<Cluster> {
  const tokens = {
    gateway: `gw_${randomBytes(16).toString("hex")}`,
    worker: `wk_${randomBytes(16).toString("hex")}`,
    operator: `op_${randomBytes(16).toString("hex")}`,
  };
  const base: Record<string, string> = {
    DATABASE_URL: options.databaseUrl,
    ...(options.schema ? { PGOPTIONS: `-c search_path=${options.schema}` } : {}),
    LOG_LEVEL: options.verbose ? "info" : "warn",
  };
  const [providerPort, servicePort] = await Promise.all([freePort(), freePort()]);
  // The coordinator's key ring, which the co-located service seals with too.
  const snapshotKeys = JSON.stringify({ active: "cluster", keys: { cluster: randomBytes(32).toString("base64") } });

  const callers = JSON.stringify([
    { name: "payments-gateway", tokenSha256: tokenHash(tokens.gateway), tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] },
    { name: "payments-recovery", tokenSha256: tokenHash(tokens.worker), tenants: ["acme"], operations: ["payments.create"], roles: ["worker"] },
    { name: "operator", tokenSha256: tokenHash(tokens.operator), tenants: ["*"], operations: ["*"], roles: ["operator"] },
  ]);
  const startReplica = async (): Promise<Member> => {
    const [rpcPort, adminPort] = await Promise.all([freePort(), freePort()]);
    // Through the example's entry, which hands IDEM_FAILPOINTS to the coordinator (npm start has no such switch).
    const replica = await member(
      ["examples/payments/main.ts", "coordinator"],
      {
        ...base,
        IDEM_RPC_PORT: String(rpcPort),
        IDEM_ADMIN_PORT: String(adminPort),
        IDEM_HOST: "127.0.0.1",
        IDEM_CALLERS: callers,
        IDEM_OPERATIONS: JSON.stringify([paymentsPolicy()]),
        IDEM_SNAPSHOT_KEYS: snapshotKeys,
        IDEM_SHUTDOWN_GRACE_MS: "2000",
        ...options.coordinatorEnv,
      },
      `http://127.0.0.1:${rpcPort}`,
      options.verbose,
    );
    return { ...replica, adminUrl: `http://127.0.0.1:${adminPort}` };
  };
  // One after the other: the first one migrates the registry.
  const coordinators: Member[] = [];
  for (let i = 0; i < Math.max(1, options.replicas ?? 1); i++) coordinators.push(await startReplica());
  const provider = await member(["examples/payments/main.ts", "provider", "--port", String(providerPort)], base, `http://127.0.0.1:${providerPort}`, options.verbose);
  const service = await member(
    ["examples/payments/main.ts", "service", "--port", String(servicePort)],
    {
      ...base,
      COORDINATOR_URL: coordinators.map((c) => c.url).join(","),
      GATEWAY_TOKEN: tokens.gateway,
      WORKER_TOKEN: tokens.worker,
      PROVIDER_URL: provider.url,
      PAYMENTS_COLOCATED: String(options.colocated ?? true),
      IDEM_SNAPSHOT_KEYS: options.coordinatorEnv?.IDEM_SNAPSHOT_KEYS ?? snapshotKeys,
      ...options.serviceEnv,
    },
    `http://127.0.0.1:${servicePort}`,
    options.verbose,
  );

  return {
    coordinators,
    provider,
    service,
    tokens,
    async providerState() {
      return (await (await fetch(`${provider.url}/_admin/state`)).json()) as { charges: Charge[]; chargeRequests: string[] };
    },
    async setProviderFaults(faults) {
      await fetch(`${provider.url}/_admin/faults`, { method: "POST", body: JSON.stringify(faults) });
    },
    async stop() {
      await Promise.all([service.kill("SIGTERM"), provider.kill("SIGTERM")]);
      await Promise.all(coordinators.map((c) => c.kill("SIGTERM")));
    },
  };
}

/** A process started with `node --import tsx`, ready once it prints its ready line. */
async function member(args: string[], env: Record<string, string>, url: string, verbose = false): Promise<Member> {
  let child: Child | undefined;
  const start = async (extra: Record<string, string> = {}) => {
    child = startChild({
      command: process.execPath,
      args: ["--import", "tsx", ...args],
      cwd: ROOT,
      env: { ...process.env, ...env, ...extra },
      ...(verbose ? { onOutput: (chunk: Buffer) => process.stderr.write(chunk) } : {}),
    });
    await child.printed(/^(ready |idempotency coordinator serving)/m, args.join(" "));
  };
  await start();
  return {
    url,
    alive: () => child?.running() ?? false,
    pid: () => (child?.running() ? child.pid : undefined),
    // Only the output of its current life.
    output: () => child?.output() ?? "",
    kill: async (signal = "SIGKILL") => child?.stop(signal),
    restart: (extra) => start(extra),
  };
}
