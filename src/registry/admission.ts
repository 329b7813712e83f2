import { commitTogether, type Db, type Queryable, type Send, type TransactionOptions } from "./db.js";
import { toRecord } from "./rows.js";
import { keepingResult, pipelined } from "./statement.js";
import * as batchStatements from "./statements/batches.js";
import * as recordStatements from "./statements/records.js";
import type { ScopeRead } from "./state-machine.js";

/**
 * Reserve's guarded insert, the one way new records are made: a lone
 * Reserve's record, or a batch's (coalesced Reserves of one tenant and
 * caller). One statement inserts each scope's record or returns the one it
 * has, and counts each new record against its principal's quota (it fails
 * with IDQ01 over the quota, so that nothing is committed: statements/quota.ts).
 * It goes out either with the COMMIT (admitCommitted: the fast path and a
 * batch) or inside a transaction that goes on deciding (admit). One record
 * goes by records.ts insertOrFind, several by its batch form
 * (batches.ts insertOrFindMany).
 */

/** A record a Reserve would make, and the quota its principal is held to under the request's policy. */
export interface Admission {
  record: recordStatements.NewRecord;
  quota: number;
}

/** What an insert that came back without a scope's record means: one committed after the statement's snapshot. */
const MISSED: ScopeRead = { kind: "missed" };

/** A scope as a key of the reads. */
const scopeKey = (scope: Uint8Array) => Buffer.from(scope).toString("hex");

/**
 * New records of one tenant and caller, of distinct scopes, inserted (or
 * their scopes' records found) and counted, and committed: one round trip.
 * Returns what each scope holds.
 */
export async function admitCommitted(
  db: Db,
  tenant: string,
  caller: string,
  admissions: readonly Admission[],
  options?: TransactionOptions,
): Promise<(admission: Admission) => ScopeRead> {
  const { sends, reads } = admission(tenant, caller, admissions);
  // Named as a lone Reserve's, whatever it carries: a reservation transaction (metrics, the launch gate's latency line).
  await commitTogether(db, tenant, sends, "reserve", options);
  return reads();
}

/** One new record inserted (or its scope's record found) and counted, in a transaction that goes on: what its scope holds. */
export async function admit(q: Queryable, tenant: string, caller: string, one: Admission): Promise<ScopeRead> {
  const { sends, reads } = admission(tenant, caller, [one]);
  await pipelined(sends.map((send) => send(q)));
  return (await reads())(one);
}

/** The statements of an admission, and what each scope holds once they have been sent. */
function admission(tenant: string, caller: string, admissions: readonly Admission[]): { sends: Send[]; reads: () => Promise<(one: Admission) => ScopeRead> } {
  const [only] = admissions;
  const insert = keepingResult(
    admissions.length === 1
      ? (q) => recordStatements.insertOrFind.run(q, { ...only!.record, tenant, caller, quota: only!.quota })
      : (q) => batchStatements.insertOrFindMany.run(q, { tenant, caller, ...columnsOf(admissions) }),
  );
  return {
    sends: [insert.send],
    async reads() {
      const { rows } = await insert.result();
      const found = new Map(rows.map((row): [string, ScopeRead] => [scopeKey(row.scope), { kind: "found", record: toRecord(row), inserted: row.inserted }]));
      return (one) => found.get(scopeKey(one.record.scope)) ?? MISSED;
    },
  };
}

/** The batch insert's arrays, one element per new record. */
function columnsOf(admissions: readonly Admission[]): Omit<batchStatements.NewRecords, "tenant" | "caller"> {
  const records = admissions.map((a) => a.record);
  return {
    scopes: records.map((r) => r.scope),
    operationIds: records.map((r) => r.operationId),
    principals: records.map((r) => r.principal),
    operations: records.map((r) => r.operation),
    apiRevisions: records.map((r) => r.apiRevision),
    schemaRevisions: records.map((r) => r.schemaRevision),
    fingerprints: records.map((r) => r.fingerprint),
    states: records.map((r) => r.state),
    leaseMs: records.map((r) => r.leaseMs),
    acquisitionIds: records.map((r) => r.acquisitionId),
    writerEpochs: records.map((r) => r.writerEpoch),
    quotas: admissions.map((a) => a.quota),
  };
}
