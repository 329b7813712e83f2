import { NO_ROWS, statement, type NoRow } from "../statement.js";
import type { RecordState } from "../../contract/words.js";
import { logChanges } from "./parts.js";

/**
 * The background jobs' statements: who runs a job, the recoverer's pass, the
 * retention sweep, the census. None is on the request path; batches use
 * SKIP LOCKED so that they never wait on (or make wait) a request holding a
 * record.
 */

/**
 * Takes or keeps a job's lease: true (a row back) when this holder has it,
 * because nobody else held a live one. A row, not an advisory lock, so that
 * it also works on distributed PostgreSQL.
 */
export const holdJobLease = statement<{ job: string; holder: string; ttlMs: number }, { holder: string }>(
  "holdJobLease",
  `INSERT INTO idem_job_lease (job, holder, expires_at)
   VALUES (:job, :holder, now() + make_interval(secs => :ttlMs::double precision / 1000))
   ON CONFLICT (job) DO UPDATE
      SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
    WHERE idem_job_lease.holder = EXCLUDED.holder OR idem_job_lease.expires_at <= now()
   RETURNING holder`,
  { holder: true },
);

/** Gives a job's lease up (on shutdown), so that another replica takes over without waiting. */
export const releaseJobLease = statement<{ job: string; holder: string }, NoRow>("releaseJobLease", "DELETE FROM idem_job_lease WHERE job = :job AND holder = :holder", NO_ROWS);

/**
 * One batch of the recoverer over unfinished records whose lease ended: with
 * a possible effect, or when it has been UNKNOWN before (a recovery worker's
 * lease ended), the record becomes UNKNOWN (never executed again); otherwise
 * its lease is cleared, so that the next identical retry takes it over. Each change is fenced by the generation it was read at and logged in
 * the same statement. Counts by resulting state.
 */
export const recoverExpiredLeases = statement<{ batchSize: number; caller: string }, { state: string; n: number }>(
  "recoverExpiredLeases",
  `WITH due AS (
     SELECT tenant_id, operation_id, generation FROM idem_record
      WHERE state IN ('RESERVED', 'EXECUTING') AND lease_expires_at <= now()
      ORDER BY lease_expires_at LIMIT :batchSize
      FOR UPDATE SKIP LOCKED
   ), changed AS (
     UPDATE idem_record r
        SET state = CASE WHEN r.effect_possible OR r.went_unknown THEN 'UNKNOWN' ELSE r.state END,
            recovering = false,
            went_unknown = r.effect_possible OR r.went_unknown,
            lease_expires_at = CASE WHEN r.effect_possible OR r.went_unknown THEN r.lease_expires_at END,
            updated_at = now()
       FROM due
      WHERE r.tenant_id = due.tenant_id AND r.operation_id = due.operation_id AND r.generation = due.generation
     RETURNING r.tenant_id, r.operation_id, r.operation, r.api_revision, r.generation, r.state
   ), ${logChanges("changed", "CASE WHEN state = 'UNKNOWN' THEN 'UNKNOWN' ELSE 'LEASE_EXPIRED' END")}
   SELECT state, count(*)::int AS n FROM changed GROUP BY state`,
  { state: true, n: true },
);

/**
 * One batch of the retention sweep: finished records whose retention ended
 * become tombstones. The snapshot and the effect attempts go; scope,
 * fingerprint, outcome and snapshot digest stay, so that the scope keeps
 * answering EXPIRED or PAYLOAD_CONFLICT.
 */
export const tombstoneBatch = statement<{ batchSize: number; caller: string }, { n: number }>(
  "tombstoneBatch",
  `WITH due AS (
     SELECT tenant_id, operation_id FROM idem_record
      WHERE tombstoned_at IS NULL AND state IN ('SUCCEEDED', 'FAILED_FINAL', 'REJECTED') AND retain_until <= now()
      ORDER BY retain_until LIMIT :batchSize
      FOR UPDATE SKIP LOCKED
   ), attempts AS (
     DELETE FROM idem_effect_attempt a USING due WHERE a.tenant_id = due.tenant_id AND a.operation_id = due.operation_id
   ), swept AS (
     UPDATE idem_record r
        SET tombstoned_at = now(), snapshot_status = NULL, snapshot_media_type = NULL, snapshot_location = NULL,
            snapshot_business_version = NULL, snapshot_headers = NULL, snapshot_body = NULL, snapshot_key_id = NULL,
            updated_at = now()
       FROM due
      WHERE r.tenant_id = due.tenant_id AND r.operation_id = due.operation_id
     RETURNING r.tenant_id, r.operation_id, r.operation, r.api_revision, r.generation, r.state
   ), ${logChanges("swept", "'TOMBSTONED'")}
   SELECT count(*)::int AS n FROM swept`,
  { n: true },
);

/**
 * Records per state of some tenants and operations (null: all), the age of
 * the oldest UNKNOWN one, and unfinished records without a lease for over a
 * day (overdue: nobody will retry them). Tombstones are not counted, and not
 * read either: they are kept for good and soon outnumber the live records,
 * so the live ones are read through partial indexes that hold only them
 * (the unfinished ones: the recoverer's or the quota's; the finished ones not
 * yet swept: idem_record_retention_due), each branch naming its index's
 * predicate.
 */
export const census = statement<
  { tenants: readonly string[] | null; operations: readonly string[] | null },
  { state: RecordState; n: number; oldest_unknown: number | null; overdue: number }
>(
  "census",
  `SELECT state, count(*)::int AS n,
          extract(epoch FROM now() - min(updated_at) FILTER (WHERE state = 'UNKNOWN'))::float8 AS oldest_unknown,
          (count(*) FILTER (WHERE state IN ('RESERVED', 'EXECUTING') AND lease_expires_at IS NULL
                              AND updated_at < now() - interval '1 day'))::int AS overdue
     FROM (SELECT tenant_id, operation, state, updated_at, lease_expires_at FROM idem_record
            WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN') AND tombstoned_at IS NULL
           UNION ALL
           SELECT tenant_id, operation, state, updated_at, lease_expires_at FROM idem_record
            WHERE tombstoned_at IS NULL AND state IN ('SUCCEEDED', 'FAILED_FINAL', 'REJECTED')) live
    WHERE (:tenants::text[] IS NULL OR tenant_id = ANY(:tenants)) AND (:operations::text[] IS NULL OR operation = ANY(:operations))
    GROUP BY state`,
  { state: true, n: true, oldest_unknown: true, overdue: true },
);
