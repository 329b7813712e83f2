import cluster, { type Worker } from "node:cluster";
import { randomBytes } from "node:crypto";
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import pino from "pino";
import type { FaultHooks } from "../fault-hooks.js";
import type { Config } from "../config.js";
import type { CallerGrant } from "../server/callers.js";
import { startEmbeddedPostgres, type EmbeddedPostgres } from "../dev/embedded-postgres.js";
import { parseKeyring, type SnapshotKeyring } from "../crypto/sealing.js";
import { startCoordinator } from "../server/app.js";
import { tokenHash } from "../server/callers.js";
import { startTracing, traceFields } from "../server/tracing.js";
import { listenFailure, requireListenable } from "../net.js";
import { OperatorError } from "../operator-error.js";

/**
 * Runs the coordinator until SIGTERM or SIGINT. With DATABASE_URL unset it
 * first starts the embedded PostgreSQL, and when no caller is configured it
 * mints a development token so that a first call works out of the box. With
 * IDEM_WORKERS above 1 this process runs that many coordinators (serveWorkers).
 */
export async function serve(config: Config, options: { hooks?: FaultHooks } = {}): Promise<void> {
  if (config.workers > 1 && cluster.isPrimary) return serveWorkers(config);
  const worker = cluster.isWorker ? Number(process.env.IDEM_WORKER_INDEX ?? 0) : undefined;
  if (worker !== undefined && config.adminPort !== 0) config = { ...config, adminPort: config.adminPort + worker };
  // Inside an RPC that is traced, every line carries its trace and span ids.
  const logger = pino({ level: config.logLevel, base: { service: "idempotency-coordinator", ...(worker !== undefined ? { worker } : {}) }, mixin: traceFields });
  if (worker === undefined) {
    // Before the database: a second start on the same ports stops here, in one line, touching nothing.
    // (A worker's ports were checked by its primary; the RPC port is the primary's to share.)
    await requireListenable(config.host, config.rpcPort, "IDEM_RPC_PORT");
    await requireListenable(config.host, config.adminPort, "IDEM_ADMIN_PORT");
  }
  let embedded: EmbeddedPostgres | undefined;
  let databaseUrl = config.databaseUrl;
  if (databaseUrl === undefined) {
    logger.info("DATABASE_URL is unset: starting the embedded PostgreSQL (development default)");
    embedded = await startEmbeddedPostgres({ stateDir: join(config.stateDir, "postgres"), port: config.embeddedPostgresPort, logger });
    databaseUrl = embedded.url;
  }

  if (embedded && !config.snapshotKeys && !config.allowPlaintextSnapshots) {
    config = { ...config, snapshotKeys: await developmentKeyring(config.stateDir) };
  }

  let developmentToken: string | undefined;
  if (embedded && config.callers.length === 0 && !config.allowAnonymous) {
    developmentToken = await developmentTokenOf(config.stateDir);
    config = { ...config, callers: [developmentCaller(developmentToken)] };
  }

  const tracing = startTracing(process.env);
  if (tracing) logger.info("tracing RPCs to the OpenTelemetry collector (OTEL_EXPORTER_OTLP_ENDPOINT)");
  let coordinator;
  try {
    coordinator = await startCoordinator({
      config,
      databaseUrl,
      ...(embedded ? { databaseSetting: "IDEM_EMBEDDED_PG_PORT" } : {}),
      logger,
      ...(tracing ? { tracer: tracing.tracer } : {}),
      ...(options.hooks ? { hooks: options.hooks } : {}),
    });
  } catch (error) {
    await embedded?.stop();
    // Both ports fail alike: the error's own port says which one it was.
    const admin = (error as { port?: unknown }).port === config.adminPort;
    throw listenFailure(error, config.host, admin ? config.adminPort : config.rpcPort, admin ? "IDEM_ADMIN_PORT" : "IDEM_RPC_PORT") ?? error;
  }
  // On stderr: stdout carries the JSON log lines only, for whatever collects them.
  const serving: Serving = {
    kind: "serving",
    rpcHost: coordinator.rpcHost,
    rpcPort: coordinator.rpcPort,
    adminHost: coordinator.adminHost,
    adminPort: coordinator.adminPort,
    publishedOperations: coordinator.publishedOperations,
  };
  if (worker === undefined) {
    // Before the banner: whoever waits for the banner finds the file written.
    if (config.portsFile) {
      await writePortsFile(config.portsFile, { rpcPort: coordinator.rpcPort, adminPorts: [coordinator.adminPort] }).catch(async (error: unknown) => {
        await coordinator.stop();
        await embedded?.stop();
        throw error;
      });
    }
    process.stderr.write(banner(config, serving, [coordinator.adminPort], developmentToken, embedded));
  } else {
    process.send?.(serving);
  }

  onStopSignals(
    async (signal) => {
      logger.info({ signal }, "stopping: no new RPCs, draining in-flight ones");
      await coordinator.stop();
      await tracing?.shutdown();
      await embedded?.stop();
      logger.info("stopped");
      process.exit(0);
    },
    (signal) => {
      logger.warn({ signal }, "second signal: exiting at once");
      process.exit(1);
    },
  );
}

/**
 * Stops on SIGTERM or SIGINT (`stop`), and forces the exit on one more
 * (`force`). A terminal's Ctrl-C reaches both npm/tsx and this process, which
 * then relay it once more: only a signal sent a second or more later, on
 * purpose, forces. `stopping` says whether stopping has begun, by a signal or
 * by `begin` (a start that failed).
 */
function onStopSignals(stop: (signal: string) => unknown, force: (signal: string) => void): { readonly stopping: boolean; begin(): void } {
  let since: number | undefined;
  const on = (signal: string) => {
    if (since === undefined) {
      since = Date.now();
      void stop(signal);
    } else if (Date.now() - since >= 1000) {
      force(signal);
    }
  };
  process.on("SIGTERM", () => on("SIGTERM"));
  process.on("SIGINT", () => on("SIGINT"));
  return {
    get stopping() {
      return since !== undefined;
    },
    begin() {
      since ??= Date.now();
    },
  };
}

/** What a worker tells its primary once it serves. */
interface Serving {
  kind: "serving";
  /** The addresses the ports are bound to, as their sockets report them. */
  rpcHost: string;
  rpcPort: number;
  adminHost: string;
  adminPort: number;
  publishedOperations: ReadonlyArray<{ operation: string; apiRevision: number }>;
}

/**
 * IDEM_WORKERS: that many coordinators on this machine, each a process of its
 * own (node:cluster) sharing the RPC port: this process accepts connections
 * and hands each to a worker in turn, and a connection stays with its worker
 * (gRPC multiplexes a client's calls on few connections, so a client with
 * one connection is served by one worker). Every worker is a whole
 * coordinator on the registry, as a replica on another machine would be: its
 * own pool, batches, caches and metrics (worker i answers /metrics and
 * /readyz on IDEM_ADMIN_PORT + i), and the background jobs run on one of them
 * at a time. A worker that dies is started again; one that cannot start
 * stops them all. SIGTERM or SIGINT stops every worker (each drains its RPCs)
 * and then this process.
 */
async function serveWorkers(config: Config): Promise<void> {
  const logger = pino({ level: config.logLevel, base: { service: "idempotency-coordinator", workers: config.workers } });
  await requireListenable(config.host, config.rpcPort, "IDEM_RPC_PORT");
  if (config.adminPort !== 0) {
    for (let i = 0; i < config.workers; i++) await requireListenable(config.host, config.adminPort + i, "IDEM_ADMIN_PORT (worker admin ports)");
  }
  const running = new Map<number, Worker>();
  const serving = new Map<number, Serving>();
  let allServed = false;
  const signals = onStopSignals(
    (signal) => {
      logger.info({ signal }, "stopping every worker: no new RPCs, draining in-flight ones");
      if (running.size === 0) process.exit(0);
      for (const worker of running.values()) worker.process.kill("SIGTERM");
    },
    (signal) => {
      logger.warn({ signal }, "second signal: stopping every worker at once");
      for (const worker of running.values()) worker.process.kill("SIGKILL");
      process.exit(1);
    },
  );

  // Worker i's admin port at i (with IDEM_ADMIN_PORT=0 each worker has one of its own, in no order).
  const portsOf = (rpcPort: number) => ({ rpcPort, adminPorts: [...serving.entries()].sort(([a], [b]) => a - b).map(([, s]) => s.adminPort) });
  const start = (index: number) => {
    const worker = cluster.fork({ IDEM_WORKER_INDEX: String(index) });
    running.set(index, worker);
    worker.on("message", (message: Serving) => {
      if (message?.kind !== "serving") return;
      serving.set(index, message);
      // A worker started in place of one that died: with IDEM_ADMIN_PORT=0 its admin port is another.
      if (allServed && config.portsFile) {
        void writePortsFile(config.portsFile, portsOf(message.rpcPort)).catch((error: unknown) =>
          logger.error({ error: (error as Error).message }, "could not write the ports again"),
        );
      }
      if (allServed || serving.size < config.workers) return;
      allServed = true;
      const adminPorts = [...serving.values()].map((s) => s.adminPort).sort((a, b) => a - b);
      const announce = () => {
        process.stderr.write(banner(config, message, adminPorts, undefined, undefined));
        logger.info({ rpcPort: message.rpcPort, adminPorts }, `${config.workers} workers serving`);
      };
      if (!config.portsFile) return announce();
      writePortsFile(config.portsFile, portsOf(message.rpcPort)).then(announce, (error: unknown) => {
        process.stderr.write(`${(error as Error).message}\n`);
        process.exitCode = 1;
        signals.begin();
        for (const other of running.values()) other.process.kill("SIGTERM");
      });
    });
    worker.on("exit", (code, signal) => {
      running.delete(index);
      if (signals.stopping) {
        if (running.size === 0) {
          logger.info("stopped");
          // 0 after a signal; a start that failed set its own status.
          process.exit();
        }
        return;
      }
      if (!allServed) {
        // It could not start (its own error is printed): the others would fail alike.
        for (const other of running.values()) other.process.kill("SIGTERM");
        process.exitCode = code || 1;
        signals.begin();
        if (running.size === 0) process.exit(process.exitCode);
        return;
      }
      logger.error({ worker: index, code, signal }, "a worker exited; starting another in its place");
      setTimeout(() => {
        if (!signals.stopping) start(index);
      }, 1000);
    });
  };
  for (let i = 0; i < config.workers; i++) start(i);
}

/** Names the partial files of writePortsFile apart: two writes may overlap. */
let portsFileWrites = 0;

/**
 * IDEM_PORTS_FILE: the ports this coordinator listens on, as JSON. Written
 * whole (a file beside it, then renamed), so that a reader never finds half
 * of it.
 */
async function writePortsFile(path: string, ports: { rpcPort: number; adminPorts: number[] }): Promise<void> {
  const partial = `${path}.${process.pid}-${++portsFileWrites}.partial`;
  try {
    await writeFile(partial, `${JSON.stringify(ports)}\n`);
    await rename(partial, path);
  } catch (error) {
    throw new OperatorError(`cannot write the ports to ${path} (IDEM_PORTS_FILE): ${(error as Error).message}`, { cause: error });
  }
}

/** The development token, kept under the state folder so that it survives restarts. */
async function developmentTokenOf(stateDir: string): Promise<string> {
  const file = join(stateDir, "dev-token");
  const existing = await readFile(file, "utf8").catch(() => "");
  if (existing.trim().length > 0) return existing.trim();
  const token = `idem_dev_${randomBytes(24).toString("base64url")}`;
  await mkdir(stateDir, { recursive: true });
  await writeFile(file, `${token}\n`, { mode: 0o600 });
  return token;
}

/** A key ring for the embedded default, kept under the state folder so that stored bodies stay readable across restarts. */
async function developmentKeyring(stateDir: string): Promise<SnapshotKeyring> {
  const file = join(stateDir, "snapshot-keys.json");
  const existing = await readFile(file, "utf8").catch(() => undefined);
  if (existing) return parseKeyring(JSON.parse(existing));
  const ring = { active: "development", keys: { development: randomBytes(32).toString("base64") } };
  await mkdir(stateDir, { recursive: true });
  await writeFile(file, `${JSON.stringify(ring)}\n`, { mode: 0o600 });
  return parseKeyring(ring);
}

function developmentCaller(token: string): CallerGrant {
  return { name: "development", tokenSha256: tokenHash(token), tenants: ["*"], operations: ["*"], roles: ["gateway", "worker", "operator"] };
}

/** Whether an address is this machine's alone. */
function isLoopback(host: string): boolean {
  return /^127\./.test(host) || host === "::1" || /^::ffff:127\./i.test(host);
}

/** Whether an address is every interface's. */
function isWildcard(host: string): boolean {
  return host === "0.0.0.0" || host === "::";
}

/** `host:port`, an IPv6 address in brackets. */
function hostPort(host: string, port: number): string {
  return `${host.includes(":") ? `[${host}]` : host}:${port}`;
}

/**
 * What the coordinator prints on stderr once it serves: where it listens
 * (the addresses its ports are bound to), the registry and policies, and
 * either a first call that works or what to configure before one can.
 */
function banner(
  config: Config,
  serving: Pick<Serving, "rpcHost" | "rpcPort" | "adminHost" | "publishedOperations">,
  adminPorts: number[],
  token: string | undefined,
  embedded: EmbeddedPostgres | undefined,
): string {
  const { rpcHost, rpcPort, adminHost, publishedOperations } = serving;
  // Where a client on this machine reaches a port: a wildcard address through loopback.
  const local = (host: string) => (host === "::" ? "::1" : host === "0.0.0.0" ? "127.0.0.1" : host);
  // One port, or the first and the others' numbers (a worker's admin port each).
  const at = (host: string, ports: number[]) => [hostPort(host, ports[0]!), ...ports.slice(1)].join(", ");
  const where = (host: string, ports: number[], scheme: string) => {
    if (isWildcard(host)) return `${at(host, ports)}, every interface (from this machine: ${scheme}${at(local(host), ports)})`;
    return `${scheme}${at(host, ports)}${isLoopback(host) ? ", this machine only" : ""}`;
  };
  const rpcUrl = `http://${hostPort(local(rpcHost), rpcPort)}`;
  const hasCaller = token !== undefined || config.callers.length > 0 || config.allowAnonymous;
  const operation = publishedOperations.find((o) => o.operation === "payments.create" && o.apiRevision === 1) ?? publishedOperations[0];
  const auth = token ? `-H "Authorization: Bearer $(cat ${join(config.stateDir, "dev-token")})" ` : config.allowAnonymous ? "" : `-H "Authorization: Bearer $TOKEN" `;
  const lines = [
    "",
    `idempotency coordinator serving`,
    `  RPC (gRPC, gRPC-Web, Connect; HTTP/2 and HTTP/1.1): ${where(rpcHost, [rpcPort], "")}`,
    adminPorts.length === 1
      ? `  admin (/healthz, /readyz, /metrics, /console):     ${where(adminHost, adminPorts, "http://")}`
      : `  admin, one port per worker:                        ${where(adminHost, adminPorts, "http://")}`,
    `  registry: ${embedded ? `embedded PostgreSQL in ${resolve(embedded.dataDir)}` : "DATABASE_URL"}`,
    `  policies: ${publishedOperations.map((o) => `${o.operation}@${o.apiRevision}`).join(", ") || "none published"}`,
    ...(token
      ? [
          `  development token (all grants, ${isLoopback(rpcHost) ? "this machine only" : `reachable from other machines: IDEM_HOST is ${config.host}`}): ${join(config.stateDir, "dev-token")}`,
        ]
      : config.allowAnonymous
        ? ["  callers: IDEM_ALLOW_ANONYMOUS, every request acts with every grant"]
        : [
            `  callers: ${config.callers.length === 0 ? "none configured: every RPC is refused as UNAUTHENTICATED" : `${new Set(config.callers.map((c) => c.name)).size} configured`}`,
          ]),
    "",
  ];
  if (hasCaller && operation) {
    lines.push(
      token || config.allowAnonymous ? "First call:" : `First call (with the token of a caller granted ${operation.operation} for tenant acme; the body must satisfy its policy):`,
      `  curl -sS ${auth}-H "Content-Type: application/json" \\`,
      `    ${rpcUrl}/idempotency.v1.CoordinatorService/Reserve \\`,
      `    -d '{"subject":{"tenant":"acme","principal":"alice"},"operation":"${operation.operation}","apiRevision":${operation.apiRevision},` +
        `"idempotencyKey":"'$(uuidgen || cat /proc/sys/kernel/random/uuid)'","parts":{"method":"POST","path":"/v1/payments",` +
        `"mediaType":"application/json","body":"eyJhbW91bnQiOjEwfQ=="}}'`,
      "",
    );
  } else {
    lines.push("Before the first call:");
    if (!hasCaller) {
      lines.push(
        "  - configure a caller: mint a token and its entry with",
        "      npm run idemctl -- token --name payments-gateway --tenants acme --operations payments.create --roles gateway",
        "    put the entry in IDEM_CALLERS (a JSON array of entries) or IDEM_CALLERS_FILE, and start again;",
        "    mint an operator's the same way (--roles operator --tenants '*') to publish policies",
      );
    }
    if (!operation) {
      lines.push(
        "  - publish a policy for each operation (docs/policies.md): declare them in IDEM_OPERATIONS_FILE",
        "    (deploy/operations.example.yaml is one) and start again, or with an operator's token:",
        `      IDEM_URL=${rpcUrl} IDEM_TOKEN=<operator token> npm run idemctl -- policy apply deploy/operations.example.yaml`,
      );
    }
    lines.push("");
  }
  return `${lines.join("\n")}\n`;
}
