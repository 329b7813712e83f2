import { statement } from "../statement.js";

/** The event log (idem_event): appended by the statements that change records, read by operators. */

/** An event about a record that changes nothing (a logged conflict, a record seen going UNKNOWN before it is claimed). */
export const appendEvent = statement<{
  tenant: string;
  operationId: string;
  operation: string;
  apiRevision: number;
  kind: string;
  generation: number;
  state: string;
  caller: string;
  eventDetail: string;
}>(
  "appendEvent",
  `INSERT INTO idem_event (tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail)
   VALUES (:tenant, :operationId, :operation, :apiRevision, :kind, :generation, :state, :caller, :eventDetail::jsonb)`,
);

const EVENT_COLUMNS = `event_id::text AS event_id_text, tenant_id, operation_id, operation, api_revision, kind, generation, state, caller, detail, at`;

/**
 * Events after a cursor (null: from the start), of a tenant or operation
 * (null: any). Only events of transactions that have ended are read, in
 * (transaction, event) order: an event committed late by a slow transaction
 * still comes after the cursor, never before it (migrations/000005).
 */
export const eventsAfter = statement<{ afterTxid: string | null; afterEventId: string | null; tenant: string | null; operation: string | null; limit: number }>(
  "eventsAfter",
  `SELECT txid::text AS txid_text, ${EVENT_COLUMNS}
     FROM idem_event
    WHERE (:afterTxid::xid8 IS NULL OR (txid, event_id) > (:afterTxid::xid8, :afterEventId::bigint))
      AND txid < pg_snapshot_xmin(pg_current_snapshot())
      AND (:tenant::text IS NULL OR tenant_id = :tenant) AND (:operation::text IS NULL OR operation = :operation)
    ORDER BY txid, event_id LIMIT :limit`,
);

/** The newest events of some kinds within tenants and operations (null: all), newest first; the scope applies before the limit. */
export const recentEvents = statement<{ kinds: readonly string[]; tenants: readonly string[] | null; operations: readonly string[] | null; limit: number }>(
  "recentEvents",
  `SELECT ${EVENT_COLUMNS}
     FROM idem_event
    WHERE kind = ANY(:kinds) AND (:tenants::text[] IS NULL OR tenant_id = ANY(:tenants)) AND (:operations::text[] IS NULL OR operation = ANY(:operations))
    ORDER BY at DESC, event_id DESC LIMIT :limit`,
);
