import { IdempotencyError } from "../contract/errors.js";
import { finishColumns, type CompleteItem } from "./commands/complete.js";
import { admitCommitted, type Admission } from "./admission.js";
import { opened, type RegistryContext } from "./context.js";
import { isLockWaitEnded, type Db } from "./db.js";
import { toAttempt, toRecord } from "./rows.js";
import { refuseNotFound } from "./shared.js";
import type { ScopeRead } from "./state-machine.js";
import { keepingResult, pipelined } from "./statement.js";
import * as batchStatements from "./statements/batches.js";
import type * as recordStatements from "./statements/records.js";
import type { ReserveResult, StoredRecord } from "./types.js";

/**
 * Coalesced Reserves and Completes (Coalescer): the requests of one lane
 * (database, tenant and caller) decided together in one transaction and
 * its COMMIT, each answered from its own row by the same rules as alone.
 */

/** The default longest wait of a batch's shared transaction for a row lock before its requests are decided alone. */
export const DEFAULT_BATCH_LOCK_WAIT_MS = 50;

/** A Reserve waiting for a batch: the record it would make, and how it answers from what its scope holds. */
export interface ReserveItem {
  db: Db;
  tenant: string;
  caller: string;
  admission: Admission;
  /** Its answer from what the batch read of its scope, or undefined to decide it alone. */
  answer: (read: ScopeRead) => ReserveResult | undefined;
  /** The request decided on its own, in its own transaction. */
  alone: () => Promise<ReserveResult>;
}

/**
 * Reserves of one tenant and caller in one transaction: one guarded insert
 * for all their scopes, with the quota gates and counts behind it in the
 * same round trip, then one COMMIT. Each request is answered from its own
 * row by the same rules as alone; a request the batch cannot decide
 * without a write of its own or another revision's rules (a conflict to
 * log, a takeover, a tombstone, a record of an older revision, a record
 * committed after the statement's snapshot, a second request of the same
 * scope) is decided alone once the batch has committed. When a
 * principal's new records would pass its quota, the batch rolls back and
 * every request is decided alone, in the exact order of the gate. So is
 * every request when the batch waited for a row lock past its short lock
 * wait (another writer holding a principal's gate row or a scope): the
 * requests that are not behind that lock are answered at their own pace.
 */
export function reserveBatch(context: RegistryContext, items: ReserveItem[]): Array<Promise<ReserveResult>> {
  const { db, tenant, caller } = items[0]!;
  const [batch] = partitionDistinct(items, (item) => item.admission.record.scope.toString("hex"));
  // One round trip with the COMMIT: a principal over its quota fails the count, and the batch rolls back.
  const shared = admitCommitted(
    db,
    tenant,
    caller,
    batch.map((item) => item.admission),
    context.batchTransaction,
  ).then((reads) => new Map(batch.map((item) => [item, item.answer(reads(item.admission))])));
  return items.map((item) => answerFromBatch(shared, item, (decided) => decided.get(item)));
}

/**
 * Completes of one tenant and caller in one transaction: their records
 * locked (in one order) with their attempts in one round trip, each decided
 * by the same rules as alone, the finished ones written by one statement,
 * then one COMMIT. A refused request is answered with its refusal and
 * writes nothing; its neighbours are not affected. A second Complete of the
 * same operation is decided alone once the batch has committed, and so is
 * every request when the batch waited for a record's lock past its short
 * lock wait (another writer holding it).
 */
export function completeBatch(context: RegistryContext, items: CompleteItem[]): Array<Promise<StoredRecord>> {
  const { db, actor } = items[0]!;
  const tenant = items[0]!.input.ref.tenant;
  const [batch] = partitionDistinct(items, (item) => item.input.ref.operationId);
  const shared = db.transaction(
    tenant,
    async (q, commitWith) => {
      const operationIds = batch.map((i) => i.input.ref.operationId);
      const [locked, attemptRows] = await pipelined([
        batchStatements.lockRecords.run(q, { tenant, operationIds }),
        batchStatements.loadAttemptsMany.run(q, { tenant, operationIds }),
      ] as const);
      const records = new Map(locked.rows.map((row) => [row.operation_id, toRecord(row)]));
      const attempts = groupBy(attemptRows.rows, (row) => row.operation_id, toAttempt);
      const plans = await Promise.allSettled(
        batch.map(async ({ input }) => {
          const record = records.get(input.ref.operationId);
          if (!record || !actor.mayOperate(record.operation)) refuseNotFound();
          return { record, columns: await finishColumns(context, record, attempts.get(record.operationId) ?? [], input), outcome: input.outcome };
        }),
      );
      const finishing = plans.flatMap((plan) => (plan.status === "fulfilled" && plan.value.columns ? [{ ...plan.value, columns: plan.value.columns }] : []));
      const finished = new Map<string, StoredRecord>();
      if (finishing.length > 0) {
        for (let i = 0; i < finishing.length; i++) await context.hooks.reached("registry.complete.before-commit");
        // The terminal states go out with COMMIT. Under the locks every fenced update matches; were one not to,
        // the requests are decided again alone (a finished record is then an identical repeat).
        const finish = keepingResult((q) => batchStatements.finishMany.run(q, { tenant, caller: actor.caller, ...finishesOf(finishing) }));
        await commitWith([finish.send]);
        for (const row of (await finish.result()).rows) finished.set(row.operation_id, toRecord(row));
        if (finished.size !== finishing.length) throw new Error(`finishMany changed ${finished.size} of the ${finishing.length} records it had locked`);
      }
      return new Map(
        batch.map((item, i): [CompleteItem, PromiseSettledResult<StoredRecord>] => {
          const plan = plans[i]!;
          if (plan.status === "rejected") return [item, plan];
          const { record } = plan.value;
          return [item, { status: "fulfilled", value: opened(context, finished.get(record.operationId) ?? record) }];
        }),
      );
    },
    "complete",
    context.batchTransaction,
  );
  return items.map((item) =>
    answerFromBatch(shared, item, (decided) => {
      const outcome = decided.get(item);
      if (!outcome) return undefined;
      return outcome.status === "fulfilled" ? outcome.value : Promise.reject(outcome.reason as Error);
    }),
  );
}

/** A failure that decided nothing for any request of a batch (the registry busy or unreachable): each gets it, to retry. */
function isUndecided(error: unknown): boolean {
  return error instanceof IdempotencyError && (error.reason === "REGISTRY_BUSY" || error.reason === "REGISTRY_UNAVAILABLE");
}

/** The first request of each key, and the ones whose key came earlier. */
function partitionDistinct<T>(items: readonly T[], key: (item: T) => string): [T[], T[]] {
  const seen = new Set<string>();
  const first: T[] = [];
  const again: T[] = [];
  for (const item of items) {
    const k = key(item);
    (seen.has(k) ? again : first).push(item);
    seen.add(k);
  }
  return [first, again];
}

/**
 * One request's answer from its batch's shared transaction: what the batch
 * decided for it (`pick`), or, when it decided nothing for it, the request
 * decided alone once the batch is over. A failure that decided nothing for
 * any request (the registry busy or unreachable) is every request's answer,
 * to retry; but when the batch only waited too long for a row lock, or
 * failed any other way, each request is decided alone.
 */
function answerFromBatch<Decided, Answer>(
  shared: Promise<Decided>,
  item: { alone: () => Promise<Answer> },
  pick: (decided: Decided) => Answer | Promise<Answer> | undefined,
): Promise<Answer> {
  return shared.then(
    (decided) => pick(decided) ?? item.alone(),
    (error: unknown) => (isUndecided(error) && !isLockWaitEnded(error) ? Promise.reject(error as Error) : item.alone()),
  );
}

function groupBy<R, V>(rows: readonly R[], key: (row: R) => string, value: (row: R) => V): Map<string, V[]> {
  const groups = new Map<string, V[]>();
  for (const row of rows) {
    const k = key(row);
    const group = groups.get(k);
    if (group) group.push(value(row));
    else groups.set(k, [value(row)]);
  }
  return groups;
}

/** The batch finish's arrays, one element per record to finish. */
function finishesOf(
  finishing: ReadonlyArray<{ record: StoredRecord; columns: recordStatements.SnapshotColumns; outcome: string }>,
): Omit<batchStatements.Finishes, "tenant" | "caller"> {
  return {
    operationIds: finishing.map((f) => f.record.operationId),
    generations: finishing.map((f) => f.record.generation),
    outcomes: finishing.map((f) => f.columns.outcome),
    keepMs: finishing.map((f) => f.columns.keepMs),
    snapshotStatuses: finishing.map((f) => f.columns.snapshotStatus),
    snapshotMediaTypes: finishing.map((f) => f.columns.snapshotMediaType),
    snapshotLocations: finishing.map((f) => f.columns.snapshotLocation),
    snapshotBusinessVersions: finishing.map((f) => f.columns.snapshotBusinessVersion),
    snapshotHeaders: finishing.map((f) => f.columns.snapshotHeaders),
    snapshotBodies: finishing.map((f) => f.columns.snapshotBody),
    snapshotDigests: finishing.map((f) => f.columns.snapshotDigest),
    snapshotKeyIds: finishing.map((f) => f.columns.snapshotKeyId),
    eventDetails: finishing.map((f) => JSON.stringify({ outcome: f.outcome })),
  };
}
