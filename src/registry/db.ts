import type { Duplex } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import { parseIntoClientConfig } from "pg-connection-string";
import { context, SpanKind, SpanStatusCode, trace, type Tracer } from "@opentelemetry/api";
import type { Logger } from "pino";
import { IdempotencyError } from "../contract/errors.js";
import type { PlanEpochs } from "./plan-epochs.js";
import { pipelined, preparedName } from "./statement.js";

/** Anything that runs one SQL statement: a pool, a client, a client inside a transaction. */
export interface Queryable {
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(text: string, values?: unknown[]): Promise<pg.QueryResult<R>>;
}

/**
 * Whose rows a unit of registry work may see and write. Row-level security on every tenant table (migrations/000007, 000010)
 * shows a serving transaction only the rows of the tenant it is bound to, so that a query that forgets its tenant clause
 * finds nothing instead of another tenant's records. Request paths bind the caller's tenant; operators' listings and the
 * background jobs ask for ALL_TENANTS, which runs them on the cross-tenant pool: a role of its own, because nothing a serving
 * connection can set may widen its binding.
 */
export type TenantBinding = string | typeof ALL_TENANTS;
export const ALL_TENANTS: unique symbol = Symbol("all tenants");

/**
 * The binding of a listing over `tenants`: the one tenant when it names one;
 * otherwise every tenant, narrowed by the listing's own tenant filter.
 */
export function bindingFor(tenants: readonly string[] | undefined): TenantBinding {
  return tenants?.length === 1 ? tenants[0]! : ALL_TENANTS;
}

/**
 * How the registry reaches PostgreSQL. Either it owns its transactions (a pool,
 * with classified retries), or it runs inside a transaction its caller already
 * opened (co-located mode: a business service's own transaction), where the
 * caller owns commit, rollback and retry.
 */
export interface Db {
  /**
   * Runs `work` inside one transaction bound to `tenant` (retried as a whole
   * on transient failures). `name` labels it in metrics ("reserve", …).
   * `work` may end by sending its last statements with `commitWith`, which
   * sends COMMIT behind them in the same round trip (see CommitWith);
   * otherwise the transaction commits once `work` returns.
   */
  transaction<T>(tenant: TenantBinding, work: (q: Queryable, commitWith: CommitWith) => Promise<T>, name?: string, options?: TransactionOptions): Promise<T>;
  /**
   * Whether concurrent requests may share one of its transactions (the
   * registry's batches): true for a Db that owns its transactions; never
   * inside a caller's own, which commits one request's business rows.
   */
  readonly coalescible?: boolean;
}

/** How one transaction differs from the pool's defaults. */
export interface TransactionOptions {
  /**
   * The longest wait for a row lock in this transaction, instead of the pool's lock timeout (transaction-local: the
   * connection's next user gets the pool's again). Past it the transaction fails with REGISTRY_BUSY (isLockWaitEnded).
   */
  lockTimeoutMs?: number;
}

/** A row as the driver returns it: of whichever statement was sent (Statement's Row types each statement's). */
type Row = pg.QueryResultRow;

/** Sends one statement (synchronously, as Statement.run does) and answers its result. */
export type Send = (q: Queryable) => Promise<pg.QueryResult<Row>>;

/**
 * Sends the statements of `sends` in order, all at once, with COMMIT behind
 * them in the same round trip: nothing is decided between them and the
 * COMMIT. A statement that fails aborts the transaction, so that the COMMIT
 * behind it rolls everything back, and its failure is thrown (the first in
 * the order sent). Inside a caller's own transaction (co-located mode) the
 * statements run there and commit with it.
 */
export type CommitWith = (sends: readonly Send[]) => Promise<Array<pg.QueryResult<Row>>>;

/** A transaction of nothing but `sends` and its COMMIT: one round trip (see CommitWith). */
export function commitTogether(db: Db, tenant: TenantBinding, sends: readonly Send[], name?: string, options?: TransactionOptions): Promise<Array<pg.QueryResult<Row>>> {
  return db.transaction(tenant, (_q, commitWith) => commitWith(sends), name, options);
}

/** What a Db over a pool reports as it works (metrics). */
export interface DbObserver {
  /** Work failed transiently and is run again; `cause` is the SQLSTATE, or "connection". */
  retried?(cause: string): void;
  /**
   * A transaction committed: `seconds` from its BEGIN being sent to its COMMIT
   * being acknowledged, the wait for a pooled connection not included.
   */
  committed?(name: string, seconds: number): void;
}

/** The values of the two settings the row-level security policies read. */
function bindingSettings(tenant: TenantBinding): [tenant: string, allTenants: "on" | "off"] {
  return tenant === ALL_TENANTS ? ["", "on"] : [tenant, "off"];
}

/** Binds a transaction to a tenant: transaction-local settings, which end with it (a pooled connection carries nothing over). */
export const BIND_SQL = "SELECT set_config('idem.tenant', $1, true), set_config('idem.all_tenants', $2, true)";

/**
 * BEGIN and the binding in one simple-protocol message. The simple protocol
 * has no parameters: the tenant is an escaped literal there.
 */
function beginBound(tenant: TenantBinding, session: ReadonlyArray<readonly [string, string]> = []): string {
  const [id, all] = bindingSettings(tenant);
  return `BEGIN; ${settingsSql([...session, ["idem.tenant", id], ["idem.all_tenants", all]])}`;
}

/** Connection settings of the registry's pool. */
export interface PoolSettings {
  connectionString: string;
  /** Most connections this process opens. */
  max: number;
  /** How long a request waits for a free connection before UNAVAILABLE. */
  connectionTimeoutMs: number;
  /** Upper bound of any statement; a stuck query must not hold a request forever. */
  statementTimeoutMs: number;
  /** Upper bound of waiting for a row lock; a writer stuck on a record fails fast instead of piling up. */
  lockTimeoutMs: number;
  /** A transaction left open by a crashed handler is ended by the server after this long. */
  idleInTransactionTimeoutMs: number;
  /** Extra `-c` options (tests use it to pin a schema with `search_path`). */
  options?: string;
  /**
   * The role every connection acts as (`SET ROLE` at connection start): the
   * registry's unprivileged role, so that even a login that may do more
   * (the owner, in development) serves requests with least privilege.
   */
  role?: string;
  applicationName?: string;
  /**
   * "transaction": the URL leads to a pooler in transaction mode (PgBouncer),
   * which hands the server connection to another client after each
   * transaction and refuses startup settings: the role, the timeouts and the
   * `-c` options are set inside every transaction instead (transaction-local,
   * so that nothing carries over to the connection's next client).
   */
  pooler?: "none" | "transaction";
}

/** The settings every transaction on a pool sets for itself, when its connections go through a pooler in transaction mode. */
const transactionSettings = new WeakMap<pg.Pool, ReadonlyArray<readonly [name: string, value: string]>>();

/**
 * Opens the registry's pool. The `error` handler is required: when the server
 * kills an idle connection (`pg_terminate_backend`, a restart, a failover) the
 * pool emits `error`, and an unhandled `error` event would end the process.
 */
export function openPool(settings: PoolSettings, logger: Logger): pg.Pool {
  // Parsed here rather than by the driver, which would let the URL's own
  // `options` replace the role added to them.
  const { options: urlOptions, ...connection } = parseIntoClientConfig(settings.connectionString);
  const options = connectionOptions(settings, urlOptions);
  const timeouts = {
    statement_timeout: settings.statementTimeoutMs,
    lock_timeout: settings.lockTimeoutMs,
    idle_in_transaction_session_timeout: settings.idleInTransactionTimeoutMs,
  };
  const pooled = settings.pooler === "transaction";
  const pool = new pg.Pool({
    ...connection,
    max: settings.max,
    connectionTimeoutMillis: settings.connectionTimeoutMs,
    idleTimeoutMillis: 30_000,
    application_name: settings.applicationName ?? "idempotency-coordinator",
    // A query goes out without waiting for the answers to the ones before it,
    // so a transaction's BEGIN travels with its first statement (poolDb).
    pipeline: true,
    ...(pooled ? {} : { ...timeouts, ...(options ? { options } : {}) }),
  });
  if (pooled) {
    transactionSettings.set(pool, [...Object.entries(timeouts).map(([name, ms]) => [name, String(ms)] as const), ...settingsOfOptions(options)]);
  }
  pool.on("error", (error) => {
    // Not the error object itself: the pool attaches the whole client to it.
    logger.warn({ sqlstate: sqlState(error), error: error.message }, "idle registry connection lost; the pool replaces it");
  });
  // A connection can be lost while no query runs on it and neither the pool's
  // listener nor a transaction's is on its client (a coordinator died of it
  // when Patroni switched over under load): an 'error' event without a
  // listener would crash the process. The client's queries fail on their own
  // (connection loss, retried), so this listener only notes it.
  pool.on("connect", (client) => {
    client.on("error", (error) => logger.debug({ sqlstate: sqlState(error), error: error.message }, "registry connection lost"));
  });
  return pool;
}

/** The startup options: ours (or PGOPTIONS, as the driver would), the URL's (which win, as with the driver), then the role. */
function connectionOptions(settings: PoolSettings, urlOptions: string | undefined): string | undefined {
  if (settings.role !== undefined && !/^[a-z_][a-z0-9_]*$/.test(settings.role)) {
    throw new Error(`database role ${JSON.stringify(settings.role)} is not a plain lower-case SQL identifier`);
  }
  const options = [settings.options ?? process.env.PGOPTIONS, urlOptions, settings.role && `-c role=${settings.role}`].filter(Boolean).join(" ");
  return options || undefined;
}

/** The `-c name=value` settings of startup options, in order (a later one of a name wins, as at startup). */
function settingsOfOptions(options: string | undefined): Array<readonly [string, string]> {
  const settings: Array<readonly [string, string]> = [];
  const words = (options ?? "").split(/\s+/).filter(Boolean);
  for (let i = 0; i < words.length; i++) {
    const word = words[i] === "-c" ? words[++i] : words[i]?.replace(/^(-c|--)/, "");
    const match = /^([A-Za-z_][A-Za-z0-9_.-]*)=(.*)$/.exec(word ?? "");
    if (!match) throw new Error(`database options: cannot set ${JSON.stringify(word)} per transaction (expected -c name=value)`);
    settings.push([match[1]!.replaceAll("-", "_"), match[2]!]);
  }
  return settings;
}

/**
 * Runs one query as the pool's transactions run: behind a pooler in
 * transaction mode, inside a transaction that sets the pool's session
 * settings first (its role and search_path, say); otherwise as is. For the
 * checks made outside the statements layer (privileges at boot).
 */
export function sessionQueryable(pool: pg.Pool): Queryable {
  const settings = transactionSettings.get(pool);
  if (!settings) return pool;
  return {
    query: <R extends pg.QueryResultRow>(text: string, values?: unknown[]) =>
      runTransaction(pool, async (client) => {
        await client.query(settingsSql(settings));
        return client.query<R>(text, values);
      }),
  };
}

/** `SELECT set_config(…, true), …` of transaction-local settings, as one literal statement. */
function settingsSql(settings: ReadonlyArray<readonly [string, string]>): string {
  return `SELECT ${settings.map(([name, value]) => `set_config(${pg.escapeLiteral(name)}, ${pg.escapeLiteral(value)}, true)`).join(", ")}`;
}

/** Transient failures worth retrying with backoff, and how many times. */
const MAX_ATTEMPTS = 4;
const BASE_BACKOFF_MS = 10;

/** How a Db over a pool works, and what it reports. */
export interface PoolDbOptions extends DbObserver {
  /**
   * Where work bound to ALL_TENANTS runs (acting as idem_cross_tenant, which
   * sees every tenant). Without one it runs on the pool bound to every
   * tenant, which only the tables' owner honours (tests, co-located services
   * loading policies).
   */
  crossTenantPool?: pg.Pool;
  /**
   * Send the statements layer's statements as named prepared statements,
   * parsed and planned once per connection instead of at every execution
   * (default true). Turn off behind a pooler in transaction mode (PgBouncer),
   * where a connection's prepared statements are not the next transaction's.
   */
  preparedStatements?: boolean;
  /** Prepared again under new names in each of its plan epochs (planEpochs: the registry's size, until it has statistics); once when unset. */
  planned?: PlanEpochs;
  /** Each transaction (each try of it) is a span, a child of the active one (its RPC's), when given. */
  tracer?: Tracer;
}

/**
 * What the registry sends its statements through, on a node-postgres client
 * (or anything with its `query`). Statements of the statements layer go by
 * their prepared name (with `epoch`) when `prepared` allows it; whatever is
 * sent within one tick (a BEGIN with the statements pipelined behind it)
 * leaves in one socket write: the stream is corked at the first query of a
 * tick and uncorked after it, since each write is a system call, and system
 * calls cost more than a short statement. A client not opened for
 * pipelining (a co-located service's pool or Client) gets them in turn.
 */
function registryConnection(client: Queryable, prepared: boolean, epoch = ""): Queryable {
  const socket = corkableSocket(client as pg.PoolClient);
  let corked = false;
  const uncork = () => {
    corked = false;
    socket!.uncork();
  };
  const connection: Queryable = {
    query<R extends pg.QueryResultRow>(text: string, values?: unknown[]) {
      if (socket && !corked) {
        corked = true;
        socket.cork();
        process.nextTick(uncork);
      }
      const name = prepared ? preparedName(text) : undefined;
      return name === undefined ? client.query<R>(text, values) : (client as pg.ClientBase).query<R>({ name: `${name}${epoch}`, text, values: values ?? [] });
    },
  };
  return (client as { pipeline?: unknown }).pipeline === true ? connection : inTurn(connection);
}

/**
 * The driver's socket of a pooled client, to cork: node-postgres's `connection.stream`, which a Client has but a PoolClient's
 * type does not show, hence looked up defensively. Undefined should the driver no longer have it: then nothing is corked,
 * each message is a write of its own, and test/registry/reserve.test.ts (round trips per call) fails.
 */
export function corkableSocket(client: pg.PoolClient): Pick<Duplex, "cork" | "uncork"> | undefined {
  // A PoolClient is a Client at run time.
  const stream = (client as Partial<pg.Client>).connection?.stream;
  return typeof stream?.cork === "function" && typeof stream.uncork === "function" ? stream : undefined;
}

/**
 * A Db over a pool. Serialization failures (40001) and deadlocks (40P01) are
 * retried with jittered exponential backoff; so are lost connections, because
 * a COMMIT's outcome may be lost with its connection and every request-path
 * operation is written to be re-run safely: a re-run re-reads the record and
 * recognizes its own earlier write (Reserve, Claim and Reconcile by the
 * acquisition id they minted, RecordEffectAttempt by its registration id),
 * or finds nothing left to do (an identical Complete, a Release, an Abandon,
 * a resolution already made, a renewal). Of the operators' writes, a repeated
 * SetOperationMode logs its MODE_SET event again, as a second setting would.
 * Work bound to ALL_TENANTS runs on `options.crossTenantPool`.
 */
export function poolDb(pool: pg.Pool, logger: Logger, options: PoolDbOptions = {}): Db {
  const { crossTenantPool = pool, preparedStatements = true, planned, tracer, ...observer } = options;
  async function withRetries<T>(attempt: () => Promise<T>): Promise<T> {
    for (let n = 1; ; n++) {
      try {
        return await attempt();
      } catch (error) {
        const cause = retryableCause(error);
        if (cause === undefined || n >= MAX_ATTEMPTS) throw classify(error);
        observer.retried?.(cause);
        logger.debug({ cause, attempt: n }, "retrying registry work after a transient failure");
        await sleep(BASE_BACKOFF_MS * 2 ** (n - 1) * (0.5 + Math.random()));
      }
    }
  }

  const onLost = (error: Error) => logger.warn({ sqlstate: sqlState(error), error: error.message }, "registry connection lost during a transaction");
  return {
    coalescible: true,
    transaction: (tenant, work, name = "other", options = {}) =>
      withRetries(() =>
        traced(tracer, name, () => {
          const on = tenant === ALL_TENANTS ? crossTenantPool : pool;
          const settings = [
            ...(transactionSettings.get(on) ?? []),
            ...(options.lockTimeoutMs !== undefined ? [["lock_timeout", `${Math.max(1, Math.round(options.lockTimeoutMs))}ms`] as const] : []),
          ];
          return onTransactionConnection(on, onLost, async (client) => {
            const began = performance.now();
            const q = registryConnection(client, preparedStatements, planned?.epoch() ?? "");
            // Not awaited: the work's first statement follows it on the wire, one
            // round trip for both. Should BEGIN itself fail, that statement ran
            // unbound, where row-level security shows and admits no row, and the
            // failure is thrown below before anything is committed.
            const begun = q.query(beginBound(tenant, settings));
            begun.catch(() => undefined);
            let committed = false;
            const commitWith: CommitWith = async (sends) => {
              committed = true;
              const results = await pipelined<Array<pg.QueryResult<Row>>>([...sends.map((send) => send(q)), q.query("COMMIT")]);
              // COMMIT of a transaction a statement aborted answers ROLLBACK; the statement's failure was thrown above.
              if (results.at(-1)!.command !== "COMMIT") throw new Error(`COMMIT answered ${results.at(-1)!.command}`);
              return results.slice(0, -1);
            };
            const result = await work(q, commitWith);
            await begun;
            if (!committed) await q.query("COMMIT");
            observer.committed?.(name, (performance.now() - began) / 1000);
            return result;
          });
        }),
      ),
  };
}

/** Why a read went to the primary instead of the reader: its latest probe failed, or the read itself failed there. */
export type ReaderFallback = "down" | "failed";

/**
 * The Db of the reads that decide nothing (lookups, listings, policies): on
 * `reader`, a hot standby's pools, whose answers may be a replay lag behind
 * the primary's. Nothing that decides, writes or locks may run here; a
 * standby refuses writes and FOR UPDATE, so a mistake fails instead of
 * deciding on stale rows.
 *
 * A standby is a way to offload reads, not something a read depends on:
 * while `usable()` says it is down (its probe failed), reads go to `primary`;
 * and a read that fails on it for want of an answer (a lost connection, no
 * connection in time, a timeout, or replay cancelling it: what classify
 * calls REGISTRY_UNAVAILABLE or REGISTRY_BUSY) runs again on `primary`. Any
 * other failure (a refusal, a missing table) is the read's own and is thrown.
 */
export function readerDb(reader: Db, primary: Db, options: { usable: () => boolean; fellBack?: (why: ReaderFallback, error?: unknown) => void }): Db {
  return {
    async transaction(tenant, work, name, settings) {
      if (!options.usable()) {
        options.fellBack?.("down");
        return primary.transaction(tenant, work, name, settings);
      }
      try {
        return await reader.transaction(tenant, work, name, settings);
      } catch (error) {
        if (!(error instanceof IdempotencyError) || (error.reason !== "REGISTRY_UNAVAILABLE" && error.reason !== "REGISTRY_BUSY")) throw error;
        options.fellBack?.("failed", error);
        return primary.transaction(tenant, work, name, settings);
      }
    },
  };
}

/** `work` in a span named after the transaction (`registry reserve`), when tracing; its failure marks the span. */
async function traced<T>(tracer: Tracer | undefined, name: string, work: () => Promise<T>): Promise<T> {
  if (!tracer) return work();
  const span = tracer.startSpan(`registry ${name}`, { kind: SpanKind.CLIENT, attributes: { "db.system": "postgresql", "db.operation.name": name } });
  try {
    return await context.with(trace.setSpan(context.active(), span), work);
  } catch (error) {
    span.setStatus({ code: SpanStatusCode.ERROR, message: (error as Error).message });
    throw error;
  } finally {
    span.end();
  }
}

/**
 * A Db inside a transaction the caller opened and will commit. Nothing is retried here: only the caller can re-run its whole
 * business transaction. Each unit of work binds the caller's transaction to its tenant first. The registry sends statements
 * without waiting for the ones before them; on the caller's client they go one after the other (see inTurn) unless that
 * client was opened for pipelining; by their prepared names when `prepared` (a node-postgres client).
 */
export function transactionDb(client: Queryable, prepared = false, commits = false): Db {
  const q = registryConnection(client, prepared);
  // The caller commits (the statements run in its transaction); with `commits`, the work's last
  // statements go out with the COMMIT of the caller's runTransaction, which then sends none.
  const commitWith: CommitWith = !commits
    ? (sends) => pipelined(sends.map((send) => send(q)))
    : async (sends) => {
        const results = await pipelined([...sends.map((send) => send(q)), q.query("COMMIT")]).catch((error: unknown) => Promise.reject(commitFailure(error)));
        if (results.at(-1)!.command !== "COMMIT") throw new Error(`COMMIT answered ${results.at(-1)!.command}`);
        committedWithin.add(client);
        return results.slice(0, -1);
      };
  return {
    async transaction(tenant, work) {
      try {
        // Not awaited: the work's first statements follow it (in the same write). Should it fail,
        // the transaction is aborted, so that they fail too and nothing of them can commit.
        const bound = q.query(BIND_SQL, bindingSettings(tenant));
        bound.catch(() => undefined);
        const result = await work(q, commitWith);
        await bound;
        return result;
      } catch (error) {
        throw classify(error);
      }
    },
  };
}

/**
 * The caller's client as the registry's work may use it: a query sent while another is in flight. A node-postgres client
 * opened with `pipeline: true` sends it at once (registryConnection); any other (a service's own pool or Client) only queues
 * it, which node-postgres deprecates and pg 9 removes: here each query is sent once the one before it has answered, whatever
 * that answer was, as the pipelined statements would have run one after the other.
 */
function inTurn(client: Queryable): Queryable {
  let previous: Promise<unknown> = Promise.resolve();
  return {
    query<R extends pg.QueryResultRow>(text: string, values?: unknown[]) {
      const sent = previous.then(() => client.query<R>(text, values));
      previous = sent.catch(() => undefined);
      return sent;
    },
  };
}

/** The outcome of a COMMIT is unknown (the connection failed while it was in flight): re-read before acting. */
export class CommitUnknownError extends Error {
  override readonly name = "CommitUnknownError";
}

/** What a failed COMMIT means: the server's own error answer (with its SQLSTATE) says it rolled back; without one, nothing is known. */
function commitFailure(error: unknown): Error {
  if (sqlState(error) !== undefined && !isConnectionLoss(error)) return error as Error;
  return new CommitUnknownError("the connection failed during COMMIT: the transaction may or may not have committed", { cause: error });
}

/** The clients of runTransaction whose work sent its COMMIT already (transactionDb with `commits`). */
const committedWithin = new WeakSet<object>();

/**
 * Runs a caller's own transaction on a connection of `pool`: BEGIN, `work`, COMMIT; ROLLBACK when `work` throws. Nothing is
 * retried and no tenant is bound: the transaction is the caller's (co-located mode's business transaction; registry work
 * inside it binds itself through transactionDb). A PostgreSQL error at COMMIT (a deferred constraint, a serialization failure)
 * means it rolled back and is thrown as is; a connection lost during COMMIT, or any failure without the server's answer,
 * leaves the outcome unknown: CommitUnknownError.
 */
export async function runTransaction<T>(pool: pg.Pool, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  return onTransactionConnection(
    pool,
    () => undefined,
    async (client) => {
      try {
        await client.query("BEGIN");
        const result = await work(client);
        if (!committedWithin.has(client)) await client.query("COMMIT").catch((error: unknown) => Promise.reject(commitFailure(error)));
        return result;
      } finally {
        committedWithin.delete(client);
      }
    },
  );
}

/**
 * Checks a connection out of `pool` for the one transaction `body` runs, and gives it back. When `body` fails the transaction
 * is rolled back, unless the connection was lost (or a COMMIT's answer with it): a lost connection, or one that cannot roll
 * back, is discarded instead of returned, so that the pool never lends a dead or half-finished one again. The registry's
 * transactions (poolDb) and a caller's own (runTransaction) both run here.
 */
async function onTransactionConnection<T>(pool: pg.Pool, onLost: (error: Error) => void, body: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  // The listener every client carries from its connect (openPool) keeps a lost
  // connection from crashing the process; this one reports the loss as the
  // transaction's, where an operator looks for it.
  client.on("error", onLost);
  let broken = false;
  try {
    return await body(client);
  } catch (error) {
    broken = isConnectionLoss(error) || error instanceof CommitUnknownError;
    // After a COMMIT the server refused, the transaction is over: ROLLBACK only warns.
    if (!broken) await client.query("ROLLBACK").catch(() => (broken = true));
    throw error;
  } finally {
    client.removeListener("error", onLost);
    client.release(broken);
  }
}

/** Whether a transaction failed because a row lock it waited for stayed held past its lock timeout (55P03): nothing was decided. */
export function isLockWaitEnded(error: unknown): boolean {
  return error instanceof IdempotencyError && error.reason === "REGISTRY_BUSY" && sqlState(error.cause) === "55P03";
}

/** The SQLSTATE of a PostgreSQL error, if it has one. */
export function sqlState(error: unknown): string | undefined {
  const { code, syscall } = (error ?? {}) as { code?: unknown; syscall?: unknown };
  // Node's system errors carry codes too, and EPIPE has a SQLSTATE's shape: theirs name a syscall.
  if (syscall !== undefined) return undefined;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

function retryableCause(error: unknown): string | undefined {
  const state = sqlState(error);
  if (state === "40001" || state === "40P01") return state;
  if (isConnectionLoss(error)) return state ?? "connection";
  return undefined;
}

/** The connection itself failed: the server went away, was restarted, or killed our backend. */
export function isConnectionLoss(error: unknown): boolean {
  const state = sqlState(error);
  if (state !== undefined) {
    // 08: connection exception; 57P01-57P03: admin shutdown, crash shutdown, cannot connect now.
    return state.startsWith("08") || state === "57P01" || state === "57P02" || state === "57P03";
  }
  const code = (error as { code?: unknown } | null)?.code;
  if (code === "ECONNRESET" || code === "ECONNREFUSED" || code === "EPIPE" || code === "ETIMEDOUT") return true;
  const message = error instanceof Error ? error.message : "";
  return /Connection terminated|Client has encountered a connection error|connection is closed/i.test(message);
}

/** Turns driver failures into refusals a client can act on; domain errors pass through. */
function classify(error: unknown): unknown {
  if (error instanceof IdempotencyError) return error;
  const state = sqlState(error);
  if (state === "40001" || state === "40P01") {
    return new IdempotencyError(
      "REGISTRY_BUSY",
      "the registry kept hitting conflicting writers (serialization failures or deadlocks); nothing was decided, retry with backoff",
      { sqlstate: state },
      { cause: error },
    );
  }
  if (state === "55P03") {
    return new IdempotencyError(
      "REGISTRY_BUSY",
      "the record stayed locked by another writer beyond the lock timeout; nothing was decided, retry with backoff",
      {},
      { cause: error },
    );
  }
  const poolTimeout = error instanceof Error && /timeout exceeded when trying to connect/i.test(error.message);
  if (state === "57014" || state === "53300" || poolTimeout || isConnectionLoss(error)) {
    return new IdempotencyError("REGISTRY_UNAVAILABLE", "the registry database did not answer in time; nothing was decided, retry with backoff", {}, { cause: error });
  }
  return error;
}
