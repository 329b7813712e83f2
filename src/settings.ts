import { accessSync, constants as fsConstants, readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { parseKeyring, type SnapshotKeyring } from "./crypto/sealing.js";
import { parseCallerGrants, type CallerGrant } from "./server/callers.js";

/**
 * Every environment variable the coordinator reads, declared once: how its
 * value is read (a parser that throws with what is wrong), its value when it
 * is unset, and what it means. loadConfig (config.ts) reads them through
 * these declarations, and the README's configuration table is ENVIRONMENT,
 * made from them (test/e2e/start.test.ts compares the two), so a default is
 * written in one place.
 */
export interface Setting<T> {
  /** Reads a set, trimmed, non-empty value; throws saying what it must be. */
  parse(raw: string): T;
  /** The value when the variable is unset or empty. */
  fallback: T;
  meaning: string;
  /** The default as the README shows it (the fallback itself, or what is used instead when it is derived or absent). */
  shown: string;
}

function setting<P, F extends P | undefined = P>(parse: (raw: string) => P, fallback: F, meaning: string, shown = String(fallback)): Setting<P | F> {
  return { parse, fallback, meaning, shown };
}

export function integer(min: number, max: number): (raw: string) => number {
  return (raw) => {
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min || n > max) throw new Error(`must be an integer from ${min} to ${max}, got '${raw}'`);
    return n;
  };
}

const port = integer(0, 65535);

export function boolean(raw: string): boolean {
  if (/^(true|1|yes)$/i.test(raw)) return true;
  if (/^(false|0|no)$/i.test(raw)) return false;
  throw new Error(`must be true or false, got '${raw}'`);
}

function text(raw: string): string {
  return raw;
}

function oneOf<V extends string>(values: readonly V[]): (raw: string) => V {
  return (raw) => {
    const named = values.length === 2 ? values.join(" or ") : `one of ${values.join(", ")}`;
    if (!(values as readonly string[]).includes(raw)) throw new Error(`must be ${named}, got '${raw}'`);
    return raw as V;
  };
}

function postgresUrl(raw: string): string {
  if (!/^postgres(ql)?:\/\//.test(raw)) throw new Error("must be a postgres:// connection string");
  return raw;
}

function sqlRole(raw: string): string {
  if (!/^[a-z_][a-z0-9_]*$/.test(raw)) throw new Error(`must be a plain lower-case SQL role name, got '${raw}'`);
  return raw;
}

/** A path to a file this process can read. */
function readable(path: string): string {
  accessSync(path, fsConstants.R_OK);
  return path;
}

export function parseJson(raw: string): unknown {
  try {
    return JSON.parse(raw);
  } catch (error) {
    throw new Error(`is not valid JSON (${(error as Error).message})`, { cause: error });
  }
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

/** The variables, in the order the README lists them. */
export const SETTINGS = {
  DATABASE_URL: setting(postgresUrl, undefined, "PostgreSQL connection string of the registry", "(unset: embedded PostgreSQL)"),
  IDEM_HOST: setting(
    text,
    "0.0.0.0",
    "address both ports listen on; without DATABASE_URL (the development start, whose token holds every grant) loopback only unless set",
    "0.0.0.0 (embedded: 127.0.0.1)",
  ),
  IDEM_RPC_PORT: setting(port, 7070, "gRPC, gRPC-Web and Connect (HTTP/2 cleartext and HTTP/1.1)"),
  IDEM_ADMIN_PORT: setting(port, 7071, "/healthz, /readyz, /metrics and the operator console"),
  IDEM_PORTS_FILE: setting(
    text,
    undefined,
    'once serving, the ports it listens on are written to this file as JSON ({"rpcPort":7070,"adminPorts":[7071]}, one admin port per worker, in worker order): for scripts that set the ports to 0',
    "(none)",
  ),
  IDEM_MIGRATION_DATABASE_URL: setting(postgresUrl, undefined, "connection string of the tables' owner, for migrations", "(DATABASE_URL)"),
  IDEM_DB_ROLE: setting(sqlRole, "idem_server", "role the server acts as on its connections: owns nothing, row security applies; empty: the login's own"),
  IDEM_DB_POOL_MAX: setting(integer(1, 1000), 20, "most registry connections per process"),
  IDEM_CROSS_TENANT_DATABASE_URL: setting(
    postgresUrl,
    undefined,
    "login of the work that spans tenants (jobs, operators' listings): a member of idem_cross_tenant only",
    "(DATABASE_URL)",
  ),
  IDEM_DB_CROSS_TENANT_ROLE: setting(sqlRole, "idem_cross_tenant", "role that work acts as: sees every tenant; empty: the login's own"),
  IDEM_DB_CROSS_TENANT_POOL_MAX: setting(integer(1, 100), 4, "most connections of that work per process"),
  IDEM_DB_READ_URL: setting(
    postgresUrl,
    undefined,
    "hot standby of the registry for the reads that decide nothing (Lookup, ListRecoverable, listings, policies, console), a login like DATABASE_URL's; while it does not answer they go to DATABASE_URL",
    "(unset: every read on DATABASE_URL)",
  ),
  IDEM_CROSS_TENANT_DB_READ_URL: setting(
    postgresUrl,
    undefined,
    "login on that standby of the reads that span tenants; required with IDEM_CROSS_TENANT_DATABASE_URL",
    "(IDEM_DB_READ_URL)",
  ),
  IDEM_DB_CONNECT_TIMEOUT_MS: setting(integer(1, 600_000), 2000, "wait for a free connection before UNAVAILABLE"),
  IDEM_DB_STATEMENT_TIMEOUT_MS: setting(integer(1, 600_000), 5000, "upper bound of one SQL statement"),
  IDEM_DB_LOCK_TIMEOUT_MS: setting(integer(1, 600_000), 2000, "upper bound of waiting for a record's row lock"),
  IDEM_DB_IDLE_TX_TIMEOUT_MS: setting(integer(1, 3_600_000), 10_000, "the database ends a transaction left idle this long"),
  IDEM_BATCH_MAX: setting(integer(1, 1000), 64, "most concurrent Reserves (or Completes) of one tenant and caller that share one transaction and COMMIT; 1: each its own"),
  IDEM_BATCH_IN_FLIGHT: setting(integer(1, 1000), 4, "most transactions of such requests at a time per tenant and caller; more wait and go together in the next"),
  IDEM_BATCH_LOCK_WAIT_MS: setting(
    integer(1, 600_000),
    50,
    "longest wait of such a shared transaction for a row lock; past it each request is decided alone, so that one held lock never delays its neighbours",
  ),
  IDEM_WAITERS_PER_CALLER: setting(
    integer(0, 1_000_000),
    256,
    "most Reserves of one caller waiting for an owner at once (wait_for_owner) on this coordinator; one more is refused RESOURCE_EXHAUSTED",
  ),
  IDEM_DB_PREPARED_STATEMENTS: setting(boolean, true, "prepare the registry's statements once per connection (off, and true refused, with IDEM_DB_POOLER=transaction)"),
  IDEM_DB_POOLER: setting(
    oneOf(["none", "transaction"] as const),
    "none",
    "transaction: the database URLs lead to a pooler in transaction mode (PgBouncer): no named statements, session settings set in every transaction; migrations need IDEM_MIGRATION_DATABASE_URL to PostgreSQL itself",
  ),
  IDEM_MIGRATE_ON_BOOT: setting(boolean, true, "apply pending migrations at start (under a lock; begun again on a new connection if its connection is lost)"),
  IDEM_WORKERS: setting(integer(1, 64), 1, "coordinator processes sharing the RPC port (needs DATABASE_URL); worker i answers on admin port IDEM_ADMIN_PORT + i"),
  IDEM_CALLERS: setting(
    (raw: string) => parseCallerGrants(parseJson(raw)),
    [] as CallerGrant[],
    "JSON array of callers: name, tokenSha256 and/or certificate, tenants, operations, roles",
    "(none)",
  ),
  IDEM_CALLERS_FILE: setting(
    (path: string) => parseCallerGrants(parseJson(readFileSync(path, "utf8"))),
    [] as CallerGrant[],
    "path of a file holding that JSON array instead",
    "(none)",
  ),
  IDEM_ALLOW_ANONYMOUS: setting(boolean, false, "development only: serve requests without a token"),
  IDEM_OPERATIONS: setting(parseJson, undefined as unknown, "JSON array of policy revisions to publish at boot", "(embedded: payments.create@1)"),
  IDEM_OPERATIONS_FILE: setting(
    (path: string): unknown => parseYaml(readFileSync(path, "utf8")),
    undefined as unknown,
    "path of a YAML or JSON file holding that array instead",
    "(none)",
  ),
  IDEM_POLICY_REFRESH_MS: setting(integer(100, 600_000), 2000, "how soon a new policy, mode or epoch applies on every replica"),
  IDEM_RECOVERER_INTERVAL_MS: setting(integer(50, 3_600_000), 1000, "how often ended leases become UNKNOWN or claimable; the Retry-After of UNKNOWN records"),
  IDEM_SWEEP_INTERVAL_MS: setting(integer(50, 86_400_000), 60_000, "how often finished records past retention become tombstones"),
  IDEM_ANSWER_CACHE_MAX_AGE_MS: setting(
    integer(0, 3_600_000),
    30_000,
    "longest a gateway may answer an exact repeat of a finished request from its own cache (never past retention): how soon a mode change or rollback reaches every gateway; 0: never",
  ),
  IDEM_UNKNOWN_SLO_SECONDS: setting(integer(1, 30 * 86_400), 3600, "recovery SLO of UNKNOWN records (metrics, alerts)"),
  IDEM_TLS_CERT_FILE: setting(readable, undefined, "PEM certificate (chain) of the RPC port; with the key, serves TLS (ALPN h2 and http/1.1)", "(unset: cleartext)"),
  IDEM_TLS_KEY_FILE: setting(readable, undefined, "PEM private key of that certificate", "(unset)"),
  IDEM_TLS_CLIENT_CA_FILE: setting(readable, undefined, "PEM CA of client certificates: mutual TLS", "(unset)"),
  IDEM_TLS_REQUIRE_CLIENT_CERT: setting(boolean, true, "with a client CA: refuse connections without a valid client certificate"),
  IDEM_TLS_RELOAD_MS: setting(integer(100, 3_600_000), 10_000, "how often changed certificate, key and CA files are reloaded"),
  IDEM_SNAPSHOT_KEYS: setting(
    (raw: string) => parseKeyring(parseJson(raw)),
    undefined as SnapshotKeyring | undefined,
    "key ring sealing stored response bodies (AES-256-GCM); required with DATABASE_URL",
    "(embedded: generated)",
  ),
  IDEM_SNAPSHOT_KEYS_FILE: setting(
    (path: string) => parseKeyring(parseJson(readFileSync(path, "utf8"))),
    undefined as SnapshotKeyring | undefined,
    "path of a file holding that key ring instead",
    "(none)",
  ),
  IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: setting(boolean, false, "never in production: with DATABASE_URL and no key ring, store response bodies unsealed (warned at every boot)"),
  IDEM_REFLECTION: setting(boolean, true, "serve gRPC server reflection (v1, v1alpha) without credentials, for buf curl, grpcurl, grpcui, Postman"),
  IDEM_CORS_ORIGINS: setting(
    originList,
    [] as string[],
    "comma-separated exact origins (scheme://host[:port], no path; patterns such as https://*.example.com are refused) whose pages may call the RPC port from a browser (Connect, gRPC-Web)",
    "(none)",
  ),
  IDEM_MAX_REQUEST_BYTES: setting(integer(1024, 64 * 1024 * 1024), 4 * 1024 * 1024, "largest RPC request accepted"),
  IDEM_MAX_DEADLINE_MS: setting(integer(100, 600_000), 30_000, "cap on any deadline a client asks for"),
  IDEM_SHUTDOWN_GRACE_MS: setting(integer(0, 600_000), 20_000, "how long SIGTERM lets in-flight RPCs finish"),
  IDEM_STATE_DIR: setting(text, ".idem", "embedded default: cluster files and development token"),
  IDEM_EMBEDDED_PG_PORT: setting(integer(1, 65535), 54329, "embedded default: port of the embedded PostgreSQL"),
  OTEL_EXPORTER_OTLP_ENDPOINT: setting(
    text,
    undefined,
    "OpenTelemetry collector (OTLP/HTTP); a span per RPC, per batched call and per registry transaction",
    "(unset: no tracing)",
  ),
  OTEL_SERVICE_NAME: setting(text, "idempotency-coordinator", "service name on the spans"),
  LOG_LEVEL: setting(oneOf(["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const), "info", "pino log level (fatal, error, warn, info, debug, trace, silent)"),
  IDEM_ACCESS_LOG: setting(boolean, true, "a log line per RPC at info level: method, caller, code, duration, operation id; false: at debug level only"),
} as const;

export type SettingName = keyof typeof SETTINGS;

/** The variables, their defaults and meaning: the README's configuration table. */
export const ENVIRONMENT: ReadonlyArray<{ name: string; default: string; meaning: string }> = Object.entries(SETTINGS).map(([name, s]) => ({
  name,
  default: s.shown,
  meaning: s.meaning,
}));
