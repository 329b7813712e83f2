import type pg from "pg";
import { refuse } from "../contract/errors.js";
import { validateText } from "../contract/scope.js";
import type { OperationPolicy } from "../policy/operations.js";
import type { Queryable } from "./db.js";
import { isUuid } from "./ids.js";
import { toAttempt, toRecord, toView } from "./rows.js";
import { pipelined, type Statement } from "./statement.js";
import * as attemptStatements from "./statements/attempts.js";
import * as eventStatements from "./statements/events.js";
import type { RecordRow } from "./statements/parts.js";
import * as recordStatements from "./statements/records.js";
import type { ViewRow } from "./statements/views.js";
import type { Actor, OperationRef, RecordView, StoredAttempt, StoredRecord, ViewScope } from "./types.js";

/**
 * What the registry's commands and reads share: the checks of a reference
 * and of a caller's grants, the lease to grant, a record's lock, a fenced
 * change of a locked record, and the statements' first rows as the
 * registry's types.
 */

export function refuseNotFound(): never {
  refuse("NOT_FOUND", "no such operation for this subject");
}

export function requireTenant(actor: Actor, tenant: string): void {
  if (!actor.mayUseTenant(tenant)) refuse("PERMISSION_DENIED", `this caller is not granted tenant ${tenant}`);
}

export function requireOperation(actor: Actor, operation: string): void {
  if (!actor.mayOperate(operation)) refuse("PERMISSION_DENIED", `this caller is not granted operation ${operation}`);
}

/** Refuses a read asked for tenants or operations the actor is not granted, before anything is read. */
export function requireScope(actor: Actor, scope: ViewScope): void {
  for (const tenant of scope.tenants ?? []) requireTenant(actor, tenant);
  for (const operation of scope.operations ?? []) requireOperation(actor, operation);
}

/**
 * Whether the actor may see a row of a read: of a granted tenant (or of an
 * operation as a whole, tenant "") and of a granted operation (or of none).
 * Reads narrow their statements to the actor's grant before any limit, so
 * that other tenants' rows never crowd its own out; each row is checked
 * again here.
 */
export function grantedRow(actor: Actor, tenant: string, operation: string | null): boolean {
  return (tenant === "" || actor.mayUseTenant(tenant)) && (!operation || actor.mayOperate(operation));
}

export function validateRef(ref: OperationRef): void {
  validateText(ref.tenant, "ref.tenant", 128);
  if (!isUuid(ref.operationId)) refuse("INVALID_REQUEST", "ref.operation_id must be the operation id Reserve returned");
}

/**
 * A view as the actor may see it: without the operator role, the subject
 * must be the record's, and another principal's record is NOT_FOUND, exactly
 * like a missing one, so that reads are no existence oracle.
 */
export function visibleTo(view: RecordView | undefined, principal: string | undefined, actor: Actor): RecordView {
  if (!view || !actor.mayOperate(view.record.operation)) refuseNotFound();
  if (!actor.isOperator && view.record.principal !== principal) refuseNotFound();
  return view;
}

/** The lease to grant: the policy's default when none is asked, never above its maximum, never under a second. */
export function grantLease(policy: OperationPolicy, requestedMs: number | undefined): number {
  if (requestedMs === undefined || requestedMs <= 0) return policy.lease.defaultMs;
  return Math.min(Math.max(requestedMs, 1000), policy.lease.maxMs);
}

/** The one record a statement returns, or undefined. */
export async function firstRecord<Values extends object>(statement: Statement<Values, RecordRow>, q: Queryable, values: Values): Promise<StoredRecord | undefined> {
  const { rows } = await statement.run(q, values);
  return rows[0] ? toRecord(rows[0]) : undefined;
}

/** The one view a statement returns, or undefined. */
export async function firstView<Values extends object>(statement: Statement<Values, ViewRow>, q: Queryable, values: Values): Promise<RecordView | undefined> {
  const { rows } = await statement.run(q, values);
  return rows[0] ? toView(rows[0]) : undefined;
}

/** Locks the record for the rest of the transaction, or NOT_FOUND. */
export async function lockRecord(q: Queryable, ref: OperationRef, actor: Actor): Promise<StoredRecord> {
  requireTenant(actor, ref.tenant);
  const record = await firstRecord(recordStatements.lockRecord, q, ref);
  if (!record || !actor.mayOperate(record.operation)) refuseNotFound();
  return record;
}

/**
 * Locks the record and reads its effect attempts in one round trip: the read
 * is pipelined behind the lock, and PostgreSQL runs it once the lock is held,
 * so it sees the attempts as they stand under the lock.
 */
export async function lockWithAttempts(q: Queryable, ref: OperationRef, actor: Actor): Promise<{ record: StoredRecord; attempts: StoredAttempt[] }> {
  requireTenant(actor, ref.tenant);
  const [record, attempts] = await pipelined<[StoredRecord, StoredAttempt[]]>([
    lockRecord(q, ref, actor),
    attemptStatements.loadAttempts.run(q, ref).then(({ rows }) => rows.map(toAttempt)),
  ]);
  return { record, attempts };
}

/** Who changes a record, and what the event says of it. */
export interface ChangeFacts {
  caller: string;
  detail?: Record<string, unknown>;
}

/**
 * Changes a record this transaction has locked with one of the fenced
 * statements of statements/records.ts, which logs its event. Exactly one row
 * must change: the lock is held, so anything else is a bug, never a race.
 */
export async function changeLocked<Values extends object>(
  q: Queryable,
  statement: Statement<recordStatements.IdRef & recordStatements.ChangedBy & { generation: number } & Values, RecordRow>,
  record: StoredRecord,
  facts: ChangeFacts,
  values: Values,
): Promise<StoredRecord> {
  const change = lockedChange(statement, record, facts, values);
  return change.changed(await change.send(q));
}

/** changeLocked in two steps: the statement to send (alone, or with COMMIT), and the changed record from its result. */
export function lockedChange<Values extends object>(
  statement: Statement<recordStatements.IdRef & recordStatements.ChangedBy & { generation: number } & Values, RecordRow>,
  record: StoredRecord,
  facts: ChangeFacts,
  values: Values,
): { send: (q: Queryable) => Promise<pg.QueryResult<RecordRow>>; changed: (result: pg.QueryResult<RecordRow>) => StoredRecord } {
  return {
    send: (q) =>
      statement.run(q, {
        ...values,
        tenant: record.tenant,
        operationId: record.operationId,
        generation: record.generation,
        caller: facts.caller,
        eventDetail: JSON.stringify(facts.detail ?? {}),
      }),
    changed({ rows }) {
      if (rows.length !== 1) {
        throw new Error(`${statement.name} of ${record.operationId} at generation ${record.generation} changed ${rows.length} rows`);
      }
      return toRecord(rows[0]!);
    },
  };
}

/** An event about a record that changes nothing (a conflict, a record seen going UNKNOWN before its recovery claim). */
export async function appendEvent(q: Queryable, record: StoredRecord, event: ChangeFacts & { kind: string; state: string }): Promise<void> {
  await eventStatements.appendEvent.run(q, {
    tenant: record.tenant,
    operationId: record.operationId,
    operation: record.operation,
    apiRevision: record.apiRevision,
    kind: event.kind,
    generation: record.generation,
    state: event.state,
    caller: event.caller,
    eventDetail: JSON.stringify(event.detail ?? {}),
  });
}
