import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Charge, ProviderFaults } from "../../examples/payments/provider.js";
import { paymentsPolicy } from "../../examples/payments/policy.js";
import { tokenHash } from "../../src/server/callers.js";
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
  // Where the coordinators write the ports they bound (IDEM_PORTS_FILE).
  const portsDir = await mkdtemp(join(tmpdir(), "idem-cluster-"));
  // The coordinator's key ring, which the co-located service seals with too.
  const snapshotKeys = JSON.stringify({ active: "cluster", keys: { cluster: randomBytes(32).toString("base64") } });

  const callers = JSON.stringify([
    { name: "payments-gateway", tokenSha256: tokenHash(tokens.gateway), tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] },
    { name: "payments-recovery", tokenSha256: tokenHash(tokens.worker), tenants: ["acme"], operations: ["payments.create"], roles: ["worker"] },
    { name: "operator", tokenSha256: tokenHash(tokens.operator), tenants: ["*"], operations: ["*"], roles: ["operator"] },
  ]);
  const startReplica = async (index: number): Promise<Member> => {
    const portsFile = join(portsDir, `coordinator-${index}.json`);
    // Through the example's entry, which hands IDEM_FAILPOINTS to the coordinator (npm start has no such switch).
    return member(
      ["examples/payments/main.ts", "coordinator"],
      {
        ...base,
        IDEM_RPC_PORT: "0",
        IDEM_ADMIN_PORT: "0",
        IDEM_PORTS_FILE: portsFile,
        IDEM_HOST: "127.0.0.1",
        IDEM_CALLERS: callers,
        IDEM_OPERATIONS: JSON.stringify([paymentsPolicy()]),
        IDEM_SNAPSHOT_KEYS: snapshotKeys,
        IDEM_SHUTDOWN_GRACE_MS: "2000",
        ...options.coordinatorEnv,
      },
      {
        verbose: options.verbose,
        async bound() {
          const { rpcPort, adminPorts } = JSON.parse(await readFile(portsFile, "utf8")) as { rpcPort: number; adminPorts: number[] };
          return {
            url: `http://127.0.0.1:${rpcPort}`,
            adminUrl: `http://127.0.0.1:${adminPorts[0]}`,
            env: { IDEM_RPC_PORT: String(rpcPort), IDEM_ADMIN_PORT: String(adminPorts[0]) },
          };
        },
      },
    );
  };
  // One after the other: the first one migrates the registry.
  const coordinators: Member[] = [];
  for (let i = 0; i < Math.max(1, options.replicas ?? 1); i++) coordinators.push(await startReplica(i));
  const provider = await member(["examples/payments/main.ts", "provider"], base, { verbose: options.verbose, bound: readyLine });
  const service = await member(
    ["examples/payments/main.ts", "service"],
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
    { verbose: options.verbose, bound: readyLine },
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
      await rm(portsDir, { recursive: true, force: true });
    },
  };
}

/** Where a member listens, and what starts it there again: its port as an argument (the example's processes) or in its environment (the coordinator). */
interface Bound {
  url: string;
  adminUrl?: string;
  args?: string[];
  env?: Record<string, string>;
}

/** Where one of the example's processes listens: the address of its `ready <url>` line, and `--port` to start there again. */
function readyLine(child: Child): Promise<Bound> {
  const url = /^ready (\S+)$/m.exec(child.output())![1]!;
  return Promise.resolve({ url, args: ["--port", new URL(url).port] });
}

/**
 * A process started with `node --import tsx`, ready once it prints its ready
 * line. It listens first on ports it is given by the system (port 0, the
 * example's default), which `bound` reads back once it is ready; a restart
 * asks for the same ports again, so that its clients find it where it was.
 */
async function member(args: string[], env: Record<string, string>, options: { verbose?: boolean | undefined; bound: (child: Child) => Promise<Bound> }): Promise<Member> {
  let child: Child | undefined;
  let bound: Bound | undefined;
  const start = async (extra: Record<string, string> = {}) => {
    child = startChild({
      command: process.execPath,
      args: ["--import", "tsx", ...args, ...(bound?.args ?? [])],
      cwd: ROOT,
      env: { ...process.env, ...env, ...bound?.env, ...extra },
      ...(options.verbose ? { onOutput: (chunk: Buffer) => process.stderr.write(chunk) } : {}),
    });
    await child.printed(/^(ready |idempotency coordinator serving)/m, args.join(" "));
  };
  await start();
  bound = await options.bound(child!);
  return {
    url: bound.url,
    ...(bound.adminUrl ? { adminUrl: bound.adminUrl } : {}),
    alive: () => child?.running() ?? false,
    pid: () => (child?.running() ? child.pid : undefined),
    // Only the output of its current life.
    output: () => child?.output() ?? "",
    kill: async (signal = "SIGKILL") => child?.stop(signal),
    restart: (extra) => start(extra),
  };
}
