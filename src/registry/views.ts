import { refuse } from "../contract/errors.js";
import { pageSize } from "../contract/page-size.js";
import { ALL_TENANTS, bindingFor, type Db } from "./db.js";
import { isUuid } from "./ids.js";
import { toEvent, toView } from "./rows.js";
import { firstView, grantedRow, requireScope, requireTenant, validateRef, visibleTo } from "./shared.js";
import { pipelined } from "./statement.js";
import * as eventStatements from "./statements/events.js";
import * as jobStatements from "./statements/jobs.js";
import * as viewStatements from "./statements/views.js";
import type { RecordState } from "../contract/words.js";
import type { Actor, Census, EventCursor, LoggedEvent, OperationRef, RecordCursor, RecordFilter, RecordView, RecoverableCursor, ViewScope } from "./types.js";

/**
 * The registry's reads for recovery workers, operators and the operators'
 * console: listings of records, the census, the event log and its charts.
 * Each reads one snapshot without locks, and decides nothing. A read asked
 * for tenants or operations the actor is not granted is refused before
 * anything is read (requireScope); the rows a read returns are the actor's
 * (grantedRow).
 */

/**
 * Records a recovery worker should act on, by when their lease ended:
 * UNKNOWN ones, and unfinished ones whose lease ended (a released record
 * has no lease: its client's retry takes it over). `tenants` and
 * `operations` narrow the search (undefined: all).
 */
export async function listRecoverable(
  db: Db,
  filter: { tenants?: readonly string[]; operations?: readonly string[]; pageSize: number; after?: RecoverableCursor },
  actor: Actor,
): Promise<{ views: RecordView[]; next?: RecoverableCursor }> {
  requireScope(actor, filter);
  const size = pageSize(filter.pageSize);
  const views = await db.transaction(
    bindingFor(filter.tenants),
    async (q) =>
      (
        await viewStatements.recoverableViews.run(q, {
          ...scopeValues(filter),
          afterLeaseEnd: filter.after?.leaseEnd ?? null,
          afterTenant: filter.after?.tenant ?? null,
          afterOperationId: filter.after?.operationId ?? null,
          pageSize: size,
        })
      ).rows.map(toView),
    "list_recoverable",
  );
  const last = views.at(-1);
  return {
    views: views.filter((v) => grantedRow(actor, v.record.tenant, v.record.operation)),
    ...(last && views.length === size ? { next: { leaseEnd: last.leaseEndText, tenant: last.record.tenant, operationId: last.record.operationId } } : {}),
  };
}

/** Records by state, tenant, operation and age, oldest first, with a resumable cursor (operators). */
export async function listRecords(db: Db, filter: RecordFilter, actor: Actor): Promise<Array<RecordView & { createdAtText: string }>> {
  requireScope(actor, filter);
  return db.transaction(bindingFor(filter.tenants), async (q) =>
    (
      await viewStatements.listedViews.run(q, {
        ...scopeValues(filter),
        states: filter.states ?? null,
        olderThanMs: filter.olderThanMs ?? null,
        afterCreatedAt: filter.after?.createdAt ?? null,
        afterTenant: filter.after?.tenant ?? null,
        afterOperationId: filter.after?.operationId ?? null,
        pageSize: filter.pageSize,
      })
    ).rows.map(toView),
  );
}

/**
 * How many records are in each state, and the age of the oldest UNKNOWN
 * one: of every tenant (metrics), or of a scope (what an operator is shown).
 */
export async function census(db: Db, scope: ViewScope = {}): Promise<Census> {
  const { rows } = await db.transaction(bindingFor(scope.tenants), (q) => jobStatements.census.run(q, { tenants: scope.tenants ?? null, operations: scope.operations ?? null }));
  return {
    byState: new Map(rows.map((r) => [r.state, r.n])),
    oldestUnknownSeconds: Math.max(0, ...rows.map((r) => r.oldest_unknown ?? 0)),
    overdue: rows.reduce((sum, r) => sum + r.overdue, 0),
  };
}

/**
 * Up to `limit` events after a cursor (from the start when undefined),
 * optionally of one tenant or operation, in commit order: those the actor
 * may see, where the next read resumes (after the last event read, seen or
 * not), and whether the page was full (more may follow at once).
 */
export async function readEvents(
  db: Db,
  filter: { after?: EventCursor; limit: number; tenant?: string; operation?: string },
  actor: Actor,
): Promise<{ events: LoggedEvent[]; next?: EventCursor; full: boolean }> {
  if (filter.tenant) requireTenant(actor, filter.tenant);
  const { rows } = await db.transaction(filter.tenant ?? ALL_TENANTS, (q) =>
    eventStatements.eventsAfter.run(q, {
      afterTxid: filter.after?.txid ?? null,
      afterEventId: filter.after?.eventId ?? null,
      tenant: filter.tenant ?? null,
      operation: filter.operation ?? null,
      limit: filter.limit,
    }),
  );
  const read = rows.map((r) => ({ ...toEvent(r), cursor: { txid: r.txid_text, eventId: r.event_id_text } }));
  const last = read.at(-1);
  return {
    events: read.filter((event) => grantedRow(actor, event.tenant, event.operation)),
    ...(last ? { next: last.cursor } : {}),
    full: read.length === filter.limit,
  };
}

/**
 * The newest events of the given kinds within a scope, newest first (the
 * console's "recent conflicts"). The scope is applied before the limit, so
 * that other tenants' events never crowd a scope's own out.
 */
export async function recentEvents(db: Db, filter: ViewScope & { kinds: readonly string[]; limit: number }, actor: Actor): Promise<Array<Omit<LoggedEvent, "cursor">>> {
  requireScope(actor, filter);
  const { rows } = await db.transaction(bindingFor(filter.tenants), (q) =>
    eventStatements.recentEvents.run(q, { kinds: filter.kinds, tenants: filter.tenants ?? null, operations: filter.operations ?? null, limit: filter.limit }),
  );
  return rows.map(toEvent).filter((event) => grantedRow(actor, event.tenant, event.operation));
}

/**
 * Records by state, tenant and operation, newest first, resumed before a
 * record (the operators' console), and where the next page resumes when this
 * one is full.
 */
export async function newestRecords(
  db: Db,
  filter: ViewScope & { states?: readonly RecordState[]; pageSize: number; before?: RecordCursor },
  actor: Actor,
): Promise<{ views: RecordView[]; next?: RecordCursor }> {
  requireScope(actor, filter);
  const { rows } = await db.transaction(bindingFor(filter.tenants), (q) =>
    viewStatements.newestViews.run(q, {
      ...scopeValues(filter),
      states: filter.states ?? null,
      beforeCreatedAt: filter.before?.createdAt ?? null,
      beforeTenant: filter.before?.tenant ?? null,
      beforeOperationId: filter.before?.operationId ?? null,
      pageSize: filter.pageSize,
    }),
  );
  const views = rows.map(toView);
  const last = views.at(-1);
  return {
    views: views.filter((view) => grantedRow(actor, view.record.tenant, view.record.operation)),
    ...(last && views.length === filter.pageSize ? { next: { createdAt: last.createdAtText, tenant: last.record.tenant, operationId: last.record.operationId } } : {}),
  };
}

/** The records of an operation id within tenants (undefined: all), whose tenant need not be known (the operators' console). */
export async function recordsById(db: Db, operationId: string, tenants: readonly string[] | undefined, actor: Actor): Promise<RecordView[]> {
  requireScope(actor, { ...(tenants ? { tenants } : {}) });
  if (!isUuid(operationId)) refuse("INVALID_REQUEST", "an operation id is the UUID Reserve returned");
  const { rows } = await db.transaction(bindingFor(tenants), (q) => viewStatements.viewsByOperationId.run(q, { operationId, tenants: tenants ?? null }));
  return rows.map(toView).filter((view) => grantedRow(actor, view.record.tenant, view.record.operation));
}

/** UNKNOWN records, longest UNKNOWN first (the operators' console). */
export async function unknownQueue(db: Db, filter: ViewScope & { limit: number }, actor: Actor): Promise<RecordView[]> {
  requireScope(actor, filter);
  const { rows } = await db.transaction(bindingFor(filter.tenants), (q) => viewStatements.unknownViews.run(q, { ...scopeValues(filter), limit: filter.limit }));
  return rows.map(toView).filter((view) => grantedRow(actor, view.record.tenant, view.record.operation));
}

/**
 * A record, its attempts and its newest `limit` events (oldest first), read
 * in one snapshot, for an operator: the operators' console's record page.
 * The body stays as stored (sealed): the page shows none.
 */
export async function recordHistory(db: Db, ref: OperationRef, actor: Actor, limit: number): Promise<RecordView & { events: Array<Omit<LoggedEvent, "cursor">> }> {
  validateRef(ref);
  requireTenant(actor, ref.tenant);
  return db.transaction(ref.tenant, async (q) => {
    const [view, events] = await pipelined([firstView(viewStatements.viewById, q, ref), eventStatements.recordEvents.run(q, { ...ref, limit })] as const);
    return { ...visibleTo(view, undefined, actor), events: events.rows.map(toEvent).reverse() };
  });
}

/**
 * The event log over the last `windowSeconds`, in buckets of `stepSeconds`
 * (statements/events.ts): events of some kinds per bucket, and how many
 * records were UNKNOWN and the oldest one's age at the end of each, read in
 * one snapshot (the operators' console's charts).
 */
export async function eventSeries(
  db: Db,
  filter: ViewScope & { kinds: readonly string[]; windowSeconds: number; stepSeconds: number },
): Promise<{ counts: Array<{ bucket: number; kind: string; n: number }>; unknown: Array<{ bucket: number; now: number; unknown: number; oldest: number }> }> {
  const window = { ...scopeValues(filter), windowSeconds: filter.windowSeconds, stepSeconds: filter.stepSeconds };
  return db.transaction(bindingFor(filter.tenants), async (q) => {
    const [counts, unknown] = await pipelined([eventStatements.eventCounts.run(q, { ...window, kinds: filter.kinds }), eventStatements.unknownSpells.run(q, window)] as const);
    return { counts: counts.rows, unknown: unknown.rows };
  });
}

/** A view scope as statement values (null: all). */
function scopeValues(scope: ViewScope): { tenants: readonly string[] | null; operations: readonly string[] | null } {
  return { tenants: scope.tenants ?? null, operations: scope.operations ?? null };
}
