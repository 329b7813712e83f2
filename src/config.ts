import { accessSync, constants as fsConstants, readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import type { PolicyDocument } from "./policy/document.js";
import { parsePolicyDocuments } from "./policy/operations.js";
import { parseKeyring, type SnapshotKeyring } from "./crypto/sealing.js";

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

/** The variables, their defaults and meaning (also the README's configuration table). */
export const ENVIRONMENT: ReadonlyArray<{ name: string; default: string; meaning: string }> = [
  { name: "DATABASE_URL", default: "(unset: embedded PostgreSQL)", meaning: "PostgreSQL connection string of the registry" },
  {
    name: "IDEM_HOST",
    default: "0.0.0.0 (embedded: 127.0.0.1)",
    meaning: "address both ports listen on; without DATABASE_URL (the development start, whose token holds every grant) loopback only unless set",
  },
  { name: "IDEM_RPC_PORT", default: "7070", meaning: "gRPC, gRPC-Web and Connect (HTTP/2 cleartext and HTTP/1.1)" },
  { name: "IDEM_ADMIN_PORT", default: "7071", meaning: "/healthz, /readyz, /metrics and the operator console" },
  { name: "IDEM_MIGRATION_DATABASE_URL", default: "(DATABASE_URL)", meaning: "connection string of the tables' owner, for migrations" },
  { name: "IDEM_DB_ROLE", default: "idem_server", meaning: "role the server acts as on its connections: owns nothing, row security applies; empty: the login's own" },
  { name: "IDEM_DB_POOL_MAX", default: "20", meaning: "most registry connections per process" },
  {
    name: "IDEM_CROSS_TENANT_DATABASE_URL",
    default: "(DATABASE_URL)",
    meaning: "login of the work that spans tenants (jobs, operators' listings): a member of idem_cross_tenant only",
  },
  { name: "IDEM_DB_CROSS_TENANT_ROLE", default: "idem_cross_tenant", meaning: "role that work acts as: sees every tenant; empty: the login's own" },
  { name: "IDEM_DB_CROSS_TENANT_POOL_MAX", default: "4", meaning: "most connections of that work per process" },
  {
    name: "IDEM_DB_READ_URL",
    default: "(unset: every read on DATABASE_URL)",
    meaning:
      "hot standby of the registry for the reads that decide nothing (Lookup, ListRecoverable, listings, policies, console), a login like DATABASE_URL's; while it does not answer they go to DATABASE_URL",
  },
  {
    name: "IDEM_CROSS_TENANT_DB_READ_URL",
    default: "(IDEM_DB_READ_URL)",
    meaning: "login on that standby of the reads that span tenants; required with IDEM_CROSS_TENANT_DATABASE_URL",
  },
  { name: "IDEM_DB_CONNECT_TIMEOUT_MS", default: "2000", meaning: "wait for a free connection before UNAVAILABLE" },
  { name: "IDEM_DB_STATEMENT_TIMEOUT_MS", default: "5000", meaning: "upper bound of one SQL statement" },
  { name: "IDEM_DB_LOCK_TIMEOUT_MS", default: "2000", meaning: "upper bound of waiting for a record's row lock" },
  { name: "IDEM_DB_IDLE_TX_TIMEOUT_MS", default: "10000", meaning: "the database ends a transaction left idle this long" },
  {
    name: "IDEM_BATCH_MAX",
    default: "64",
    meaning: "most concurrent Reserves (or Completes) of one tenant and caller that share one transaction and COMMIT; 1: each its own",
  },
  { name: "IDEM_BATCH_IN_FLIGHT", default: "4", meaning: "most transactions of such requests at a time per tenant and caller; more wait and go together in the next" },
  {
    name: "IDEM_BATCH_LOCK_WAIT_MS",
    default: "50",
    meaning: "longest wait of such a shared transaction for a row lock; past it each request is decided alone, so that one held lock never delays its neighbours",
  },
  {
    name: "IDEM_WAITERS_PER_CALLER",
    default: "256",
    meaning: "most Reserves of one caller waiting for an owner at once (wait_for_owner) on this coordinator; one more is refused RESOURCE_EXHAUSTED",
  },
  {
    name: "IDEM_DB_PREPARED_STATEMENTS",
    default: "true",
    meaning: "prepare the registry's statements once per connection (off, and true refused, with IDEM_DB_POOLER=transaction)",
  },
  {
    name: "IDEM_DB_POOLER",
    default: "none",
    meaning:
      "transaction: the database URLs lead to a pooler in transaction mode (PgBouncer): no named statements, session settings set in every transaction; migrations need IDEM_MIGRATION_DATABASE_URL to PostgreSQL itself",
  },
  { name: "IDEM_MIGRATE_ON_BOOT", default: "true", meaning: "apply pending migrations at start (under a lock; begun again on a new connection if its connection is lost)" },
  {
    name: "IDEM_WORKERS",
    default: "1",
    meaning: "coordinator processes sharing the RPC port (needs DATABASE_URL); worker i answers on admin port IDEM_ADMIN_PORT + i",
  },
  { name: "IDEM_CALLERS", default: "(none)", meaning: "JSON array of callers: name, tokenSha256 and/or certificate, tenants, operations, roles" },
  { name: "IDEM_CALLERS_FILE", default: "(none)", meaning: "path of a file holding that JSON array instead" },
  { name: "IDEM_ALLOW_ANONYMOUS", default: "false", meaning: "development only: serve requests without a token" },
  { name: "IDEM_OPERATIONS", default: "(embedded: payments.create@1)", meaning: "JSON array of policy revisions to publish at boot" },
  { name: "IDEM_OPERATIONS_FILE", default: "(none)", meaning: "path of a YAML or JSON file holding that array instead" },
  { name: "IDEM_POLICY_REFRESH_MS", default: "2000", meaning: "how soon a new policy, mode or epoch applies on every replica" },
  { name: "IDEM_RECOVERER_INTERVAL_MS", default: "1000", meaning: "how often ended leases become UNKNOWN or claimable; the Retry-After of UNKNOWN records" },
  { name: "IDEM_SWEEP_INTERVAL_MS", default: "60000", meaning: "how often finished records past retention become tombstones" },
  { name: "IDEM_UNKNOWN_SLO_SECONDS", default: "3600", meaning: "recovery SLO of UNKNOWN records (metrics, alerts)" },
  { name: "IDEM_TLS_CERT_FILE", default: "(unset: cleartext)", meaning: "PEM certificate (chain) of the RPC port; with the key, serves TLS (ALPN h2 and http/1.1)" },
  { name: "IDEM_TLS_KEY_FILE", default: "(unset)", meaning: "PEM private key of that certificate" },
  { name: "IDEM_TLS_CLIENT_CA_FILE", default: "(unset)", meaning: "PEM CA of client certificates: mutual TLS" },
  { name: "IDEM_TLS_REQUIRE_CLIENT_CERT", default: "true", meaning: "with a client CA: refuse connections without a valid client certificate" },
  { name: "IDEM_TLS_RELOAD_MS", default: "10000", meaning: "how often changed certificate, key and CA files are reloaded" },
  { name: "IDEM_SNAPSHOT_KEYS", default: "(embedded: generated)", meaning: "key ring sealing stored response bodies (AES-256-GCM); required with DATABASE_URL" },
  { name: "IDEM_SNAPSHOT_KEYS_FILE", default: "(none)", meaning: "path of a file holding that key ring instead" },
  {
    name: "IDEM_ALLOW_PLAINTEXT_SNAPSHOTS",
    default: "false",
    meaning: "never in production: with DATABASE_URL and no key ring, store response bodies unsealed (warned at every boot)",
  },
  { name: "IDEM_REFLECTION", default: "true", meaning: "serve gRPC server reflection (v1, v1alpha) without credentials, for buf curl, grpcurl, grpcui, Postman" },
  {
    name: "IDEM_CORS_ORIGINS",
    default: "(none)",
    meaning:
      "comma-separated exact origins (scheme://host[:port], no path; patterns such as https://*.example.com are refused) whose pages may call the RPC port from a browser (Connect, gRPC-Web)",
  },
  { name: "IDEM_MAX_REQUEST_BYTES", default: "4194304", meaning: "largest RPC request accepted" },
  { name: "IDEM_MAX_DEADLINE_MS", default: "30000", meaning: "cap on any deadline a client asks for" },
  { name: "IDEM_SHUTDOWN_GRACE_MS", default: "20000", meaning: "how long SIGTERM lets in-flight RPCs finish" },
  { name: "IDEM_STATE_DIR", default: ".idem", meaning: "embedded default: cluster files and development token" },
  { name: "IDEM_EMBEDDED_PG_PORT", default: "54329", meaning: "embedded default: port of the embedded PostgreSQL" },
  {
    name: "OTEL_EXPORTER_OTLP_ENDPOINT",
    default: "(unset: no tracing)",
    meaning: "OpenTelemetry collector (OTLP/HTTP); a span per RPC, per batched call and per registry transaction",
  },
  { name: "OTEL_SERVICE_NAME", default: "idempotency-coordinator", meaning: "service name on the spans" },
  { name: "LOG_LEVEL", default: "info", meaning: "pino log level (fatal, error, warn, info, debug, trace, silent)" },
  {
    name: "IDEM_ACCESS_LOG",
    default: "true",
    meaning: "a log line per RPC at info level: method, caller, code, duration, operation id; false: at debug level only",
  },
];

/** A configuration that cannot be used; the message lists every problem. */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

/** What a caller may do: the roles the RPCs check. */
export type Role = "gateway" | "worker" | "operator";
const ROLES: readonly Role[] = ["gateway", "worker", "operator"];

/** One configured caller. The token itself is never configured, only its SHA-256. */
export interface CallerGrant {
  name: string;
  /** Lower-case hex SHA-256 of the bearer token (`idemctl token` prints one). */
  tokenSha256?: string;
  /**
   * With mutual TLS: the client certificate identity that authenticates this
   * caller, one of `URI:<uri>` (e.g. a SPIFFE id), `DNS:<name>` (a subject
   * alternative name) or `CN:<common name>`.
   */
  certificate?: string;
  /** Tenants the caller may act for; `*` for all. */
  tenants: string[];
  /** Operations the caller may act on; `*` for all. */
  operations: string[];
  roles: Role[];
}

const GRANT_SETTINGS = ["name", "tokenSha256", "certificate", "tenants", "operations", "roles"];

/** Reads a JSON array of caller grants, refusing anything malformed with its path. */
export function parseCallerGrants(input: unknown): CallerGrant[] {
  if (!Array.isArray(input)) throw new Error("must be a JSON array of callers");
  // A name may appear again with another credential (rotating a token or a
  // certificate without downtime), but only with the same grants: one name is
  // one caller in the event log.
  const grantsByName = new Map<string, { index: number; grants: string }>();
  const credentials = new Set<string>();
  return input.map((entry: unknown, i) => {
    const path = `callers[${i}]`;
    if (typeof entry !== "object" || entry === null || Array.isArray(entry)) throw new Error(`${path} must be an object`);
    const o = entry as Record<string, unknown>;
    for (const key of Object.keys(o)) {
      if (!GRANT_SETTINGS.includes(key)) throw new Error(`${path}.${key} is not a known setting (known: ${GRANT_SETTINGS.join(", ")})`);
    }
    if (typeof o.name !== "string" || !/^[A-Za-z0-9._-]{1,64}$/.test(o.name)) {
      throw new Error(`${path}.name must be 1 to 64 characters of A-Z a-z 0-9 . _ -`);
    }
    if (o.tokenSha256 === undefined && o.certificate === undefined) {
      throw new Error(`${path} needs tokenSha256 (a bearer token's hash) or certificate (a client certificate identity), or both`);
    }
    if (o.tokenSha256 !== undefined && (typeof o.tokenSha256 !== "string" || !/^[0-9a-f]{64}$/.test(o.tokenSha256))) {
      throw new Error(`${path}.tokenSha256 must be the 64 lower-case hex digits of the token's SHA-256 (idemctl token prints it)`);
    }
    if (o.certificate !== undefined && (typeof o.certificate !== "string" || !/^(URI|DNS|CN):[^\s]{1,512}$/.test(o.certificate))) {
      throw new Error(`${path}.certificate must be URI:<uri>, DNS:<name> or CN:<common name> of the client certificate`);
    }
    for (const credential of [o.tokenSha256, o.certificate]) {
      if (typeof credential !== "string") continue;
      if (credentials.has(credential)) throw new Error(`${path}: its ${credential === o.certificate ? "certificate" : "tokenSha256"} is shared with another caller`);
      credentials.add(credential);
    }
    const list = (value: unknown, field: string) => {
      if (!Array.isArray(value) || value.length === 0 || !value.every((v) => typeof v === "string" && v.length > 0)) {
        throw new Error(`${path}.${field} must be a non-empty array of strings ("*" for all)`);
      }
      return value as string[];
    };
    const roles = list(o.roles, "roles");
    for (const role of roles) {
      if (!ROLES.includes(role as Role)) throw new Error(`${path}.roles: '${role}' is not one of ${ROLES.join(", ")}`);
    }
    const tenants = list(o.tenants, "tenants");
    const operations = list(o.operations, "operations");
    const grants = JSON.stringify([[...tenants].sort(), [...operations].sort(), [...roles].sort()]);
    const same = grantsByName.get(o.name);
    if (same && same.grants !== grants) {
      throw new Error(`${path}.name '${o.name}' is used by callers[${same.index}] with other grants: one name, one set of grants (a second entry only adds a credential)`);
    }
    if (!same) grantsByName.set(o.name, { index: i, grants });
    return {
      name: o.name,
      ...(typeof o.tokenSha256 === "string" ? { tokenSha256: o.tokenSha256 } : {}),
      ...(typeof o.certificate === "string" ? { certificate: o.certificate } : {}),
      tenants,
      operations,
      roles: roles as Role[],
    };
  });
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
  const read = <T>(name: string, parse: (raw: string) => T, fallback: T): T => {
    const raw = env[name];
    if (raw === undefined || raw.trim() === "") return fallback;
    try {
      return parse(raw.trim());
    } catch (error) {
      problems.push(`${name}: ${(error as Error).message}`);
      return fallback;
    }
  };
  const integer = (min: number, max: number) => (raw: string) => {
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min || n > max) throw new Error(`must be an integer from ${min} to ${max}, got '${raw}'`);
    return n;
  };
  const port = integer(0, 65535);
  const boolean = (raw: string) => {
    if (/^(true|1|yes)$/i.test(raw)) return true;
    if (/^(false|0|no)$/i.test(raw)) return false;
    throw new Error(`must be true or false, got '${raw}'`);
  };
  const postgresUrl = (raw: string) => {
    if (!/^postgres(ql)?:\/\//.test(raw)) throw new Error("must be a postgres:// connection string");
    return raw;
  };
  const sqlRole = (raw: string) => {
    if (!/^[a-z_][a-z0-9_]*$/.test(raw)) throw new Error(`must be a plain lower-case SQL role name, got '${raw}'`);
    return raw;
  };
  const databaseUrl = read("DATABASE_URL", postgresUrl, undefined as string | undefined);

  const migrationDatabaseUrl = read("IDEM_MIGRATION_DATABASE_URL", postgresUrl, undefined as string | undefined);
  const crossTenantDatabaseUrl = read("IDEM_CROSS_TENANT_DATABASE_URL", postgresUrl, undefined as string | undefined);
  if (crossTenantDatabaseUrl !== undefined && databaseUrl === undefined) {
    problems.push("IDEM_CROSS_TENANT_DATABASE_URL: needs DATABASE_URL (the embedded default has one login)");
  }
  const readDatabaseUrl = read("IDEM_DB_READ_URL", postgresUrl, undefined as string | undefined);
  const pooler = read<"none" | "transaction">(
    "IDEM_DB_POOLER",
    (raw) => {
      if (raw !== "none" && raw !== "transaction") throw new Error(`must be none or transaction, got '${raw}'`);
      return raw;
    },
    "none",
  );
  const preparedStatements = read("IDEM_DB_PREPARED_STATEMENTS", boolean, pooler !== "transaction");
  const migrateOnBoot = read("IDEM_MIGRATE_ON_BOOT", boolean, true);
  if (pooler === "transaction" && databaseUrl === undefined) problems.push("IDEM_DB_POOLER: needs DATABASE_URL (the embedded default has no pooler)");
  if (pooler === "transaction" && preparedStatements) {
    problems.push("IDEM_DB_PREPARED_STATEMENTS: named statements fail, or answer with another client's statement, behind a pooler in transaction mode; remove it");
  }
  if (pooler === "transaction" && migrationDatabaseUrl === undefined && migrateOnBoot) {
    problems.push(
      "IDEM_DB_POOLER: migrations hold a session-level lock, which a pooler in transaction mode does not keep; set IDEM_MIGRATION_DATABASE_URL to PostgreSQL itself, or IDEM_MIGRATE_ON_BOOT=false and run `idemctl migrate` directly",
    );
  }
  const crossTenantReadDatabaseUrl = read("IDEM_CROSS_TENANT_DB_READ_URL", postgresUrl, undefined as string | undefined);
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

  const callers = read("IDEM_CALLERS", (raw) => parseCallerGrants(parseJson(raw)), [] as CallerGrant[]);
  const callersFromFile = read("IDEM_CALLERS_FILE", (path) => parseCallerGrants(parseJson(readFileSync(path, "utf8"))), [] as CallerGrant[]);
  if (env.IDEM_CALLERS && env.IDEM_CALLERS_FILE) problems.push("IDEM_CALLERS and IDEM_CALLERS_FILE: set only one");

  const notices: string[] = [];
  const noticeOf = (name: string) => (line: string) => notices.push(`${name}: ${line}`);
  const operationsInline = read("IDEM_OPERATIONS", (raw) => parsePolicyDocuments(parseJson(raw), noticeOf("IDEM_OPERATIONS")), undefined as PolicyDocument[] | undefined);
  const operationsFile = read(
    "IDEM_OPERATIONS_FILE",
    (path) => parsePolicyDocuments(parseYaml(readFileSync(path, "utf8")) as unknown, noticeOf("IDEM_OPERATIONS_FILE")),
    undefined as PolicyDocument[] | undefined,
  );
  if (env.IDEM_OPERATIONS && env.IDEM_OPERATIONS_FILE) problems.push("IDEM_OPERATIONS and IDEM_OPERATIONS_FILE: set only one");
  const declared = operationsInline ?? operationsFile;

  const tlsCert = read("IDEM_TLS_CERT_FILE", readable, undefined as string | undefined);
  const tlsKey = read("IDEM_TLS_KEY_FILE", readable, undefined as string | undefined);
  const tlsClientCa = read("IDEM_TLS_CLIENT_CA_FILE", readable, undefined as string | undefined);
  if ((tlsCert === undefined) !== (tlsKey === undefined)) problems.push("IDEM_TLS_CERT_FILE and IDEM_TLS_KEY_FILE: set both, or neither");
  if (tlsClientCa !== undefined && tlsCert === undefined) problems.push("IDEM_TLS_CLIENT_CA_FILE: needs IDEM_TLS_CERT_FILE and IDEM_TLS_KEY_FILE");
  const tls: TlsConfig | undefined =
    tlsCert && tlsKey
      ? {
          certFile: tlsCert,
          keyFile: tlsKey,
          clientCaFile: tlsClientCa,
          requireClientCertificate: read("IDEM_TLS_REQUIRE_CLIENT_CERT", boolean, true),
          reloadMs: read("IDEM_TLS_RELOAD_MS", integer(100, 3_600_000), 10_000),
        }
      : undefined;

  const keysInline = read("IDEM_SNAPSHOT_KEYS", (raw) => parseKeyring(parseJson(raw)), undefined as SnapshotKeyring | undefined);
  const keysFile = read("IDEM_SNAPSHOT_KEYS_FILE", (path) => parseKeyring(parseJson(readFileSync(path, "utf8"))), undefined as SnapshotKeyring | undefined);
  if (env.IDEM_SNAPSHOT_KEYS && env.IDEM_SNAPSHOT_KEYS_FILE) problems.push("IDEM_SNAPSHOT_KEYS and IDEM_SNAPSHOT_KEYS_FILE: set only one");
  const allowPlaintextSnapshots = read("IDEM_ALLOW_PLAINTEXT_SNAPSHOTS", boolean, false);
  const ringGiven = Boolean(env.IDEM_SNAPSHOT_KEYS?.trim() || env.IDEM_SNAPSHOT_KEYS_FILE?.trim());
  // A shared database holds every tenant's responses: they are sealed unless plaintext is asked for by name.
  if (databaseUrl !== undefined && !ringGiven && !allowPlaintextSnapshots && !options.forMigrations) {
    problems.push(SNAPSHOT_KEYS_REQUIRED);
  }
  if (ringGiven && allowPlaintextSnapshots) {
    problems.push("IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: a key ring is configured, so bodies are sealed; remove the setting");
  }

  const logLevel = read(
    "LOG_LEVEL",
    (raw) => {
      if (!["fatal", "error", "warn", "info", "debug", "trace", "silent"].includes(raw)) {
        throw new Error(`must be one of fatal, error, warn, info, debug, trace, silent, got '${raw}'`);
      }
      return raw;
    },
    "info",
  );

  const config: Config = {
    databaseUrl,
    // The embedded development start mints a token with every grant: it listens on this machine only unless told otherwise.
    host: read("IDEM_HOST", (raw) => raw, databaseUrl === undefined ? "127.0.0.1" : "0.0.0.0"),
    rpcPort: read("IDEM_RPC_PORT", port, 7070),
    adminPort: read("IDEM_ADMIN_PORT", port, 7071),
    migrationDatabaseUrl,
    crossTenantDatabaseUrl,
    readDatabaseUrl,
    crossTenantReadDatabaseUrl,
    db: {
      // Set but empty: connect as the login itself (which must then be unprivileged).
      role: env.IDEM_DB_ROLE?.trim() === "" ? undefined : read("IDEM_DB_ROLE", sqlRole, "idem_server"),
      poolMax: read("IDEM_DB_POOL_MAX", integer(1, 1000), 20),
      crossTenantRole: env.IDEM_DB_CROSS_TENANT_ROLE?.trim() === "" ? undefined : read("IDEM_DB_CROSS_TENANT_ROLE", sqlRole, "idem_cross_tenant"),
      crossTenantPoolMax: read("IDEM_DB_CROSS_TENANT_POOL_MAX", integer(1, 100), 4),
      connectTimeoutMs: read("IDEM_DB_CONNECT_TIMEOUT_MS", integer(1, 600_000), 2000),
      statementTimeoutMs: read("IDEM_DB_STATEMENT_TIMEOUT_MS", integer(1, 600_000), 5000),
      lockTimeoutMs: read("IDEM_DB_LOCK_TIMEOUT_MS", integer(1, 600_000), 2000),
      idleInTransactionTimeoutMs: read("IDEM_DB_IDLE_TX_TIMEOUT_MS", integer(1, 3_600_000), 10_000),
      preparedStatements,
      pooler,
    },
    batch: {
      maxBatch: read("IDEM_BATCH_MAX", integer(1, 1000), 64),
      maxInFlight: read("IDEM_BATCH_IN_FLIGHT", integer(1, 1000), 4),
      lockWaitMs: read("IDEM_BATCH_LOCK_WAIT_MS", integer(1, 600_000), 50),
    },
    waitersPerCaller: read("IDEM_WAITERS_PER_CALLER", integer(0, 1_000_000), 256),
    migrateOnBoot,
    callers: [...callers, ...callersFromFile],
    allowAnonymous: read("IDEM_ALLOW_ANONYMOUS", boolean, false),
    operations: declared ?? (databaseUrl === undefined ? parsePolicyDocuments(DEVELOPMENT_OPERATIONS) : []),
    notices,
    policyRefreshMs: read("IDEM_POLICY_REFRESH_MS", integer(100, 600_000), 2000),
    recovererIntervalMs: read("IDEM_RECOVERER_INTERVAL_MS", integer(50, 3_600_000), 1000),
    sweepIntervalMs: read("IDEM_SWEEP_INTERVAL_MS", integer(50, 86_400_000), 60_000),
    unknownSloSeconds: read("IDEM_UNKNOWN_SLO_SECONDS", integer(1, 30 * 86_400), 3600),
    tls,
    snapshotKeys: keysInline ?? keysFile,
    allowPlaintextSnapshots,
    reflection: read("IDEM_REFLECTION", boolean, true),
    corsOrigins: read("IDEM_CORS_ORIGINS", originList, []),
    maxRequestBytes: read("IDEM_MAX_REQUEST_BYTES", integer(1024, 64 * 1024 * 1024), 4 * 1024 * 1024),
    maxDeadlineMs: read("IDEM_MAX_DEADLINE_MS", integer(100, 600_000), 30_000),
    shutdownGraceMs: read("IDEM_SHUTDOWN_GRACE_MS", integer(0, 600_000), 20_000),
    workers: read("IDEM_WORKERS", integer(1, 64), 1),
    stateDir: read("IDEM_STATE_DIR", (raw) => raw, ".idem"),
    embeddedPostgresPort: read("IDEM_EMBEDDED_PG_PORT", integer(1, 65535), 54329),
    logLevel,
    accessLog: read("IDEM_ACCESS_LOG", boolean, true),
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

/** What IDEM_CORS_ORIGINS takes, said with each value it refuses. */
const EXACT_ORIGINS = "it takes exact origins, scheme://host[:port] with no path and no wildcard, comma-separated (e.g. https://console.example.com,http://127.0.0.1:5173)";

/**
 * Origins, comma-separated, each `scheme://host[:port]` exactly as a browser
 * sends it in `Origin`: the CORS check compares them whole, so a pattern
 * (`https://*.example.com`) would be an origin no page ever has.
 */
function originList(raw: string): string[] {
  const origins = raw
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  for (const origin of origins) {
    if (origin.includes("*")) throw new Error(`'${origin}' is a pattern, and patterns are not supported: list every origin itself; ${EXACT_ORIGINS}`);
    let url: URL | undefined;
    try {
      url = new URL(origin);
    } catch {
      url = undefined;
    }
    if (!url || (url.protocol !== "https:" && url.protocol !== "http:")) throw new Error(`'${origin}' is not an origin: ${EXACT_ORIGINS}`);
    if (url.origin !== origin) throw new Error(`'${origin}' is not an origin as browsers send it (${url.origin}): no path, no trailing slash; ${EXACT_ORIGINS}`);
  }
  return origins;
}

/** A path to a file this process can read. */
function readable(path: string): string {
  accessSync(path, fsConstants.R_OK);
  return path;
}

function parseJson(raw: string): unknown {
  try {
    return JSON.parse(raw);
  } catch (error) {
    throw new Error(`is not valid JSON (${(error as Error).message})`, { cause: error });
  }
}
