import { setTimeout as sleep } from "node:timers/promises";
import type pg from "pg";
import type { Logger } from "pino";
import { parseIntoClientConfig } from "pg-connection-string";
import { OperatorError } from "../operator-error.js";
import { isConnectionLoss, sqlState } from "./db.js";

/** What a failed connection attempt means, in words, by the socket error's code. */
const NETWORK_REASONS: Record<string, string> = {
  ECONNREFUSED: "connection refused",
  ECONNRESET: "connection reset",
  ENOTFOUND: "no such host",
  EAI_AGAIN: "the host name could not be resolved",
  ETIMEDOUT: "timed out",
  EHOSTUNREACH: "host unreachable",
  ENETUNREACH: "network unreachable",
  ENOENT: "no socket there",
};

/**
 * The one-line report of a failure to connect to the registry database at
 * `connectionString`, configured by `setting` (e.g. DATABASE_URL), or
 * undefined when `error` is not a connection failure. It names the host and
 * port only: a connection string may carry a password.
 */
export function unreachableDatabase(error: unknown, connectionString: string, setting: string): OperatorError | undefined {
  const { host, port } = addressOf(connectionString);
  const where = `the registry database at ${host}:${port} (${setting})`;
  // The driver's error may be wrapped (a refusal with its cause, an AggregateError of each address tried).
  for (const cause of causes(error)) {
    const code = (cause as { code?: unknown }).code;
    const reason = typeof code === "string" ? NETWORK_REASONS[code] : undefined;
    if (reason) return new OperatorError(`cannot reach ${where}: ${reason}; start PostgreSQL there or correct ${setting}`, { cause: error });
    const message = cause instanceof Error ? cause.message : "";
    // The driver ends a connection that does not answer within its timeout, and says only that it ended.
    if (/timeout exceeded when trying to connect|connection timeout|Connection terminated unexpectedly/i.test(message)) {
      return new OperatorError(`cannot reach ${where}: no answer (timed out after IDEM_DB_CONNECT_TIMEOUT_MS, or closed); start PostgreSQL there or correct ${setting}`, {
        cause: error,
      });
    }
    const state = sqlState(cause);
    // 28xxx: the login was refused (password, pg_hba.conf); 3D000: no such database.
    if (state !== undefined && (state.startsWith("28") || state === "3D000")) {
      return new OperatorError(`${where} refused the login: ${message}; correct ${setting}`, { cause: error });
    }
    if (state === "57P03") return new OperatorError(`${where} is not accepting connections yet (${message}); retry once it has started`, { cause: error });
  }
  return undefined;
}

/** Attempts of a step of a coordinator's start, and the first pause between them (doubling, jittered): about 1.5 s in all. */
const STARTUP_ATTEMPTS = 5;
const STARTUP_BACKOFF_MS = 100;

/** Socket errors of a connection that was never made: an address or a server that is not there, reported at once. */
const NEVER_CONNECTED = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "ENOENT"]);

/**
 * Runs a step of a coordinator's start (its migrations, the checks of its
 * logins) again when the step's connection was lost once made: a terminated
 * backend or a failover must not end a start that would succeed a moment
 * later, as the same loss does not fail a request. Every such step may be
 * re-run: the migrations record each version in the transaction that
 * applies it, and the checks only read. A database that cannot be reached
 * at all, or that refuses the login, is reported at once, as is any other
 * failure.
 */
export async function retryingLostConnection<T>(step: () => Promise<T>, logger: Logger, what: string): Promise<T> {
  for (let n = 1; ; n++) {
    try {
      return await step();
    } catch (error) {
      if (n >= STARTUP_ATTEMPTS || !lostOnceMade(error)) throw error;
      logger.warn({ error: (error as Error).message, attempt: n }, `the registry connection was lost while ${what}; trying again`);
      await sleep(STARTUP_BACKOFF_MS * 2 ** (n - 1) * (0.5 + Math.random()));
    }
  }
}

/** A connection loss in `error` or its causes, other than a connection that could not be made. */
function lostOnceMade(error: unknown): boolean {
  const all = [...causes(error)];
  const neverMade = all.some((cause) => {
    const code = (cause as { code?: unknown }).code;
    return (typeof code === "string" && NEVER_CONNECTED.has(code)) || (cause instanceof Error && /timeout exceeded when trying to connect/i.test(cause.message));
  });
  return !neverMade && all.some(isConnectionLoss);
}

/**
 * Resolves when the database answers `SELECT 1` within `timeoutMs` of the
 * query being sent (the wait for a pooled connection is bounded by the pool's
 * own connection timeout). A timed-out query's connection is destroyed by the
 * driver rather than returned to the pool, so a hung connection is not reused.
 */
export async function ping(pool: pg.Pool, timeoutMs: number): Promise<void> {
  // query_timeout per query is supported by the driver, though missing from its types.
  await pool.query({ text: "SELECT 1", query_timeout: timeoutMs } as pg.QueryConfig);
}

/** Rethrows a connection failure as its one-line report, anything else as it is. */
export function reportUnreachable(connectionString: string, setting: string): (error: unknown) => never {
  return (error) => {
    throw unreachableDatabase(error, connectionString, setting) ?? error;
  };
}

function addressOf(connectionString: string): { host: string; port: string } {
  try {
    const { host, port } = parseIntoClientConfig(connectionString);
    return { host: host || "localhost", port: String(port || 5432) };
  } catch {
    return { host: "an unparsable address", port: "?" };
  }
}

function* causes(error: unknown, depth = 0): Generator<unknown> {
  if (error === null || typeof error !== "object" || depth > 4) return;
  yield error;
  const { cause, errors } = error as { cause?: unknown; errors?: unknown };
  if (cause !== undefined) yield* causes(cause, depth + 1);
  if (Array.isArray(errors)) for (const inner of errors) yield* causes(inner, depth + 1);
}
