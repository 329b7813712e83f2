import { readFileSync } from "node:fs";
import type pg from "pg";
import pino, { type Logger } from "pino";
import { parseKeyring, type SnapshotKeyring } from "../crypto/sealing.js";
import { NO_FAULTS, type FaultHooks } from "../fault-hooks.js";
import {
  arrayOf,
  check,
  checkInput,
  func,
  oneOf,
  operationRef,
  optional,
  outcome as outcomeRule,
  shape,
  snapshot as snapshotRule,
  string,
  wholeNumber,
  withMethods,
  type CallForm,
} from "../gateway/arguments.js";
import type { ColocatedCompletion, CompleteInput, CompleteResult, LifecycleCalls, OpenTransaction } from "../gateway/types.js";
import { PolicyCache } from "../policy/cache.js";
import { poolDb, runTransaction, transactionDb, type Db, type Queryable } from "../registry/db.js";
import { PolicyStore } from "../registry/policy-store.js";
import { requireLeastPrivilege } from "../registry/privileges.js";
import { Registry } from "../registry/registry.js";
import type { Actor } from "../registry/types.js";
import { RecordWatch } from "../server/owner-wait.js";
import { completeResult, lifecycleOn, refusedAsCoordinator, registryComplete, type LocalLifecycle } from "./lifecycle.js";

// The business transaction `ctx.transaction` hands to a handler is this
// module's: node-postgres's PoolClient (the gateway SDK names no driver).
declare module "../gateway/types.js" {
  interface ColocatedDriverTypes {
    client: pg.PoolClient;
  }
}

interface ColocatedRegistryBaseOptions {
  /**
   * A pool on the registry's database, where the service's own tables live
   * too (a schema of their own is fine: the registry's tables must be on the
   * connections' search_path).
   */
  pool: pg.Pool;
  /** The name this service writes into the registry's event log. */
  caller: string;
  /** Tenants this service may complete for (default: all). */
  tenants?: readonly string[] | "*";
  /** Operations this service may complete (default: all). */
  operations?: readonly string[] | "*";
  /** How often the policies are re-read (default 2000 ms, like the coordinator). */
  policyRefreshMs?: number;
  /**
   * What runs in this process: `in-process` (the default), the whole
   * lifecycle (Reserve, leases, effects, Complete, Release, Abandon) on
   * `pool`, with no RPC; `completion`, only Complete inside the business
   * transaction, the rest over the gateway's coordinator client.
   */
  lifecycle?: "in-process" | "completion";
  /**
   * Send the registry's statements on the pool's connections as named
   * prepared statements, parsed and planned once per connection (default
   * true), in its own transactions and in the business transactions it
   * opens. Turn off behind a pooler in transaction mode (PgBouncer).
   */
  preparedStatements?: boolean;
  /**
   * Concurrent Reserves (and Completes outside a business transaction) of
   * one tenant share a transaction and its COMMIT, as the coordinator's do
   * (IDEM_BATCH_MAX, IDEM_BATCH_IN_FLIGHT, IDEM_BATCH_LOCK_WAIT_MS; the same
   * defaults: 64, 4, 50 ms); `false`: each its own.
   */
  coalesce?: { maxBatch: number; maxInFlight: number; lockWaitMs?: number } | false;
  /** Most Reserves of this process waiting for an owner at once (default 256, like IDEM_WAITERS_PER_CALLER); one more is answered at once. */
  waitersMax?: number;
  logger?: Logger;
  /** Fault tests' hooks around the business COMMIT (src/fault-hooks.ts); none by default. */
  hooks?: FaultHooks;
}

/**
 * How a co-located registry is opened: with the coordinator's key ring, so
 * that the bodies it completes are sealed as the coordinator seals them (and
 * open there), or with plaintext asked for by name (never in production).
 */
export type ColocatedRegistryOptions = ColocatedRegistryBaseOptions &
  (
    | {
        /** The coordinator's key ring (IDEM_SNAPSHOT_KEYS; snapshotKeysFromEnv reads it the same way). */
        snapshotKeys: SnapshotKeyring;
        allowPlaintextSnapshots?: false;
      }
    | {
        snapshotKeys?: undefined;
        /** Store completed bodies unsealed; warned when opened. */
        allowPlaintextSnapshots: true;
      }
  );

/**
 * The key ring in IDEM_SNAPSHOT_KEYS (JSON) or the file IDEM_SNAPSHOT_KEYS_FILE
 * names, read as the coordinator reads it; undefined when neither is set.
 * Throws naming the variable when it cannot be used.
 */
export function snapshotKeysFromEnv(env: NodeJS.ProcessEnv = process.env): SnapshotKeyring | undefined {
  const inline = env.IDEM_SNAPSHOT_KEYS?.trim();
  const file = env.IDEM_SNAPSHOT_KEYS_FILE?.trim();
  if (inline && file) throw new Error("IDEM_SNAPSHOT_KEYS and IDEM_SNAPSHOT_KEYS_FILE: set only one");
  const ring = (name: string, text: () => string) => {
    try {
      return parseKeyring(JSON.parse(text()));
    } catch (error) {
      throw new Error(`${name}: ${(error as Error).message}`, { cause: error });
    }
  };
  if (inline) return ring("IDEM_SNAPSHOT_KEYS", () => inline);
  if (file) return ring("IDEM_SNAPSHOT_KEYS_FILE", () => readFileSync(file, "utf8"));
  return undefined;
}

/** What the registry's public calls take, and the positional form `complete` had before idempotency-gateway 0.1.0. */
const FORMS = {
  complete: {
    name: "ColocatedRegistry.complete",
    takes: "(tx, one object { ref, generation, outcome, snapshot, resolutions? })",
    earlier: "complete(tx, ref, generation, outcome, snapshot)",
  },
  transaction: { name: "ColocatedRegistry.transaction", takes: "(work(tx))" },
} satisfies Record<string, CallForm>;

/** What complete() and completeAndCommit() take. */
const COMPLETE_INPUT = {
  ref: operationRef,
  generation: wholeNumber(0),
  outcome: outcomeRule,
  snapshot: snapshotRule,
  resolutions: optional(arrayOf(shape({ attemptNumber: wholeNumber(1), status: oneOf("CONFIRMED", "NO_EFFECT"), providerHandle: optional(string) }))),
};

/** Thrown inside an open transaction's work to have it rolled back. */
const ROLL_BACK = new Error("rolled back by its owner");

/**
 * Co-located mode: the registry's state machine in this process, on the
 * service's own connections. By default the whole lifecycle runs here
 * (`lifecycle`, which the gateway uses instead of the coordinator): Reserve
 * commits the acceptance in a transaction of its own on the service's pool,
 * effects and leases likewise, and Complete runs inside the service's
 * business transaction (transactionDb), so that the business rows, their
 * outbox rows and the operation's terminal state commit together; a
 * local-only route runs all of it in one transaction (`begin`). Every rule
 * (the acceptance point, quotas, modes, writer epochs, fencing by
 * generation, unresolved effects, snapshot filtering) is the same code the
 * coordinator runs, on the same tables, bound to the tenant by row-level
 * security the same way: the coordinator's recoverer and recovery workers
 * see these records as any other.
 */
export class ColocatedRegistry implements ColocatedCompletion {
  readonly pool: pg.Pool;
  /** The whole lifecycle in this process (undefined with `lifecycle: "completion"`): the gateway calls it instead of the coordinator. */
  readonly lifecycle: LifecycleCalls | undefined;
  private readonly registry: Registry;
  private readonly actor: Actor;
  private readonly shared: LocalLifecycle;
  private readonly hooks: FaultHooks;
  /** The business transactions of transaction() and begin() still open: its statements go by their prepared names there, and Complete may commit them. */
  private readonly open = new WeakSet<object>();
  /** Business transactions whose COMMIT is on its way with their Complete: the hook before it was reached already. */
  private readonly committing = new WeakSet<object>();
  /** Whether its statements are prepared (ColocatedRegistryOptions.preparedStatements). */
  private readonly preparing: boolean;
  /** Operations completed inside each open business transaction: their waiters are woken once it commits. */
  private readonly completedIn = new WeakMap<object, Array<{ tenant: string; operationId: string }>>();

  private constructor(
    pool: pg.Pool,
    db: Db,
    private readonly policies: PolicyCache,
    actor: Actor,
    options: {
      snapshotKeys: SnapshotKeyring | undefined;
      hooks: FaultHooks;
      inProcess: boolean;
      waitersMax: number;
      preparedStatements: boolean;
      coalesce: { maxBatch: number; maxInFlight: number; lockWaitMs?: number } | undefined;
    },
  ) {
    this.pool = pool;
    this.preparing = options.preparedStatements;
    this.hooks = options.hooks;
    this.registry = new Registry({
      policies,
      ...(options.snapshotKeys ? { keyring: options.snapshotKeys } : {}),
      hooks: options.hooks,
      ...(options.coalesce ? { coalesce: options.coalesce } : {}),
    });
    this.actor = actor;
    this.shared = { registry: this.registry, actor, watch: new RecordWatch(options.waitersMax) };
    this.lifecycle = options.inProcess ? lifecycleOn(db, this.shared, true) : undefined;
    if (!options.inProcess) this.begin = undefined;
  }

  /**
   * Loads the published policies (and keeps them fresh) and returns the
   * registry. Refused without the coordinator's key ring, unless plaintext is
   * asked for by name (`allowPlaintextSnapshots: true`).
   */
  static async open(options: ColocatedRegistryOptions): Promise<ColocatedRegistry> {
    const logger = options.logger ?? pino({ level: "silent" });
    // Checked here too: JavaScript callers and casts get past the type.
    if (!options.snapshotKeys && options.allowPlaintextSnapshots !== true) {
      throw new Error(
        "ColocatedRegistry.open: snapshotKeys (the coordinator's key ring, e.g. snapshotKeysFromEnv()) is required, so that completed bodies are sealed; allowPlaintextSnapshots: true stores them unsealed (never in production)",
      );
    }
    if (!options.snapshotKeys) logger.warn("co-located completion without a key ring (allowPlaintextSnapshots): response bodies are stored unsealed");
    // The registry's own transactions on the service's pool, as the coordinator runs its own:
    // bound to the tenant at BEGIN, retried whole on transient failures (every command
    // recognizes its own earlier write), pipelined when the pool was opened with `pipeline: true`.
    const db = poolDb(options.pool, logger, { preparedStatements: options.preparedStatements ?? true });
    await db
      .transaction("", (q) => requireLeastPrivilege(q), "privileges")
      .catch((error: unknown) =>
        // The service's login is the service's own to choose; said loudly, since row-level security binds nothing then.
        logger.warn({ problem: (error as Error).message }, "co-located mode: the service's database role is not bound by row-level security (docs/adopting.md, section 5)"),
      );
    const store = new PolicyStore(db);
    const policies = new PolicyCache({ load: () => store.load(), refreshMs: options.policyRefreshMs ?? 2000, logger });
    await policies.start();
    const tenants = options.tenants ?? "*";
    const operations = options.operations ?? "*";
    return new ColocatedRegistry(
      options.pool,
      db,
      policies,
      {
        caller: options.caller,
        isOperator: false,
        mayUseTenant: (tenant) => tenants === "*" || tenants.includes(tenant),
        mayOperate: (operation) => operations === "*" || operations.includes(operation),
      },
      {
        snapshotKeys: options.snapshotKeys,
        hooks: options.hooks ?? NO_FAULTS,
        inProcess: (options.lifecycle ?? "in-process") === "in-process",
        waitersMax: options.waitersMax ?? 256,
        preparedStatements: options.preparedStatements ?? true,
        coalesce: options.coalesce === false ? undefined : (options.coalesce ?? { maxBatch: 64, maxInFlight: 4, lockWaitMs: 50 }),
      },
    );
  }

  /**
   * Complete inside the caller's open transaction `tx`: nothing is committed
   * here; the caller's COMMIT makes the terminal state durable together with
   * its own rows, and its ROLLBACK undoes both. Refusals are thrown as
   * CoordinatorError with the same reasons as over RPC.
   */
  async complete(tx: Queryable, input: CompleteInput): Promise<CompleteResult> {
    check(FORMS.complete, tx, "tx", withMethods("a client inside an open transaction (the `tx` of ctx.transaction or of this registry's transaction())", "query"));
    checkInput(FORMS.complete, input, COMPLETE_INPUT);
    return refusedAsCoordinator(async () => {
      const record = await this.registry.complete(transactionDb(tx, this.preparing && this.open.has(tx)), registryComplete(input), this.actor);
      this.completedWithin(tx, input.ref);
      return completeResult(record);
    });
  }

  /**
   * Complete as the last statement of a business transaction of this
   * registry still open (transaction()'s work, begin()): the terminal state goes out with its
   * COMMIT, one round trip fewer, and nothing may be sent on `tx` after it.
   * The hook before the COMMIT (gateway.business.before-commit) is reached
   * before Complete is sent. On another transaction, as complete().
   */
  async completeAndCommit(tx: Queryable, input: CompleteInput): Promise<CompleteResult> {
    if (!this.open.has(tx)) return this.complete(tx, input);
    checkInput(FORMS.complete, input, COMPLETE_INPUT);
    return refusedAsCoordinator(async () => {
      await this.hooks.reached("gateway.business.before-commit");
      this.committing.add(tx);
      try {
        const record = await this.registry.complete(transactionDb(tx, this.preparing, true), registryComplete(input), this.actor);
        this.completedWithin(tx, input.ref);
        return completeResult(record);
      } catch (error) {
        this.committing.delete(tx);
        throw error;
      }
    });
  }

  /** Notes an operation completed inside `tx`, whose waiters are woken once it commits. */
  private completedWithin(tx: object, ref: { tenant: string; operationId: string }): void {
    const completed = this.completedIn.get(tx) ?? [];
    completed.push(ref);
    this.completedIn.set(tx, completed);
  }

  /**
   * Runs `work` in one transaction on a connection of the pool (BEGIN,
   * work, COMMIT; ROLLBACK on any error), with the registry's own runner
   * (src/registry/db.ts). A connection lost during COMMIT leaves its outcome
   * unknown: CommitUnknownError.
   */
  async transaction<T>(work: (tx: pg.PoolClient) => Promise<T>): Promise<T> {
    check(FORMS.transaction, work, "work", func);
    let client: pg.PoolClient | undefined;
    let result: T;
    try {
      result = await runTransaction(this.pool, async (tx) => {
        client = tx;
        this.open.add(tx);
        try {
          const done = await work(tx);
          if (!this.committing.delete(tx)) await this.hooks.reached("gateway.business.before-commit");
          return done;
        } finally {
          this.open.delete(tx);
        }
      });
    } catch (error) {
      if (client) this.completedIn.delete(client);
      if (client) this.committing.delete(client);
      throw error;
    }
    this.committed(client);
    await this.hooks.reached("gateway.business.after-commit");
    return result;
  }

  /**
   * Opens one transaction on a connection of the pool for a local-only
   * route (IdempotentRoute.localOnly): its lifecycle calls run inside it
   * (Reserve's acceptance included), and nothing of it commits until
   * `commit`, with the business rows and the terminal state; `rollback`
   * leaves nothing. Only with the lifecycle in process.
   */
  begin?: () => Promise<OpenTransaction> = () =>
    new Promise<OpenTransaction>((opened, failed) => {
      let decide: (commit: boolean) => void = () => undefined;
      const decided = new Promise<boolean>((resolve) => (decide = resolve));
      let client: pg.PoolClient | undefined;
      // The registry's runner: BEGIN, then (once decided) COMMIT, or ROLLBACK on the throw; a
      // connection lost during COMMIT is CommitUnknownError, and a broken one is discarded.
      const ended = runTransaction(this.pool, async (tx) => {
        client = tx;
        this.open.add(tx);
        opened({
          tx,
          // Complete, the last of its calls, sends the COMMIT with the terminal state.
          calls: { ...lifecycleOn(transactionDb(tx, this.preparing), this.shared, false), complete: (input) => this.completeAndCommit(tx, input) },
          commit: async () => {
            decide(true);
            await ended;
          },
          rollback: async () => {
            decide(false);
            await ended.catch(() => undefined);
          },
        });
        try {
          if (!(await decided)) throw ROLL_BACK;
          if (!this.committing.delete(tx)) await this.hooks.reached("gateway.business.before-commit");
        } finally {
          this.open.delete(tx);
          this.committing.delete(tx);
        }
      }).then(async () => {
        this.committed(client);
        await this.hooks.reached("gateway.business.after-commit");
      });
      ended.catch((error: unknown) => (error === ROLL_BACK ? undefined : failed(error as Error)));
    });

  /** A business transaction committed: the waiters on what it completed decide again now. */
  private committed(tx: pg.PoolClient | undefined): void {
    if (!tx) return;
    for (const ref of this.completedIn.get(tx) ?? []) this.shared.watch.changed(ref.tenant, ref.operationId);
    this.completedIn.delete(tx);
  }

  /** Stops refreshing policies (the pool is the caller's to end). */
  stop(): void {
    this.policies.stop();
  }
}
