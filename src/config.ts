import type { PolicyDocument } from "./policy/document.js";
import { parsePolicyDocuments } from "./policy/operations.js";
import type { SnapshotKeyring } from "./crypto/sealing.js";
import type { CallerGrant } from "./server/callers.js";
import { SETTINGS, type Setting, type SettingName } from "./settings.js";

export { ENVIRONMENT } from "./settings.js";

/** The value type of a variable, as its declaration reads it. */
type SettingValue<N extends SettingName> = (typeof SETTINGS)[N] extends Setting<infer T> ? T : never;

/**
 * The coordinator's whole configuration, read from the environment once at
 * boot. Every problem is reported at once, each with the variable to fix.
 * The environment has a few other readers, each for settings that are not
 * the coordinator's: OpenTelemetry's own variables (OTEL_*, src/server
 * tracing), PGOPTIONS as the PostgreSQL driver reads it (src/registry/db.ts),
 * idemctl's client commands (IDEM_URL, IDEM_TOKEN) and co-located services'
 * key ring (snapshotKeysFromEnv).
 */
export interface Config {
  /** PostgreSQL connection string; undefined means the embedded PostgreSQL. */
  databaseUrl: string | undefined;
  host: string;
  rpcPort: number;
  adminPort: number;
  /** IDEM_PORTS_FILE: where the ports bound are written once the coordinator serves. */
  portsFile?: string | undefined;
  /** The owner's connection string for migrations, when it is not DATABASE_URL's login. */
  migrationDatabaseUrl: string | undefined;
  /** The login of the cross-tenant pool, when it is not DATABASE_URL's (it should not be: SECURITY.md). */
  crossTenantDatabaseUrl: string | undefined;
  /**
   * A hot standby of the registry for the reads that decide nothing (Lookup,
   * ListRecoverable, the listings, policies, the console); undefined: every
   * read on DATABASE_URL. See docs/contract.md, "Reads from a standby".
   */
  readDatabaseUrl: string | undefined;
  /** The login on that standby of the reads that span tenants, when it is not readDatabaseUrl's. */
  crossTenantReadDatabaseUrl: string | undefined;
  db: {
    /** The unprivileged role every serving connection acts as (undefined: the login's own). */
    role: string | undefined;
    poolMax: number;
    /** The role of the work that spans tenants: jobs, operators' listings (undefined: the login's own). */
    crossTenantRole: string | undefined;
    crossTenantPoolMax: number;
    connectTimeoutMs: number;
    statementTimeoutMs: number;
    lockTimeoutMs: number;
    idleInTransactionTimeoutMs: number;
    /** Named prepared statements on the request path (off behind a pooler in transaction mode). */
    preparedStatements: boolean;
    /**
     * "transaction": the connections go through a pooler in transaction mode
     * (PgBouncer), where a server connection serves another client after each
     * transaction: no named statements, and every session setting (role,
     * timeouts, search_path) is set inside each transaction instead.
     */
    pooler: "none" | "transaction";
  };
  /**
   * Concurrent Reserves and Completes of one tenant and caller share a
   * transaction: at most `maxInFlight` at a time, up to `maxBatch` each (1:
   * never), waiting at most `lockWaitMs` for a row lock.
   */
  batch: { maxBatch: number; maxInFlight: number; lockWaitMs: number };
  /** Most Reserves of one caller waiting for an owner at once. */
  waitersPerCaller: number;
  migrateOnBoot: boolean;
  /** Callers and their grants (tokens stored as SHA-256 hashes). */
  callers: CallerGrant[];
  /** Development only: accept requests without a token, as an all-powerful caller. */
  allowAnonymous: boolean;
  /** Policy revisions published at boot (each only once: republishing equal rules changes nothing). */
  operations: PolicyDocument[];
  /** Settings read with another meaning than written (values of older releases), warned at boot. */
  notices?: string[];
  /** How often every coordinator re-reads policies, modes and epochs from the registry. */
  policyRefreshMs: number;
  /** How often the recoverer (one replica at a time) looks for ended leases. */
  recovererIntervalMs: number;
  /** How often the retention sweep (one replica at a time) runs. */
  sweepIntervalMs: number;
  /** Longest a gateway may answer an exact repeat of a finished request from its cache (ReserveResponse.cacheable_for); 0: never. */
  answerCacheMaxAgeMs: number;
  /** How long a record may stay UNKNOWN before it breaches the recovery SLO (metrics and alerts). */
  unknownSloSeconds: number;
  /** TLS (and mutual TLS) on the RPC port; undefined serves cleartext (h2c and HTTP/1.1). */
  tls: TlsConfig | undefined;
  /**
   * Seals stored response bodies at rest (AES-256-GCM). Required with
   * DATABASE_URL unless `allowPlaintextSnapshots`; the embedded default
   * generates one (serve).
   */
  snapshotKeys: SnapshotKeyring | undefined;
  /** Store response bodies unsealed when no key ring is set (IDEM_ALLOW_PLAINTEXT_SNAPSHOTS): warned at every boot. */
  allowPlaintextSnapshots: boolean;
  /** Serve gRPC server reflection (grpc.reflection.v1 and v1alpha) on the RPC port, without credentials. */
  reflection: boolean;
  /** Origins whose pages may call the RPC port from a browser (CORS); none by default. */
  corsOrigins: string[];
  /** Largest RPC request accepted, in bytes. */
  maxRequestBytes: number;
  /** Upper bound of any deadline a client asks for. */
  maxDeadlineMs: number;
  /** How long SIGTERM waits for in-flight RPCs before closing connections. */
  shutdownGraceMs: number;
  /**
   * Coordinator processes on this machine sharing the RPC port (node:cluster);
   * worker i serves its admin port at IDEM_ADMIN_PORT + i.
   */
  workers: number;
  /** Local state of the embedded default: cluster files and the development token. */
  stateDir: string;
  embeddedPostgresPort: number;
  logLevel: string;
  /** One log line per RPC at info (method, caller, code, duration); false: at debug only. */
  accessLog: boolean;
}

/** A configuration that cannot be used; the message lists every problem. */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

/** TLS on the RPC port. */
export interface TlsConfig {
  certFile: string;
  keyFile: string;
  /** Client certificates are requested and verified against this CA when set. */
  clientCaFile: string | undefined;
  /** With a client CA: refuse connections without a valid client certificate (default true). */
  requireClientCertificate: boolean;
  /** How often the certificate, key and CA files are checked for changes. */
  reloadMs: number;
}

/** The operation published by default on the embedded database, so that a first call works. */
const DEVELOPMENT_OPERATIONS = [{ operation: "payments.create", apiRevision: 1 }];

/**
 * The refusal of a configuration that would store response bodies unsealed
 * without saying so (loadConfig, and startCoordinator whatever built its
 * configuration).
 */
export const SNAPSHOT_KEYS_REQUIRED =
  "IDEM_SNAPSHOT_KEYS or IDEM_SNAPSHOT_KEYS_FILE: required with DATABASE_URL, so that stored response bodies are sealed; " +
  'make a key ring with `idemctl keygen --id <key id> --ring` (SECURITY.md, "Responses at rest"), ' +
  "or set IDEM_ALLOW_PLAINTEXT_SNAPSHOTS=true to store them unsealed (never in production)";

/** What the configuration is read for. */
export interface LoadOptions {
  /**
   * Only to apply migrations (`idemctl migrate`): no response body is stored,
   * so no key ring is required.
   */
  forMigrations?: boolean;
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env, options: LoadOptions = {}): Config {
  const problems: string[] = [];
  /** `parse()` of what a variable holds; a value it refuses is a problem of that variable (and undefined). */
  const interpret = <T>(name: SettingName, parse: () => T): T | undefined => {
    try {
      return parse();
    } catch (error) {
      problems.push(`${name}: ${(error as Error).message}`);
      return undefined;
    }
  };
  /** A variable's value by its declaration (settings.ts), or `fallback` when it is unset or refused. */
  const read = <N extends SettingName>(name: N, fallback = SETTINGS[name].fallback as SettingValue<N>): SettingValue<N> => {
    const raw = env[name]?.trim();
    if (raw === undefined || raw === "") return fallback;
    return interpret(name, () => (SETTINGS[name] as Setting<SettingValue<N>>).parse(raw)) ?? fallback;
  };
  const databaseUrl = read("DATABASE_URL");

  const migrationDatabaseUrl = read("IDEM_MIGRATION_DATABASE_URL");
  const crossTenantDatabaseUrl = read("IDEM_CROSS_TENANT_DATABASE_URL");
  if (crossTenantDatabaseUrl !== undefined && databaseUrl === undefined) {
    problems.push("IDEM_CROSS_TENANT_DATABASE_URL: needs DATABASE_URL (the embedded default has one login)");
  }
  const readDatabaseUrl = read("IDEM_DB_READ_URL");
  const pooler = read("IDEM_DB_POOLER");
  const preparedStatements = read("IDEM_DB_PREPARED_STATEMENTS", pooler !== "transaction");
  const migrateOnBoot = read("IDEM_MIGRATE_ON_BOOT");
  if (pooler === "transaction" && databaseUrl === undefined) problems.push("IDEM_DB_POOLER: needs DATABASE_URL (the embedded default has no pooler)");
  if (pooler === "transaction" && preparedStatements) {
    problems.push("IDEM_DB_PREPARED_STATEMENTS: named statements fail, or answer with another client's statement, behind a pooler in transaction mode; remove it");
  }
  if (pooler === "transaction" && migrationDatabaseUrl === undefined && migrateOnBoot) {
    problems.push(
      "IDEM_DB_POOLER: migrations hold a session-level lock, which a pooler in transaction mode does not keep; set IDEM_MIGRATION_DATABASE_URL to PostgreSQL itself, or IDEM_MIGRATE_ON_BOOT=false and run `idemctl migrate` directly",
    );
  }
  const crossTenantReadDatabaseUrl = read("IDEM_CROSS_TENANT_DB_READ_URL");
  if (readDatabaseUrl !== undefined && databaseUrl === undefined) {
    problems.push("IDEM_DB_READ_URL: needs DATABASE_URL (the embedded default has no standby)");
  }
  if (crossTenantReadDatabaseUrl !== undefined && readDatabaseUrl === undefined) {
    problems.push("IDEM_CROSS_TENANT_DB_READ_URL: needs IDEM_DB_READ_URL");
  }
  // The standby's logins are the primary's: reads that span tenants log in as the cross-tenant work does, never as the server.
  if (readDatabaseUrl !== undefined && crossTenantDatabaseUrl !== undefined && crossTenantReadDatabaseUrl === undefined) {
    problems.push("IDEM_CROSS_TENANT_DB_READ_URL: required with IDEM_DB_READ_URL and IDEM_CROSS_TENANT_DATABASE_URL (the cross-tenant login on the standby)");
  }
  if (migrationDatabaseUrl !== undefined && databaseUrl === undefined) {
    problems.push("IDEM_MIGRATION_DATABASE_URL: needs DATABASE_URL (the embedded default migrates as its own superuser)");
  }

  const callers = read("IDEM_CALLERS");
  const callersFromFile = read("IDEM_CALLERS_FILE");
  if (env.IDEM_CALLERS && env.IDEM_CALLERS_FILE) problems.push("IDEM_CALLERS and IDEM_CALLERS_FILE: set only one");

  const notices: string[] = [];
  const noticeOf = (name: string) => (line: string) => notices.push(`${name}: ${line}`);
  const operationsInline = read("IDEM_OPERATIONS");
  const operationsFile = read("IDEM_OPERATIONS_FILE");
  const declaredIn = (name: "IDEM_OPERATIONS" | "IDEM_OPERATIONS_FILE", documents: unknown) =>
    documents === undefined ? undefined : interpret(name, () => parsePolicyDocuments(documents, noticeOf(name)));
  if (env.IDEM_OPERATIONS && env.IDEM_OPERATIONS_FILE) problems.push("IDEM_OPERATIONS and IDEM_OPERATIONS_FILE: set only one");
  const declared = declaredIn("IDEM_OPERATIONS", operationsInline) ?? declaredIn("IDEM_OPERATIONS_FILE", operationsFile);

  const tlsCert = read("IDEM_TLS_CERT_FILE");
  const tlsKey = read("IDEM_TLS_KEY_FILE");
  const tlsClientCa = read("IDEM_TLS_CLIENT_CA_FILE");
  if ((tlsCert === undefined) !== (tlsKey === undefined)) problems.push("IDEM_TLS_CERT_FILE and IDEM_TLS_KEY_FILE: set both, or neither");
  if (tlsClientCa !== undefined && tlsCert === undefined) problems.push("IDEM_TLS_CLIENT_CA_FILE: needs IDEM_TLS_CERT_FILE and IDEM_TLS_KEY_FILE");
  const tls: TlsConfig | undefined =
    tlsCert && tlsKey
      ? {
          certFile: tlsCert,
          keyFile: tlsKey,
          clientCaFile: tlsClientCa,
          requireClientCertificate: read("IDEM_TLS_REQUIRE_CLIENT_CERT"),
          reloadMs: read("IDEM_TLS_RELOAD_MS"),
        }
      : undefined;

  const keysInline = read("IDEM_SNAPSHOT_KEYS");
  const keysFile = read("IDEM_SNAPSHOT_KEYS_FILE");
  if (env.IDEM_SNAPSHOT_KEYS && env.IDEM_SNAPSHOT_KEYS_FILE) problems.push("IDEM_SNAPSHOT_KEYS and IDEM_SNAPSHOT_KEYS_FILE: set only one");
  const allowPlaintextSnapshots = read("IDEM_ALLOW_PLAINTEXT_SNAPSHOTS");
  const ringGiven = Boolean(env.IDEM_SNAPSHOT_KEYS?.trim() || env.IDEM_SNAPSHOT_KEYS_FILE?.trim());
  // A shared database holds every tenant's responses: they are sealed unless plaintext is asked for by name.
  if (databaseUrl !== undefined && !ringGiven && !allowPlaintextSnapshots && !options.forMigrations) {
    problems.push(SNAPSHOT_KEYS_REQUIRED);
  }
  if (ringGiven && allowPlaintextSnapshots) {
    problems.push("IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: a key ring is configured, so bodies are sealed; remove the setting");
  }

  const logLevel = read("LOG_LEVEL");

  const config: Config = {
    databaseUrl,
    // The embedded development start mints a token with every grant: it listens on this machine only unless told otherwise.
    host: read("IDEM_HOST", databaseUrl === undefined ? "127.0.0.1" : "0.0.0.0"),
    rpcPort: read("IDEM_RPC_PORT"),
    adminPort: read("IDEM_ADMIN_PORT"),
    portsFile: read("IDEM_PORTS_FILE"),
    migrationDatabaseUrl,
    crossTenantDatabaseUrl,
    readDatabaseUrl,
    crossTenantReadDatabaseUrl,
    db: {
      // Set but empty: connect as the login itself (which must then be unprivileged).
      role: env.IDEM_DB_ROLE?.trim() === "" ? undefined : read("IDEM_DB_ROLE"),
      poolMax: read("IDEM_DB_POOL_MAX"),
      crossTenantRole: env.IDEM_DB_CROSS_TENANT_ROLE?.trim() === "" ? undefined : read("IDEM_DB_CROSS_TENANT_ROLE"),
      crossTenantPoolMax: read("IDEM_DB_CROSS_TENANT_POOL_MAX"),
      connectTimeoutMs: read("IDEM_DB_CONNECT_TIMEOUT_MS"),
      statementTimeoutMs: read("IDEM_DB_STATEMENT_TIMEOUT_MS"),
      lockTimeoutMs: read("IDEM_DB_LOCK_TIMEOUT_MS"),
      idleInTransactionTimeoutMs: read("IDEM_DB_IDLE_TX_TIMEOUT_MS"),
      preparedStatements,
      pooler,
    },
    batch: {
      maxBatch: read("IDEM_BATCH_MAX"),
      maxInFlight: read("IDEM_BATCH_IN_FLIGHT"),
      lockWaitMs: read("IDEM_BATCH_LOCK_WAIT_MS"),
    },
    waitersPerCaller: read("IDEM_WAITERS_PER_CALLER"),
    migrateOnBoot,
    callers: [...callers, ...callersFromFile],
    allowAnonymous: read("IDEM_ALLOW_ANONYMOUS"),
    operations: declared ?? (databaseUrl === undefined ? parsePolicyDocuments(DEVELOPMENT_OPERATIONS) : []),
    notices,
    policyRefreshMs: read("IDEM_POLICY_REFRESH_MS"),
    recovererIntervalMs: read("IDEM_RECOVERER_INTERVAL_MS"),
    sweepIntervalMs: read("IDEM_SWEEP_INTERVAL_MS"),
    answerCacheMaxAgeMs: read("IDEM_ANSWER_CACHE_MAX_AGE_MS"),
    unknownSloSeconds: read("IDEM_UNKNOWN_SLO_SECONDS"),
    tls,
    snapshotKeys: keysInline ?? keysFile,
    allowPlaintextSnapshots,
    reflection: read("IDEM_REFLECTION"),
    corsOrigins: read("IDEM_CORS_ORIGINS"),
    maxRequestBytes: read("IDEM_MAX_REQUEST_BYTES"),
    maxDeadlineMs: read("IDEM_MAX_DEADLINE_MS"),
    shutdownGraceMs: read("IDEM_SHUTDOWN_GRACE_MS"),
    workers: read("IDEM_WORKERS"),
    stateDir: read("IDEM_STATE_DIR"),
    embeddedPostgresPort: read("IDEM_EMBEDDED_PG_PORT"),
    logLevel,
    accessLog: read("IDEM_ACCESS_LOG"),
  };
  if (config.rpcPort !== 0 && config.rpcPort === config.adminPort) {
    problems.push("IDEM_RPC_PORT and IDEM_ADMIN_PORT: must differ");
  }
  if (config.workers > 1 && config.databaseUrl === undefined) {
    problems.push("IDEM_WORKERS: more than one needs DATABASE_URL (the embedded development database serves one process)");
  }
  if (config.workers > 1 && config.adminPort !== 0 && config.rpcPort > config.adminPort && config.rpcPort < config.adminPort + config.workers) {
    problems.push(`IDEM_WORKERS: the admin ports ${config.adminPort}–${config.adminPort + config.workers - 1} (one per worker) include IDEM_RPC_PORT`);
  }
  // One problem in one line (what `npm start` prints); several as a list.
  if (problems.length === 1) throw new ConfigError(`the configuration cannot be used: ${problems[0]}`);
  if (problems.length > 1) {
    throw new ConfigError(`the configuration cannot be used:\n  - ${problems.join("\n  - ")}\nSee README.md, "Configuration".`);
  }
  return config;
}
