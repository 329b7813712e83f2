import { type ScopeInput, scopeDigest, validateApiRevision, validateOperationName, validateSubject } from "../../contract/scope.js";
import { opened, type RegistryContext } from "../context.js";
import type { Db } from "../db.js";
import { firstView, requireTenant, validateRef, visibleTo } from "../shared.js";
import * as recordStatements from "../statements/records.js";
import * as viewStatements from "../statements/views.js";
import type { Actor, LookupByIdInput, RecordView, StoredRecord } from "../types.js";

/**
 * Reads of one record: by operation id or by scope (Lookup), and the recheck
 * of a waiting Reserve.
 */

/**
 * Reads a record by id. Without the operator role, the subject must be the
 * record's: another principal's record is NOT_FOUND, exactly like a missing
 * one, so that lookups are no existence oracle.
 */
export async function lookupById(context: RegistryContext, db: Db, { ref, principal }: LookupByIdInput, actor: Actor): Promise<RecordView> {
  validateRef(ref);
  requireTenant(actor, ref.tenant);
  const view = await db.transaction(ref.tenant, (q) => firstView(viewStatements.viewById, q, ref), "lookup");
  return opened(context, visibleTo(view, principal, actor));
}

/** Reads the record a request with this scope would meet. */
export async function lookupByScope(context: RegistryContext, db: Db, input: ScopeInput, actor: Actor): Promise<RecordView> {
  const subject = validateSubject(input.subject);
  validateOperationName(input.operation);
  validateApiRevision(input.apiRevision);
  requireTenant(actor, subject.tenant);
  const view = await db.transaction(subject.tenant, (q) => firstView(viewStatements.viewByScope, q, { tenant: subject.tenant, scope: Buffer.from(scopeDigest(input)) }), "lookup");
  return opened(context, visibleTo(view, subject.principal, actor));
}

/**
 * Whether the record a waiting Reserve's decision read has moved on since
 * (see statements ownerMoved): only then is deciding again worth a locked
 * decision. A record no longer there has moved.
 */
export async function ownerMoved(db: Db, record: StoredRecord): Promise<boolean> {
  const { rows } = await db.transaction(
    record.tenant,
    (q) => recordStatements.ownerMoved.run(q, { tenant: record.tenant, operationId: record.operationId, state: record.state, generation: record.generation }),
    "recheck",
  );
  return rows[0]?.moved ?? true;
}
