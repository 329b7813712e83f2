/**
 * The coordinator under test: by default a separate process
 * (`node --import tsx src/main.ts`, configured through its environment as in
 * production) so that the load generator does not share its event loop;
 * `--in-process` runs startCoordinator in the benchmark's own process.
 */
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import pino from "pino";
import { loadConfig } from "../src/config.js";
import { startCoordinator } from "../src/server/app.js";
import { tokenHash } from "../src/server/callers.js";
import { startChild, waitUntilServing, type Child } from "../harness/lib/process.js";

export const ROOT = fileURLToPath(new URL("..", import.meta.url));

export interface BenchServer {
  mode: "process" | "in-process";
  baseUrl: string;
  /** /healthz, /readyz, /metrics */
  adminUrl: string;
  pid: number;
  /** What the coordinator was configured with (no secrets). */
  environment: Record<string, string>;
  /** The role its registry connections act as (`-c role=…`), when it has one. */
  databaseRole?: string;
  stop(): Promise<void>;
}

export interface ServerOptions {
  databaseUrl: string;
  token: string;
  callerName: string;
  tenant: string;
  operation: string;
  apiRevision: number;
  keyId: string;
  poolMax: number;
  inProcess: boolean;
  /** The coordinator process writes a V8 CPU profile into this folder when it exits. */
  cpuProfileDir?: string;
  /** Its key ring (IDEM_SNAPSHOT_KEYS); one of its own when absent. */
  snapshotKeys?: string;
  /** More settings (the round-trip count parks the background jobs). */
  extraEnvironment?: Record<string, string>;
}

/** The coordinator's environment (README, "Configuration"). */
function environmentOf(options: ServerOptions): Record<string, string> {
  return {
    DATABASE_URL: options.databaseUrl,
    IDEM_HOST: "127.0.0.1",
    // Any free ports: the coordinator says which it bound (IDEM_PORTS_FILE, or startCoordinator's answer in process).
    IDEM_RPC_PORT: "0",
    IDEM_ADMIN_PORT: "0",
    IDEM_DB_POOL_MAX: String(options.poolMax),
    IDEM_CALLERS: JSON.stringify([
      { name: options.callerName, tokenSha256: tokenHash(options.token), tenants: [options.tenant], operations: [options.operation], roles: ["gateway"] },
    ]),
    // payments.create@1 with every default (raw fingerprint), as test/support/fixtures.ts testDocument().
    IDEM_OPERATIONS: JSON.stringify([{ operation: options.operation, apiRevision: options.apiRevision }]),
    // Bodies sealed at rest, as a production coordinator should run.
    IDEM_SNAPSHOT_KEYS: options.snapshotKeys ?? JSON.stringify({ active: options.keyId, keys: { [options.keyId]: randomBytes(32).toString("base64") } }),
    IDEM_SHUTDOWN_GRACE_MS: "3000",
    LOG_LEVEL: "warn",
  };
}

const redacted = (env: Record<string, string>) => {
  const { DATABASE_URL, IDEM_SNAPSHOT_KEYS, IDEM_CALLERS, ...rest } = env;
  void DATABASE_URL;
  void IDEM_SNAPSHOT_KEYS;
  void IDEM_CALLERS;
  return { ...rest, DATABASE_URL: "(the benchmark's database)", IDEM_SNAPSHOT_KEYS: "(generated)", IDEM_CALLERS: "(one gateway caller)" };
};

export async function startServer(options: ServerOptions): Promise<BenchServer> {
  const environment = { ...environmentOf(options), ...options.extraEnvironment };
  // Read loosely: whether the registry acts as a role of its own depends on the configuration's version.
  const role = (loadConfig(environment).db as { role?: unknown }).role;
  const databaseRole = typeof role === "string" && role !== "" ? { databaseRole: role } : {};
  const urls = (rpcPort: number, adminPort: number) => ({ baseUrl: `http://127.0.0.1:${rpcPort}`, adminUrl: `http://127.0.0.1:${adminPort}` });

  if (options.inProcess) {
    const config = loadConfig(environment);
    const coordinator = await startCoordinator({
      config,
      databaseUrl: options.databaseUrl,
      logger: pino({ level: "warn" }, pino.destination(2)),
      applicationName: "idem-bench-coordinator",
    });
    const { baseUrl, adminUrl } = urls(coordinator.rpcPort, coordinator.adminPort);
    return { mode: "in-process", baseUrl, adminUrl, pid: process.pid, environment: redacted(environment), ...databaseRole, stop: () => coordinator.stop() };
  }

  const portsDir = await mkdtemp(join(tmpdir(), "idem-bench-ports-"));
  const portsFile = join(portsDir, "ports.json");
  // Inherit nothing that would change the coordinator's behaviour (tracing, another database).
  const child = startBenchProcess("src/main.ts", { ...environment, IDEM_PORTS_FILE: portsFile }, /^(IDEM_|OTEL_|DATABASE_URL$|LOG_LEVEL$|NODE_OPTIONS$)/, options.cpuProfileDir);
  const stop = () => child.stop("SIGTERM", { killAfterMs: 10_000 });
  try {
    // The ports file is written before the banner.
    await child.printed(/idempotency coordinator serving/, "the coordinator");
    const { rpcPort, adminPorts } = JSON.parse(await readFile(portsFile, "utf8")) as { rpcPort: number; adminPorts: number[] };
    const { baseUrl, adminUrl } = urls(rpcPort, adminPorts[0]!);
    await waitUntilServing(child, "the coordinator", `${adminUrl}/readyz`, 90_000, 150);
    return { mode: "process", baseUrl, adminUrl, pid: child.pid!, environment: redacted(environment), ...databaseRole, stop };
  } catch (error) {
    await stop();
    throw error;
  } finally {
    await rm(portsDir, { recursive: true, force: true });
  }
}

/**
 * A process of the benchmark's own (the coordinator, the Express service):
 * `node --import tsx SCRIPT` in its own process group (Ctrl-C is handled by
 * the benchmark, which stops it), with `environment` over this process's less
 * the variables `notInherited` names, and a V8 CPU profile into
 * `cpuProfileDir` when given.
 */
export function startBenchProcess(script: string, environment: Record<string, string>, notInherited: RegExp, cpuProfileDir: string | undefined): Child {
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([name]) => !notInherited.test(name)));
  return startChild({
    command: process.execPath,
    args: [...(cpuProfileDir ? ["--cpu-prof", `--cpu-prof-dir=${cpuProfileDir}`] : []), "--import", "tsx", script],
    cwd: ROOT,
    env: { ...inherited, ...environment },
    detached: true,
    keep: 8000,
  });
}
