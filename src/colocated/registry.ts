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
import { toCoordinatorError } from "../gateway/errors.js";
import type { ColocatedCompletion, CompleteInput, CompleteResult } from "../gateway/types.js";
import { PolicyCache } from "../policy/cache.js";
import { runTransaction, transactionDb, type Db, type Queryable } from "../registry/db.js";
import { PolicyStore } from "../registry/policy-store.js";
import { Registry } from "../registry/registry.js";
import type { Actor } from "../registry/types.js";

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

/**
 * The registry's own reads on the service's pool (the policies): each unit of
 * work in a transaction of its own, run as a business transaction is
 * (runTransaction, transactionDb), so that its statements go out one at a
 * time on connections not opened for pipelining, and nothing is prepared on
 * the service's connections.
 */
function serviceDb(pool: pg.Pool): Db {
  return { transaction: (tenant, work, name) => runTransaction(pool, (client) => transactionDb(client).transaction(tenant, work, name)) };
}

/**
 * Co-located mode: the registry's state machine in this process, on the
 * service's own connections, so that Complete runs inside the service's
 * business transaction (transactionDb) and the business rows, their outbox
 * rows and the operation's terminal state commit together. Reserve, leases
 * and effects still go through the coordinator; only completion moves in.
 * Every rule (fencing by generation, unresolved effects, snapshot filtering
 * by the policy's allowlist) is the same code the coordinator runs.
 */
export class ColocatedRegistry implements ColocatedCompletion {
  readonly pool: pg.Pool;
  private readonly registry: Registry;
  private readonly actor: Actor;

  private constructor(
    pool: pg.Pool,
    private readonly policies: PolicyCache,
    actor: Actor,
    snapshotKeys: SnapshotKeyring | undefined,
    private readonly hooks: FaultHooks,
  ) {
    this.pool = pool;
    this.registry = new Registry({ policies, ...(snapshotKeys ? { keyring: snapshotKeys } : {}), hooks });
    this.actor = actor;
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
    const store = new PolicyStore(serviceDb(options.pool));
    const policies = new PolicyCache({ load: () => store.load(), refreshMs: options.policyRefreshMs ?? 2000, logger });
    await policies.start();
    const tenants = options.tenants ?? "*";
    const operations = options.operations ?? "*";
    return new ColocatedRegistry(
      options.pool,
      policies,
      {
        caller: options.caller,
        isOperator: false,
        mayUseTenant: (tenant) => tenants === "*" || tenants.includes(tenant),
        mayOperate: (operation) => operations === "*" || operations.includes(operation),
      },
      options.snapshotKeys,
      options.hooks ?? NO_FAULTS,
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
    checkInput(FORMS.complete, input, {
      ref: operationRef,
      generation: wholeNumber(0),
      outcome: outcomeRule,
      snapshot: snapshotRule,
      resolutions: optional(arrayOf(shape({ attemptNumber: wholeNumber(1), status: oneOf("CONFIRMED", "NO_EFFECT"), providerHandle: optional(string) }))),
    });
    const { ref, generation, outcome, snapshot, resolutions } = input;
    try {
      const record = await this.registry.complete(
        transactionDb(tx),
        {
          ref,
          generation,
          outcome,
          snapshot: {
            statusCode: snapshot.statusCode,
            mediaType: snapshot.mediaType,
            location: snapshot.location,
            businessVersion: snapshot.businessVersion,
            headers: snapshot.headers,
            body: snapshot.body,
          },
          resolutions: (resolutions ?? []).map((r) => ({ attemptNumber: r.attemptNumber, status: r.status, providerHandle: r.providerHandle ?? "" })),
        },
        this.actor,
      );
      return { state: record.state, snapshotDigest: record.snapshot?.digest ?? new Uint8Array(), ...(record.completedAt ? { completedAt: record.completedAt } : {}) };
    } catch (error) {
      throw toCoordinatorError(error);
    }
  }

  /**
   * Runs `work` in one transaction on a connection of the pool (BEGIN,
   * work, COMMIT; ROLLBACK on any error), with the registry's own runner
   * (src/registry/db.ts). A connection lost during COMMIT leaves its outcome
   * unknown: CommitUnknownError.
   */
  async transaction<T>(work: (tx: pg.PoolClient) => Promise<T>): Promise<T> {
    check(FORMS.transaction, work, "work", func);
    const result = await runTransaction(this.pool, async (tx) => {
      const done = await work(tx);
      await this.hooks.reached("gateway.business.before-commit");
      return done;
    });
    await this.hooks.reached("gateway.business.after-commit");
    return result;
  }

  /** Stops refreshing policies (the pool is the caller's to end). */
  stop(): void {
    this.policies.stop();
  }
}
