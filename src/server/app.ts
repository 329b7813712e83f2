import { createContextValues } from "@connectrpc/connect";
import type { Tracer } from "@opentelemetry/api";
import type { Logger } from "pino";
import { systemClock, type Clock } from "../clock.js";
import type { FaultHooks } from "../fault-hooks.js";
import { ConfigError, SNAPSHOT_KEYS_REQUIRED, type Config } from "../config.js";
import { Health } from "../gen/grpc/health/v1/health_pb.js";
import { AdminService } from "../gen/idempotency/v1/admin_pb.js";
import { CoordinatorService } from "../gen/idempotency/v1/coordinator_pb.js";
import { PolicyCache } from "../policy/cache.js";
import { openPool, poolDb, readerDb, sessionQueryable, type Db } from "../registry/db.js";
import { migrate } from "../registry/migrate.js";
import { planEpochs } from "../registry/plan-epochs.js";
import { requireLeastPrivilege, servingLoginCanWiden } from "../registry/privileges.js";
import { ping, reportUnreachable, retryingLostConnection } from "../registry/reachability.js";
import { PolicyStore } from "../registry/policy-store.js";
import { Registry } from "../registry/registry.js";
import { listenAdmin, type AdminServer } from "./admin-http.js";
import { Callers } from "./callers.js";
import { adminService } from "./admin-service.js";
import { consoleRoutes } from "./console.js";
import { DecisionSampler } from "./event-series.js";
import { HealthStatus, READINESS_PROBE_INTERVAL_MS, READINESS_PROBE_TIMEOUT_MS, Readiness } from "./health.js";
import { reflectionRoutes } from "./reflection.js";
import { rpcHandler } from "./rpc-handler.js";
import { withCors } from "./cors.js";
import { accessLog, InFlight, peerKey } from "./interceptors.js";
import { JSON_OPTIONS, refusalInterceptors, serviceRoutes } from "./routes.js";
import { BackgroundJob, jobHolder } from "./jobs.js";
import { listenRpc, peerCertificateOf, type RpcListener } from "./listener.js";
import { Metrics } from "./metrics.js";
import { tracingInterceptor } from "./tracing.js";

/** How long a stop waits for written responses to leave before closing connections. */
const RESPONSE_FLUSH_MS = 2000;

/** Records per batch of the recoverer and the retention sweep: short statements that never hold many rows. */
const JOB_BATCH = 500;

/**
 * The recoverer (ended leases become UNKNOWN or claimable) and the retention
 * sweep (finished records past retention become tombstones), each run by one
 * replica at a time.
 */
function backgroundJobs(registry: Registry, db: Db, metrics: Metrics, config: Config, logger: Logger, clock: Clock, holder: string): BackgroundJob[] {
  const recoverer = new BackgroundJob({
    name: "recoverer",
    holder,
    intervalMs: config.recovererIntervalMs,
    registry,
    db,
    logger,
    clock,
    run: async () => {
      for (;;) {
        const { unknown, claimable } = await registry.recoverExpiredLeases(db, { batchSize: JOB_BATCH, caller: "recoverer" });
        metrics.recovered.inc({ to: "unknown" }, unknown);
        metrics.recovered.inc({ to: "claimable" }, claimable);
        if (unknown > 0) logger.warn({ unknown }, "leases ended with a possible effect: records are UNKNOWN until recovered or reconciled");
        if (unknown + claimable < JOB_BATCH) return;
      }
    },
  });
  const sweeper = new BackgroundJob({
    name: "retention-sweep",
    holder,
    intervalMs: config.sweepIntervalMs,
    registry,
    db,
    logger,
    clock,
    run: async () => {
      const { tombstoned } = await registry.sweepRetention(db, {
        batchSize: JOB_BATCH,
        // Never longer than half the interval: the next pass continues.
        budgetMs: config.sweepIntervalMs / 2,
        now: () => clock.now(),
        caller: "retention-sweep",
        onBatch: (n) => metrics.tombstoned.inc(n),
      });
      if (tombstoned > 0) logger.info({ tombstoned }, "retention sweep");
    },
  });
  return [recoverer, sweeper];
}

export interface StartOptions {
  config: Config;
  /** The registry's PostgreSQL (DATABASE_URL, or the embedded server's). */
  databaseUrl: string;
  /** The setting that gives `databaseUrl`, named when it cannot be reached (default DATABASE_URL). */
  databaseSetting?: string;
  logger: Logger;
  /** Extra `-c` connection options (tests pin a schema with `search_path`). */
  databaseOptions?: string;
  /** How the registry's connections name themselves in pg_stat_activity. */
  applicationName?: string;
  /** Traces every RPC (startTracing gives one when a collector is configured). */
  tracer?: Tracer;
  /** The time of the background work: policy refreshes, jobs, readiness probes, the sweep's budget. Default: the system clock. */
  clock?: Clock;
  /** Fault tests' and rehearsals' hooks at exact steps of the registry (src/fault-hooks.ts); none by default. */
  hooks?: FaultHooks;
}

export interface RunningCoordinator {
  /** The address the RPC port is bound to, as its socket reports it (IDEM_HOST resolved: 127.0.0.1, 0.0.0.0, ::). */
  rpcHost: string;
  rpcPort: number;
  /** The address the admin port is bound to. */
  adminHost: string;
  adminPort: number;
  /** The operations (and API revisions) with a published policy when it started: those a first call can name. */
  publishedOperations: ReadonlyArray<{ operation: string; apiRevision: number }>;
  /** Its name on the background jobs' leases (idem_job_lease.holder). */
  jobHolder: string;
  health: HealthStatus;
  /** Unary gRPC calls answered by the short path of grpc-lane.ts so far (the rest went through the Connect router). */
  grpcLaneCalls(): number;
  /** Graceful stop: NOT_SERVING, stop accepting, drain in-flight RPCs (bounded), close the pool. */
  stop(): Promise<void>;
}

/** Migrates (as the owner), opens the serving pool (as the unprivileged role), and serves both ports. */
export async function startCoordinator({
  config,
  databaseUrl,
  databaseSetting = "DATABASE_URL",
  logger,
  databaseOptions,
  applicationName,
  tracer,
  clock = systemClock,
  hooks,
}: StartOptions): Promise<RunningCoordinator> {
  // Before anything is touched: bodies are sealed, or plaintext was asked for by name.
  if (!config.snapshotKeys && !config.allowPlaintextSnapshots) throw new ConfigError(`the configuration cannot be used: ${SNAPSHOT_KEYS_REQUIRED}`);
  const poolSettings = (connectionString: string, max: number) => ({
    connectionString,
    max,
    connectionTimeoutMs: config.db.connectTimeoutMs,
    statementTimeoutMs: config.db.statementTimeoutMs,
    lockTimeoutMs: config.db.lockTimeoutMs,
    idleInTransactionTimeoutMs: config.db.idleInTransactionTimeoutMs,
    ...(databaseOptions ? { options: databaseOptions } : {}),
    ...(applicationName ? { applicationName } : {}),
    pooler: config.db.pooler,
  });
  if (config.migrateOnBoot) {
    // Migrations hold a session-level lock: always on a connection of their own, never through a pooler (loadConfig requires the URL then).
    const owner = openPool({ ...poolSettings(config.migrationDatabaseUrl ?? databaseUrl, 1), pooler: "none" }, logger);
    try {
      const migrationUrl = config.migrationDatabaseUrl ?? databaseUrl;
      const applied = await retryingLostConnection(() => migrate(owner, logger), logger, "migrating").catch(
        reportUnreachable(migrationUrl, config.migrationDatabaseUrl ? "IDEM_MIGRATION_DATABASE_URL" : databaseSetting),
      );
      if (applied.length > 0) logger.info({ applied }, "registry migrated");
    } finally {
      await owner.end();
    }
  }
  const pool = openPool({ ...poolSettings(databaseUrl, config.db.poolMax), ...(config.db.role ? { role: config.db.role } : {}) }, logger);
  // Work that spans tenants acts as a role of its own, on a small pool of its own (migrations/000010).
  const crossTenantUrl = config.crossTenantDatabaseUrl ?? databaseUrl;
  const crossTenantPool = openPool(
    { ...poolSettings(crossTenantUrl, config.db.crossTenantPoolMax), ...(config.db.crossTenantRole ? { role: config.db.crossTenantRole } : {}) },
    logger,
  );
  // A hot standby's pools for the reads that decide nothing, acting as the same two roles (docs/contract.md, "Reads from a standby").
  const reader = config.readDatabaseUrl
    ? {
        pool: openPool({ ...poolSettings(config.readDatabaseUrl, config.db.poolMax), ...(config.db.role ? { role: config.db.role } : {}) }, logger),
        crossTenantPool: openPool(
          {
            ...poolSettings(config.crossTenantReadDatabaseUrl ?? config.readDatabaseUrl, config.db.crossTenantPoolMax),
            ...(config.db.crossTenantRole ? { role: config.db.crossTenantRole } : {}),
          },
          logger,
        ),
      }
    : undefined;
  const pools = [pool, crossTenantPool, ...(reader ? [reader.pool, reader.crossTenantPool] : [])];
  let rpc: RpcListener | undefined;
  let admin: AdminServer | undefined;
  let policies: PolicyCache | undefined;
  let jobs: BackgroundJob[] = [];
  let readiness: Readiness | undefined;
  const holder = jobHolder();
  try {
    const checking = "checking the serving logins' privileges";
    await retryingLostConnection(() => requireLeastPrivilege(sessionQueryable(pool)), logger, checking).catch(reportUnreachable(databaseUrl, databaseSetting));
    await retryingLostConnection(() => requireLeastPrivilege(sessionQueryable(crossTenantPool)), logger, checking).catch(
      reportUnreachable(crossTenantUrl, config.crossTenantDatabaseUrl ? "IDEM_CROSS_TENANT_DATABASE_URL" : databaseSetting),
    );
    // The embedded default has one superuser login; elsewhere say so when the serving login could switch roles.
    const loose =
      config.databaseUrl === undefined ? undefined : await retryingLostConnection(() => servingLoginCanWiden(sessionQueryable(pool), config.db.crossTenantRole), logger, checking);
    if (loose) {
      logger.warn(
        `the login of DATABASE_URL ${loose}: a statement run by the server could step around row-level security. ` +
          "Serve with a login that is a member of idem_server only, and give the cross-tenant work its own (IDEM_CROSS_TENANT_DATABASE_URL); see SECURITY.md",
      );
    }
    // The reader serves only once its logins are seen to act with least privilege, as the primary's are above. Down at
    // start is no reason not to serve (its reads go to the primary until it answers); too much privilege is.
    let readerChecked = false;
    const probeReader =
      reader &&
      (async (atStart = false) => {
        try {
          await Promise.all([ping(reader.pool, READINESS_PROBE_TIMEOUT_MS), ping(reader.crossTenantPool, READINESS_PROBE_TIMEOUT_MS)]);
        } catch (error) {
          if (atStart) return;
          throw error;
        }
        if (readerChecked) return;
        await Promise.all([requireLeastPrivilege(sessionQueryable(reader.pool)), requireLeastPrivilege(sessionQueryable(reader.crossTenantPool))]).catch((error: unknown) => {
          throw new Error(`IDEM_DB_READ_URL: ${(error as Error).message}`, { cause: error });
        });
        readerChecked = true;
      });
    await probeReader?.(true);

    const callers = new Callers(config.callers, config.allowAnonymous);
    if (config.allowAnonymous) {
      logger.warn("IDEM_ALLOW_ANONYMOUS is on: requests without a token act with every grant. Never do this outside development.");
    } else if (callers.size === 0) {
      logger.warn("no callers are configured (IDEM_CALLERS or IDEM_CALLERS_FILE): every RPC will be refused as UNAUTHENTICATED");
    }
    let metrics: Metrics | undefined;
    const dbOptions = {
      retried: (cause: string) => metrics?.retries.inc({ cause }),
      committed: (name: string, seconds: number) => metrics?.transactionDuration.observe({ transaction: name }, seconds),
      preparedStatements: config.db.preparedStatements,
      // Plan epochs name statements anew: only where statements are named.
      ...(config.db.preparedStatements ? { planned: planEpochs(pool, logger) } : {}),
      ...(tracer ? { tracer } : {}),
    };
    const db = poolDb(pool, logger, { ...dbOptions, crossTenantPool });
    const reads = reader
      ? readerDb(poolDb(reader.pool, logger, { ...dbOptions, crossTenantPool: reader.crossTenantPool }), db, {
          usable: () => readiness?.readerReachable === true,
          fellBack: (why, error) => {
            metrics?.readerFallbacks.inc({ why });
            if (error) logger.warn({ error: (error as Error).message }, "a read failed on the registry's reader: served by DATABASE_URL instead");
          },
        })
      : db;
    for (const notice of config.notices ?? []) logger.warn(notice);
    const store = new PolicyStore(db);
    const readStore = reader ? new PolicyStore(reads) : store;
    for (const document of config.operations) {
      const { created } = await store.publish(document, "configuration");
      if (created)
        logger.info({ operation: document.operation, apiRevision: document.apiRevision, schemaRevision: document.schemaRevision }, "policy published from configuration");
    }
    const publishedOperations = [
      ...new Map((await store.load()).policies.map(({ document: { operation, apiRevision } }) => [`${operation}@${apiRevision}`, { operation, apiRevision }])).values(),
    ];
    policies = new PolicyCache({ load: () => store.load(), refreshMs: config.policyRefreshMs, logger, clock });
    await policies.start();
    const policyCache = policies;
    if (!config.snapshotKeys) {
      logger.warn(
        "IDEM_ALLOW_PLAINTEXT_SNAPSHOTS is on and no key ring is set (IDEM_SNAPSHOT_KEYS): response bodies are stored unsealed. Never do this in production; see SECURITY.md",
      );
    }
    const registry = new Registry({
      policies: policyCache,
      keyring: config.snapshotKeys,
      recoveryCadenceMs: config.recovererIntervalMs,
      answerCacheMaxAgeMs: config.answerCacheMaxAgeMs,
      hooks,
      coalesce: config.batch,
    });
    metrics = new Metrics({ pool, census: () => registry.census(db), unknownSloSeconds: config.unknownSloSeconds });
    const health = new HealthStatus([CoordinatorService.typeName, AdminService.typeName]);
    readiness = new Readiness(health, () => ping(pool, READINESS_PROBE_TIMEOUT_MS), logger, READINESS_PROBE_INTERVAL_MS, clock, probeReader);
    const ready = readiness;
    const inFlight = new InFlight();
    const services = {
      registry,
      db,
      reads,
      metrics,
      store,
      readStore,
      policies: policyCache,
      policyRefreshMs: config.policyRefreshMs,
      waitersPerCaller: config.waitersPerCaller,
      // One sampler for both ports: it samples from the first time the charts are asked for, wherever.
      decisions: new DecisionSampler(metrics.decisions),
      ...(tracer ? { tracer } : {}),
    };
    const rpcOptions = {
      // Outermost first: count, trace, time and log the RPC; then map any error, authenticate and check the message.
      interceptors: [
        inFlight.interceptor,
        ...(tracer ? [tracingInterceptor(tracer)] : []),
        metrics.interceptor(),
        accessLog(logger, config.accessLog ? "info" : "debug"),
        ...refusalInterceptors(logger, callers),
      ],
      jsonOptions: JSON_OPTIONS,
      readMaxBytes: config.maxRequestBytes,
      maxTimeoutMs: config.maxDeadlineMs,
      contextValues: (socket: unknown) => createContextValues().set(peerKey, peerCertificateOf(socket)),
      corsOrigins: config.corsOrigins,
      logger,
    };
    const handler = rpcHandler({
      ...rpcOptions,
      routes: (router) => {
        serviceRoutes(services)(router);
        router.service(Health, health.service());
        if (config.reflection) reflectionRoutes([CoordinatorService, AdminService, Health])(router);
      },
    });
    // The console page's calls: AdminService as the RPC port serves it, on the admin port beside the page (same origin).
    const consoleRpc = rpcHandler({ ...rpcOptions, routes: (router) => router.service(AdminService, adminService(services)) });

    jobs = backgroundJobs(registry, db, metrics, config, logger, clock, holder);
    rpc = await listenRpc(withCors(handler, config.corsOrigins), config.host, config.rpcPort, {
      ...(config.tls ? { tls: { config: config.tls, logger } } : {}),
      grpcLane: handler.grpcLane,
    });
    const metricsRegistry = metrics.registry;
    admin = await listenAdmin(
      {
        serving: () => ready.serving,
        databaseReachable: () => Promise.resolve(ready.databaseReachable),
        readerReachable: () => ready.readerReachable,
        metrics: async () => ({ contentType: metricsRegistry.contentType, body: await metricsRegistry.metrics() }),
      },
      [consoleRoutes(consoleRpc)],
      config.host,
      config.adminPort,
      logger,
    );
    for (const job of jobs) job.start();
    await ready.start();

    const rpcListener = rpc;
    const adminServer = admin;
    const runningJobs = jobs;
    let stopping: Promise<void> | undefined;
    return {
      rpcHost: rpc.host,
      rpcPort: rpc.port,
      adminHost: admin.host,
      adminPort: admin.port,
      publishedOperations,
      jobHolder: holder,
      health,
      grpcLaneCalls: () => handler.grpcLane.served,
      stop: () =>
        (stopping ??= (async () => {
          ready.stop();
          rpcListener.closeGracefully();
          const drained = await inFlight.drained(config.shutdownGraceMs);
          // Every handler is done: give their responses a moment to reach the
          // clients. A connection still open after that has nothing left to
          // wait for (e.g. a client still sending a message that was refused).
          const closed = drained && (await rpcListener.closed(RESPONSE_FLUSH_MS));
          if (!closed) {
            logger.warn({ inFlight: inFlight.size }, "shutdown grace elapsed; closing the remaining connections");
            rpcListener.destroy();
          }
          await Promise.all(runningJobs.map((job) => job.stop()));
          await adminServer.close();
          policyCache.stop();
          await Promise.all(pools.map((p) => p.end()));
        })()),
    };
  } catch (error) {
    readiness?.stop();
    await Promise.all(jobs.map((job) => job.stop()));
    policies?.stop();
    rpc?.destroy();
    await admin?.close();
    await Promise.all(pools.map((p) => p.end().catch(() => undefined)));
    throw error;
  }
}
