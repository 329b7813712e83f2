import { NO_ROWS, statement, type NoRow, type RowColumns } from "../statement.js";
import { IN_SCOPE, type ScopeValues } from "./parts.js";
import type { IdRef } from "./records.js";

/** The event log (idem_event): appended by the statements that change records, read by operators. */

/** An event about a record that changes nothing (a logged conflict, a record seen going UNKNOWN before it is claimed). */
export const appendEvent = statement<
  {
    tenant: string;
    operationId: string;
    operation: string;
    apiRevision: number;
    kind: string;
    generation: number;
    state: string;
    caller: string;
    eventDetail: string;
  },
  NoRow
>(
  "appendEvent",
  `INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail)
   VALUES (:tenant, :operationId, :operation, :apiRevision, :kind, :generation, :state, :caller, :eventDetail::jsonb)`,
  NO_ROWS,
);

/** An event as a read of the log returns it (EVENT_COLUMNS); `operation_id` and the record's columns are null for an operation-level event. */
export interface EventRow {
  /** bigint, as text. */
  event_id_text: string;
  tenant_id: string;
  operation_id: string | null;
  operation: string | null;
  api_revision: number | null;
  kind: string;
  /** bigint, as the driver reads it. */
  generation: string | null;
  state: string | null;
  caller: string;
  detail: Record<string, unknown>;
  at: Date;
}

export const EVENT_ROW: RowColumns<EventRow> = {
  event_id_text: true,
  tenant_id: true,
  operation_id: true,
  operation: true,
  api_revision: true,
  kind: true,
  generation: true,
  state: true,
  caller: true,
  detail: true,
  at: true,
};

const EVENT_COLUMNS = `event_id::text AS event_id_text, tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail, at`;

/** An event with its place in commit order (xid8, as text): a cursor of the log. */
export interface LoggedEventRow extends EventRow {
  txid_text: string;
}

export const LOGGED_EVENT_ROW: RowColumns<LoggedEventRow> = { txid_text: true, ...EVENT_ROW };

/**
 * Events after a cursor (null: from the start), of a tenant or operation
 * (null: any). Only events of transactions that have ended are read, in
 * (transaction, event) order: an event committed late by a slow transaction
 * still comes after the cursor, never before it (migrations/000005).
 */
export const eventsAfter = statement<{ afterTxid: string | null; afterEventId: string | null; tenant: string | null; operation: string | null; limit: number }, LoggedEventRow>(
  "eventsAfter",
  `SELECT txid::text AS txid_text, ${EVENT_COLUMNS}
     FROM idem_event
    WHERE (:afterTxid::xid8 IS NULL OR (txid, event_id) > (:afterTxid::xid8, :afterEventId::bigint))
      AND txid < pg_snapshot_xmin(pg_current_snapshot())
      AND (:tenant::text IS NULL OR tenant_id = :tenant) AND (:operation::text IS NULL OR operation = :operation)
    ORDER BY txid, event_id LIMIT :limit`,
  LOGGED_EVENT_ROW,
);

/** The newest events of some kinds within tenants and operations (null: all), newest first; the scope applies before the limit. */
export const recentEvents = statement<ScopeValues & { kinds: readonly string[]; limit: number }, EventRow>(
  "recentEvents",
  `SELECT ${EVENT_COLUMNS}
     FROM idem_event
    WHERE kind = ANY(:kinds) AND ${IN_SCOPE}
    ORDER BY at DESC, event_id DESC LIMIT :limit`,
  EVENT_ROW,
);

/** The newest events of one record, newest first (the console's timeline). */
export const recordEvents = statement<IdRef & { limit: number }, EventRow>(
  "recordEvents",
  `SELECT ${EVENT_COLUMNS} FROM idem_event WHERE tenant_id = :tenant AND operation_id = :operationId ORDER BY event_id DESC LIMIT :limit`,
  EVENT_ROW,
);

/**
 * The console's charts cover `windowSeconds` in buckets of `stepSeconds`,
 * aligned on the Unix epoch (each bucket named by its start, in seconds):
 * from the bucket holding now() - windowSeconds to the one holding now(),
 * which is partial.
 */
const FIRST_BUCKET = `floor((extract(epoch FROM now()) - :windowSeconds::int) / :stepSeconds::int)`;
const LAST_BUCKET = `floor(extract(epoch FROM now()) / :stepSeconds::int)`;

/** Events of some kinds per bucket of the console's charts, within tenants and operations (null: all). */
export const eventCounts = statement<ScopeValues & { kinds: readonly string[]; windowSeconds: number; stepSeconds: number }, { bucket: number; kind: string; n: number }>(
  "eventCounts",
  `SELECT (floor(extract(epoch FROM at) / :stepSeconds::int) * :stepSeconds::int)::float8 AS bucket, kind, count(*)::int AS n
     FROM idem_event
    WHERE at >= to_timestamp((${FIRST_BUCKET} * :stepSeconds::int)::float8) AND kind = ANY(:kinds)
      AND ${IN_SCOPE}
    GROUP BY 1, 2`,
  { bucket: true, kind: true, n: true },
);

/**
 * How many records were UNKNOWN, and for how long the oldest of them had
 * been, at the end of each bucket of the console's charts (now() for the
 * last one), within tenants and operations (null: all); `now` is now() in
 * epoch seconds. Rebuilt from the event log, whose events carry the state
 * each change left: a record's spell in UNKNOWN begins at an event leaving
 * it UNKNOWN after one that did not, and ends at its next event that leaves
 * it in another state. Only a recovery claim (RECOVERY_CLAIMED) or a
 * reconciliation (RECONCILED) takes a record out of UNKNOWN, so those and
 * the UNKNOWN ones are the only events read, one pass over the log.
 */
export const unknownSpells = statement<ScopeValues & { windowSeconds: number; stepSeconds: number }, { bucket: number; now: number; unknown: number; oldest: number }>(
  "unknownSpells",
  `WITH grid AS (
     SELECT (b * :stepSeconds::int)::float8 AS bucket, least(to_timestamp(((b + 1) * :stepSeconds::int)::float8), now()) AS sampled
       FROM generate_series(${FIRST_BUCKET}::bigint, ${LAST_BUCKET}::bigint) AS b
   ), marks AS (
     SELECT tenant_id, operation_id, event_id, at, state = 'UNKNOWN' AS unknown,
            lag(state = 'UNKNOWN') OVER (PARTITION BY tenant_id, operation_id ORDER BY event_id) AS was_unknown
       FROM idem_event
      WHERE (state = 'UNKNOWN' OR kind IN ('RECOVERY_CLAIMED', 'RECONCILED'))
        AND ${IN_SCOPE}
   ), spells AS (
     SELECT at AS since, lead(at) OVER (PARTITION BY tenant_id, operation_id ORDER BY event_id) AS until, unknown
       FROM marks WHERE unknown IS DISTINCT FROM was_unknown
   )
   SELECT g.bucket, extract(epoch FROM now())::float8 AS now, count(s.since)::int AS unknown,
          COALESCE(max(extract(epoch FROM g.sampled - s.since)), 0)::float8 AS oldest
     FROM grid g LEFT JOIN spells s ON s.unknown AND s.since <= g.sampled AND (s.until IS NULL OR s.until > g.sampled)
    GROUP BY g.bucket ORDER BY g.bucket`,
  { bucket: true, now: true, unknown: true, oldest: true },
);
