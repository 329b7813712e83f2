import { statement, type RowColumns } from "../statement.js";
import { ATTEMPT_ROW, IN_SCOPE, RECORD_COLUMNS, RECORD_ROW, type AttemptRow, type RecordRow, type ScopeValues } from "./parts.js";
import type { IdRef, ScopeRef } from "./records.js";

/**
 * An effect attempt as a view carries it, in JSON: its times as text, its
 * generation a number, and without its registration id.
 */
export interface ViewedAttempt extends Omit<AttemptRow, "registration_id" | "generation" | "created_at" | "resolved_at"> {
  generation: number;
  created_at: string;
  resolved_at: string | null;
}

const { registration_id: _notViewed, ...viewedColumns } = ATTEMPT_ROW;
const VIEWED_ATTEMPT: RowColumns<ViewedAttempt> = viewedColumns;

/**
 * A row of a view: the record's columns, `db_now`, the lease end and
 * creation time as PostgreSQL prints them (to the microsecond, for cursors:
 * a Date keeps milliseconds only), and its attempts.
 */
export interface ViewRow extends RecordRow {
  lease_end_text: string | null;
  created_at_text: string;
  attempts: ViewedAttempt[];
}

export const VIEW_ROW: RowColumns<ViewRow> = { ...RECORD_ROW, lease_end_text: true, created_at_text: true, attempts: true };

/**
 * Reads of records with their effect attempts, without locks: a consistent
 * snapshot is all a reader needs. Each row is a ViewRow, its attempts a
 * JSON array of ViewedAttempt, in attempt order.
 */
const VIEW = `SELECT ${RECORD_COLUMNS}, now() AS db_now, lease_expires_at::text AS lease_end_text, created_at::text AS created_at_text,
       COALESCE((SELECT json_agg(json_build_object(${Object.keys(VIEWED_ATTEMPT)
         .map((column) => `'${column}', a.${column}`)
         .join(", ")}) ORDER BY a.attempt_number)
                   FROM idem_effect_attempt a
                  WHERE a.tenant_id = r.tenant_id AND a.operation_id = r.operation_id), '[]'::json) AS attempts
  FROM idem_record r`;

/** One record by operation id. */
export const viewById = statement<IdRef, ViewRow>("viewById", `${VIEW} WHERE tenant_id = :tenant AND operation_id = :operationId`, VIEW_ROW);

/** One record by scope. */
export const viewByScope = statement<ScopeRef, ViewRow>("viewByScope", `${VIEW} WHERE tenant_id = :tenant AND scope = :scope`, VIEW_ROW);

/**
 * What a recovery worker should act on, by when the lease ended: UNKNOWN
 * records, and unfinished ones whose lease ended (a released record has no
 * lease: its client's retry takes it over). `tenants` and `operations`
 * narrow the search (null: all).
 */
export const recoverableViews = statement<
  ScopeValues & {
    afterLeaseEnd: string | null;
    afterTenant: string | null;
    afterOperationId: string | null;
    pageSize: number;
  },
  ViewRow
>(
  "recoverableViews",
  `${VIEW}
   WHERE state IN ('RESERVED', 'EXECUTING', 'UNKNOWN') AND lease_expires_at <= now()
     AND ${IN_SCOPE}
     AND (:afterLeaseEnd::timestamptz IS NULL OR (lease_expires_at, tenant_id, operation_id) > (:afterLeaseEnd, :afterTenant, :afterOperationId::uuid))
   ORDER BY lease_expires_at, tenant_id, operation_id LIMIT :pageSize`,
  VIEW_ROW,
);

/** A listing by state (null: any) within a scope, a page at a time. */
type ByState = ScopeValues & { states: readonly string[] | null; pageSize: number };

/** An operator's listing: by state, tenant, operation and age (null: any), oldest first. */
export const listedViews = statement<ByState & { olderThanMs: number | null; afterCreatedAt: string | null; afterTenant: string | null; afterOperationId: string | null }, ViewRow>(
  "listedViews",
  `${VIEW}
   WHERE (:states::text[] IS NULL OR state = ANY(:states))
     AND ${IN_SCOPE}
     AND (:olderThanMs::bigint IS NULL OR created_at <= now() - make_interval(secs => :olderThanMs::double precision / 1000))
     AND (:afterCreatedAt::timestamptz IS NULL OR (created_at, tenant_id, operation_id) > (:afterCreatedAt, :afterTenant, :afterOperationId::uuid))
   ORDER BY created_at, tenant_id, operation_id LIMIT :pageSize`,
  VIEW_ROW,
);

/** The console's listing by state: newest first, resumed before a record (null: from the newest). */
export const newestViews = statement<ByState & { beforeCreatedAt: string | null; beforeTenant: string | null; beforeOperationId: string | null }, ViewRow>(
  "newestViews",
  `${VIEW}
   WHERE (:states::text[] IS NULL OR state = ANY(:states))
     AND ${IN_SCOPE}
     AND (:beforeCreatedAt::timestamptz IS NULL OR (created_at, tenant_id, operation_id) < (:beforeCreatedAt, :beforeTenant, :beforeOperationId::uuid))
   ORDER BY created_at DESC, tenant_id DESC, operation_id DESC LIMIT :pageSize`,
  VIEW_ROW,
);

/** The console's search by operation id, within tenants (null: all): the tenant need not be known. */
export const viewsByOperationId = statement<{ operationId: string; tenants: readonly string[] | null }, ViewRow>(
  "viewsByOperationId",
  `${VIEW} WHERE operation_id = :operationId::uuid AND (:tenants::text[] IS NULL OR tenant_id = ANY(:tenants)) ORDER BY tenant_id`,
  VIEW_ROW,
);

/**
 * The UNKNOWN queue, longest UNKNOWN first: nothing changes an UNKNOWN
 * record but what settles it, so its updated_at is when it became UNKNOWN
 * (as census counts its age).
 */
export const unknownViews = statement<ScopeValues & { limit: number }, ViewRow>(
  "unknownViews",
  `${VIEW}
   WHERE state = 'UNKNOWN' AND ${IN_SCOPE}
   ORDER BY updated_at, tenant_id, operation_id LIMIT :limit`,
  VIEW_ROW,
);
