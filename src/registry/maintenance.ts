import { ALL_TENANTS, bindingFor, type Db } from "./db.js";
import { readViews } from "./records.js";
import type { RecordState, RecordView } from "./types.js";

/**
 * The registry's background work and operator reads: the recoverer's pass
 * over ended leases, the retention sweep into tombstones, the leases that let
 * one replica at a time run each job, listings and the event log. None of it
 * is on the request path; batches use SKIP LOCKED so that they never wait on
 * (or make wait) a request holding a record.
 */

/**
 * Takes or keeps the lease of a background job for `ttlMs`. True when this
 * holder has it: nobody else held a live lease. A row, not an advisory lock,
 * so that it also works on distributed PostgreSQL.
 */
export async function holdJobLease(db: Db, job: string, holder: string, ttlMs: number): Promise<boolean> {
  const { rows } = await db.transaction(ALL_TENANTS, (q) =>
    q.query(
      `INSERT INTO idem_job_lease (job, holder, expires_at)
       VALUES ($1, $2, now() + make_interval(secs => $3::double precision / 1000))
       ON CONFLICT (job) DO UPDATE
          SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
        WHERE idem_job_lease.holder = EXCLUDED.holder OR idem_job_lease.expires_at <= now()
       RETURNING holder`,
      [job, holder, ttlMs],
    ),
  );
  return rows.length === 1;
}

/** Gives a job's lease up at once (on shutdown), so that another replica takes over without waiting. */
export async function releaseJobLease(db: Db, job: string, holder: string): Promise<void> {
  await db.transaction(ALL_TENANTS, (q) => q.query("DELETE FROM idem_job_lease WHERE job = $1 AND holder = $2", [job, holder]));
}

/**
 * One pass of the recoverer over unfinished records whose lease ended: with a
 * possible effect the record becomes UNKNOWN (never executed again); without
 * one its lease is cleared, so that the next identical retry takes it over.
 * Each change is fenced by the generation it was read at and logged in the
 * same statement. Returns how many records became UNKNOWN and how many
 * claimable.
 */
export async function recoverExpiredLeases(db: Db, batchSize: number, caller: string): Promise<{ unknown: number; claimable: number }> {
  const { rows } = await db.transaction(ALL_TENANTS, (q) =>
    q.query<{ state: RecordState; n: number }>(
      `WITH due AS (
         SELECT tenant_id, operation_id, generation FROM idem_record
          WHERE state IN ('RESERVED', 'EXECUTING') AND lease_expires_at <= now()
          ORDER BY lease_expires_at LIMIT $1
          FOR UPDATE SKIP LOCKED
       ), changed AS (
         UPDATE idem_record r
            SET state = CASE WHEN r.effect_possible THEN 'UNKNOWN' ELSE r.state END,
                recovering = r.recovering AND NOT r.effect_possible,
                lease_expires_at = CASE WHEN r.effect_possible THEN r.lease_expires_at END,
                updated_at = now()
           FROM due
          WHERE r.tenant_id = due.tenant_id AND r.operation_id = due.operation_id AND r.generation = due.generation
         RETURNING r.tenant_id, r.operation_id, r.operation, r.api_revision, r.generation, r.state
       ), logged AS (
         INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller)
         SELECT tenant_id, operation_id, operation, api_revision,
                CASE WHEN state = 'UNKNOWN' THEN 'UNKNOWN' ELSE 'LEASE_EXPIRED' END, generation, state, $2
           FROM changed
       )
       SELECT state, count(*)::int AS n FROM changed GROUP BY state`,
      [batchSize, caller],
    ),
  );
  const unknown = rows.find((r) => r.state === "UNKNOWN")?.n ?? 0;
  return { unknown, claimable: rows.reduce((sum, r) => sum + r.n, 0) - unknown };
}

/**
 * Turns up to `batchSize` finished records whose retention ended into
 * tombstones: the snapshot and the effect attempts go; scope, fingerprint,
 * outcome and snapshot digest stay, so that the scope keeps answering EXPIRED
 * or PAYLOAD_CONFLICT. Returns how many were tombstoned.
 */
export async function tombstoneBatch(db: Db, batchSize: number, caller: string): Promise<number> {
  const { rows } = await db.transaction(ALL_TENANTS, (q) =>
    q.query<{ n: number }>(
      `WITH due AS (
         SELECT tenant_id, operation_id FROM idem_record
          WHERE tombstoned_at IS NULL AND state IN ('SUCCEEDED', 'FAILED_FINAL', 'REJECTED') AND retain_until <= now()
          ORDER BY retain_until LIMIT $1
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
       ), logged AS (
         INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller)
         SELECT tenant_id, operation_id, operation, api_revision, 'TOMBSTONED', generation, state, $2 FROM swept
       )
       SELECT count(*)::int AS n FROM swept`,
      [batchSize, caller],
    ),
  );
  return rows[0]?.n ?? 0;
}

/**
 * The retention sweep: tombstone batches until nothing is due, `maxBatches`
 * ran, or `budgetMs` passed (so that one sweep never runs unbounded), reporting
 * each batch. Each batch is its own short statement.
 */
export async function sweepRetention(
  db: Db,
  options: { batchSize: number; maxBatches?: number; budgetMs?: number; caller: string; onBatch?: (tombstoned: number, total: number) => void },
): Promise<{ tombstoned: number; batches: number }> {
  const deadline = Date.now() + (options.budgetMs ?? Number.POSITIVE_INFINITY);
  let tombstoned = 0;
  let batches = 0;
  while (batches < (options.maxBatches ?? Number.POSITIVE_INFINITY) && Date.now() < deadline) {
    const n = await tombstoneBatch(db, options.batchSize, options.caller);
    batches++;
    tombstoned += n;
    options.onBatch?.(n, tombstoned);
    if (n < options.batchSize) break;
  }
  return { tombstoned, batches };
}

/** What an operator lists records by. */
export interface RecordFilter {
  states?: readonly RecordState[];
  tenants?: readonly string[];
  operations?: readonly string[];
  /** Only records created at least this long ago. */
  olderThanMs?: number;
  pageSize: number;
  /** Resume after this record (the last one of the previous page). */
  after?: { createdAt: string; tenant: string; operationId: string };
}

/** Records by state, tenant, operation and age, oldest first, with a resumable cursor. */
export async function listRecords(db: Db, filter: RecordFilter): Promise<Array<RecordView & { createdAtText: string }>> {
  const views = await db.transaction(bindingFor(filter.tenants), (q) =>
    readViews(
      q,
      `($1::text[] IS NULL OR state = ANY($1))
       AND ($2::text[] IS NULL OR tenant_id = ANY($2))
       AND ($3::text[] IS NULL OR operation = ANY($3))
       AND ($4::bigint IS NULL OR created_at <= now() - make_interval(secs => $4::double precision / 1000))
       AND ($5::timestamptz IS NULL OR (created_at, tenant_id, operation_id) > ($5, $6, $7::uuid))
       ORDER BY created_at, tenant_id, operation_id LIMIT $8`,
      [
        filter.states ?? null,
        filter.tenants ?? null,
        filter.operations ?? null,
        filter.olderThanMs ?? null,
        filter.after?.createdAt ?? null,
        filter.after?.tenant ?? null,
        filter.after?.operationId ?? null,
        filter.pageSize,
      ],
    ),
  );
  return views;
}

/** Which tenants and operations a view covers; undefined: all. */
export interface ViewScope {
  tenants?: readonly string[];
  operations?: readonly string[];
}

/**
 * How many records are in each state, and the age of the oldest UNKNOWN one:
 * of every tenant (metrics), or of a scope (what an operator is shown).
 */
export async function registryCensus(db: Db, scope: ViewScope = {}): Promise<{ byState: Map<RecordState, number>; oldestUnknownSeconds: number; overdue: number }> {
  const { rows } = await db.transaction(bindingFor(scope.tenants), (q) =>
    q.query<{ state: RecordState; n: number; oldest_unknown: number | null; overdue: number }>(
      `SELECT state, count(*)::int AS n,
              extract(epoch FROM now() - min(updated_at) FILTER (WHERE state = 'UNKNOWN'))::float8 AS oldest_unknown,
              (count(*) FILTER (WHERE state IN ('RESERVED', 'EXECUTING') AND lease_expires_at IS NULL
                                  AND updated_at < now() - interval '1 day'))::int AS overdue
         FROM idem_record
        WHERE tombstoned_at IS NULL AND ($1::text[] IS NULL OR tenant_id = ANY($1)) AND ($2::text[] IS NULL OR operation = ANY($2))
        GROUP BY state`,
      [scope.tenants ?? null, scope.operations ?? null],
    ),
  );
  return {
    byState: new Map(rows.map((r) => [r.state, r.n])),
    oldestUnknownSeconds: Math.max(0, ...rows.map((r) => r.oldest_unknown ?? 0)),
    overdue: rows.reduce((sum, r) => sum + r.overdue, 0),
  };
}

/** One entry of the event log. */
export interface LoggedEvent {
  eventId: string;
  /** Where a reader resumes after this event. */
  cursor: EventCursor;
  tenant: string;
  operationId: string | null;
  operation: string | null;
  apiRevision: number | null;
  kind: string;
  generation: number | null;
  state: string | null;
  caller: string;
  detail: Record<string, unknown>;
  at: Date;
}

/** A position in the event log: the event's transaction id and event id, as text. */
export interface EventCursor {
  txid: string;
  eventId: string;
}

/**
 * Events after `after` (from the start when undefined), optionally of one
 * tenant or operation. Only events of transactions that have ended are read,
 * in (transaction, event) order: an event committed late by a slow
 * transaction still comes after the cursor, never before it.
 */
export async function readEvents(db: Db, filter: { after?: EventCursor; limit: number; tenant?: string; operation?: string }): Promise<LoggedEvent[]> {
  const { rows } = await db.transaction(filter.tenant ?? ALL_TENANTS, (q) =>
    q.query(
      `SELECT txid::text AS txid_text, event_id::text AS event_id_text, tenant_id, operation_id, operation, api_revision,
              kind, generation, state, caller, detail, at
         FROM idem_event
        WHERE ($1::xid8 IS NULL OR (txid, event_id) > ($1::xid8, $2::bigint))
          AND txid < pg_snapshot_xmin(pg_current_snapshot())
          AND ($3::text IS NULL OR tenant_id = $3) AND ($4::text IS NULL OR operation = $4)
        ORDER BY txid, event_id LIMIT $5`,
      [filter.after?.txid ?? null, filter.after?.eventId ?? null, filter.tenant ?? null, filter.operation ?? null, filter.limit],
    ),
  );
  return rows.map((r) => ({ ...toEvent(r), cursor: { txid: r.txid_text as string, eventId: r.event_id_text as string } }));
}

/**
 * The newest events of the given kinds within a scope, newest first (the
 * console's "recent conflicts"). The scope is applied before the limit, so
 * that other tenants' events never crowd a scope's own out.
 */
export async function recentEvents(db: Db, kinds: readonly string[], limit: number, scope: ViewScope = {}): Promise<Array<Omit<LoggedEvent, "cursor">>> {
  const { rows } = await db.transaction(bindingFor(scope.tenants), (q) =>
    q.query(
      `SELECT event_id::text AS event_id_text, tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail, at
         FROM idem_event
        WHERE kind = ANY($1) AND ($3::text[] IS NULL OR tenant_id = ANY($3)) AND ($4::text[] IS NULL OR operation = ANY($4))
        ORDER BY at DESC, event_id DESC LIMIT $2`,
      [kinds, limit, scope.tenants ?? null, scope.operations ?? null],
    ),
  );
  return rows.map(toEvent);
}

function toEvent(r: Record<string, unknown>): Omit<LoggedEvent, "cursor"> {
  return {
    eventId: r.event_id_text as string,
    tenant: r.tenant_id as string,
    operationId: r.operation_id as string | null,
    operation: r.operation as string | null,
    apiRevision: r.api_revision as number | null,
    kind: r.kind as string,
    generation: r.generation === null ? null : Number(r.generation),
    state: r.state as string | null,
    caller: r.caller as string,
    detail: r.detail as Record<string, unknown>,
    at: r.at as Date,
  };
}
