import { ALL_TENANTS, type Db } from "./db.js";
import * as jobStatements from "./statements/jobs.js";

/**
 * The background jobs' work on the registry: who runs a job (a lease per
 * job, held by one replica at a time), the recoverer's pass over ended
 * leases, and the retention sweep. None is on the request path.
 */

/**
 * Takes or keeps a background job's lease for `ttlMs`: true when `holder`
 * has it, because nobody else held a live one. The replica whose lease is
 * live runs the job; the others wait for it to end.
 */
export async function holdJobLease(db: Db, lease: { job: string; holder: string; ttlMs: number }): Promise<boolean> {
  const { rows } = await db.transaction(ALL_TENANTS, (q) => jobStatements.holdJobLease.run(q, lease));
  return rows.length === 1;
}

/** Gives a job's lease up at once (on shutdown), so that another replica takes over without waiting. */
export async function releaseJobLease(db: Db, lease: { job: string; holder: string }): Promise<void> {
  await db.transaction(ALL_TENANTS, (q) => jobStatements.releaseJobLease.run(q, lease));
}

/**
 * One batch of the recoverer over unfinished records whose lease ended:
 * with a possible effect the record becomes UNKNOWN (never executed again);
 * without one its lease is cleared, so that the next identical retry takes
 * it over. Returns how many records became UNKNOWN and how many claimable.
 */
export async function recoverExpiredLeases(db: Db, pass: { batchSize: number; caller: string }): Promise<{ unknown: number; claimable: number }> {
  const { rows } = await db.transaction(ALL_TENANTS, (q) => jobStatements.recoverExpiredLeases.run(q, pass));
  const unknown = rows.find((r) => r.state === "UNKNOWN")?.n ?? 0;
  return { unknown, claimable: rows.reduce((sum, r) => sum + r.n, 0) - unknown };
}

/**
 * The retention sweep: finished records past their retention become
 * tombstones, batch after batch (each its own short transaction) until
 * nothing is due, `maxBatches` ran, or `budgetMs` passed, so that one sweep
 * never runs unbounded. Reports each batch.
 */
export async function sweepRetention(
  db: Db,
  options: { batchSize: number; maxBatches?: number; budgetMs?: number; caller: string; onBatch?: (tombstoned: number, total: number) => void; now?: () => number },
): Promise<{ tombstoned: number; batches: number }> {
  const now = options.now ?? Date.now;
  const deadline = now() + (options.budgetMs ?? Number.POSITIVE_INFINITY);
  let tombstoned = 0;
  let batches = 0;
  while (batches < (options.maxBatches ?? Number.POSITIVE_INFINITY) && now() < deadline) {
    const { rows } = await db.transaction(ALL_TENANTS, (q) => jobStatements.tombstoneBatch.run(q, { batchSize: options.batchSize, caller: options.caller }));
    const n = rows[0]?.n ?? 0;
    batches++;
    tombstoned += n;
    options.onBatch?.(n, tombstoned);
    if (n < options.batchSize) break;
  }
  return { tombstoned, batches };
}
