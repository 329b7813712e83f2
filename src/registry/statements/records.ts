import { statement } from "../statement.js";
import {
  countClosed,
  countOpened,
  INSERTED_ROW,
  logChanges,
  nowPlusMs,
  RECORD_COLUMNS,
  RECORD_ROW,
  FINISHED_STATES,
  UNFINISHED,
  type InsertedRow,
  type RecordRow,
} from "./parts.js";

/**
 * The statements that decide and change one record (idem_record), each with
 * its event. Every change after Reserve is fenced in its WHERE clause by the
 * generation that was read (and, for the ones decided without a lock, by the
 * state and lease that made the decision), so that of racing writers exactly
 * one matches: READ COMMITTED re-checks the WHERE clause on the latest row
 * version after waiting for a concurrent writer.
 */

/** Who changes a record, and the event's detail (jsonb text). */
export interface ChangedBy {
  caller: string;
  eventDetail: string;
}

/** A record found by its scope. */
export interface ScopeRef {
  tenant: string;
  scope: Buffer;
}

/** A record found by its operation id. */
export interface IdRef {
  tenant: string;
  operationId: string;
}

/** What a new or renewed ownership sets. */
export interface Ownership {
  state: "RESERVED" | "EXECUTING";
  leaseMs: number;
  acquisitionId: string;
  writerEpoch: number;
}

/** A record Reserve makes: its scope and operation, the fingerprint it answers to, and its first ownership. */
export interface NewRecord extends Ownership {
  scope: Buffer;
  operationId: string;
  principal: string;
  operation: string;
  apiRevision: number;
  schemaRevision: number;
  fingerprint: Buffer;
}

/**
 * Reserve's guarded insert: `INSERT … ON CONFLICT DO NOTHING` decides "new or
 * not" and takes the place in one step (a concurrent insert of the same scope
 * waits for this one and then conflicts). Returns the new record (`inserted`
 * true) or the one already there, as this statement's snapshot shows it:
 * nothing when that record was committed after the snapshot was taken. A
 * new record is logged and counted against its principal's quota (`quota`)
 * by the same statement, which fails with IDQ01 over it.
 */
export const insertOrFind = statement<NewRecord & { tenant: string; caller: string; quota: number }, InsertedRow>(
  "insertOrFind",
  `WITH inserted AS (
     INSERT INTO idem_record (tenant_id, scope, operation_id, principal, operation, api_revision, schema_revision,
                              fingerprint, state, generation, lease_expires_at, acquisition_id, writer_epoch)
     VALUES (:tenant, :scope, :operationId, :principal, :operation, :apiRevision, :schemaRevision,
             :fingerprint, :state, 1, ${nowPlusMs(":leaseMs")}, :acquisitionId, :writerEpoch)
     ON CONFLICT (tenant_id, scope) DO NOTHING
     RETURNING ${RECORD_COLUMNS}
   ), ${logChanges("inserted", "'ACCEPTED'")}, ${countOpened("inserted", ":quota")}
   SELECT true AS inserted, ${RECORD_COLUMNS}, now() AS db_now FROM inserted
   UNION ALL
   SELECT false, ${RECORD_COLUMNS}, now() FROM idem_record WHERE tenant_id = :tenant AND scope = :scope`,
  INSERTED_ROW,
);

/** The record of a scope, as a new statement's snapshot shows it. */
export const findByScope = statement<ScopeRef, RecordRow>(
  "findByScope",
  `SELECT ${RECORD_COLUMNS}, now() AS db_now FROM idem_record WHERE tenant_id = :tenant AND scope = :scope`,
  RECORD_ROW,
);

/**
 * Locks one record for the rest of the transaction. FOR UPDATE serializes
 * every write to one record; the connection's lock_timeout bounds the wait, so
 * that a stuck writer turns into REGISTRY_BUSY instead of a pile-up.
 */
export const lockRecord = statement<IdRef, RecordRow>(
  "lockRecord",
  `SELECT ${RECORD_COLUMNS}, now() AS db_now FROM idem_record WHERE tenant_id = :tenant AND operation_id = :operationId FOR UPDATE`,
  RECORD_ROW,
);

/**
 * Whether a record a Reserve waits on has moved on from what its decision
 * read: another state or generation, or no live lease. Read without a lock,
 * so that a waiter's rechecks never make the owner's next write wait.
 */
export const ownerMoved = statement<IdRef & { state: string; generation: number }, { moved: boolean }>(
  "ownerMoved",
  `SELECT (state <> :state OR generation <> :generation OR lease_expires_at IS NULL OR lease_expires_at <= now()) AS moved
     FROM idem_record WHERE tenant_id = :tenant AND operation_id = :operationId`,
  { moved: true },
);

/**
 * Reserve's takeover as one compare-and-set: only from the generation that
 * was read, only with the lease ended, no possible effect, and never on a
 * record that has been UNKNOWN.
 */
export const takeOverByScope = statement<ScopeRef & Ownership & { generation: number; caller: string }, RecordRow>(
  "takeOverByScope",
  `WITH taken AS (
     UPDATE idem_record
        SET generation = generation + 1, state = :state, recovering = false, lease_expires_at = ${nowPlusMs(":leaseMs")},
            acquisition_id = :acquisitionId, writer_epoch = :writerEpoch, updated_at = now()
      WHERE tenant_id = :tenant AND scope = :scope AND generation = :generation
        AND state IN ('RESERVED', 'EXECUTING') AND NOT effect_possible AND NOT went_unknown
        AND (lease_expires_at IS NULL OR lease_expires_at <= now())
      RETURNING ${RECORD_COLUMNS}
   ), ${logChanges("taken", "'TAKEOVER'")}
   SELECT ${RECORD_COLUMNS}, now() AS db_now FROM taken`,
  RECORD_ROW,
);

/**
 * A reusable tombstone becomes a new operation in place (new operation id,
 * fingerprint and revision; the generation still grows), fenced like a
 * takeover on the generation that was read: of racing reservations, one wins.
 * Unfinished again, it counts against its principal's quota like a new record.
 */
export const recycleByScope = statement<
  ScopeRef & Ownership & { generation: number; operationId: string; schemaRevision: number; fingerprint: Buffer; previousOperationId: string; caller: string; quota: number },
  RecordRow
>(
  "recycleByScope",
  `WITH recycled AS (
     UPDATE idem_record
        SET operation_id = :operationId, schema_revision = :schemaRevision, fingerprint = :fingerprint, state = :state,
            generation = generation + 1, recovering = false, lease_expires_at = ${nowPlusMs(":leaseMs")},
            acquisition_id = :acquisitionId, writer_epoch = :writerEpoch, effect_possible = false, went_unknown = false,
            snapshot_status = NULL, snapshot_media_type = NULL, snapshot_location = NULL, snapshot_business_version = NULL,
            snapshot_headers = NULL, snapshot_body = NULL, snapshot_digest = NULL, snapshot_key_id = NULL,
            created_at = now(), updated_at = now(), completed_at = NULL, retain_until = NULL, tombstoned_at = NULL
      WHERE tenant_id = :tenant AND scope = :scope AND generation = :generation AND tombstoned_at IS NOT NULL
        AND state IN ${FINISHED_STATES}
      RETURNING ${RECORD_COLUMNS}
   ), ${logChanges("recycled", "'RECYCLED'", "json_build_object('previous_operation_id', :previousOperationId::text)")},
   ${countOpened("recycled", ":quota")}
   SELECT ${RECORD_COLUMNS}, now() AS db_now FROM recycled`,
  RECORD_ROW,
);

/**
 * An owner's ended lease with a possible effect (or of a record that has been
 * UNKNOWN before, held by recovery): UNKNOWN at the same generation (the
 * owner may still complete), never executed again.
 */
export const markUnknownByScope = statement<ScopeRef & { generation: number; caller: string }, RecordRow>(
  "markUnknownByScope",
  `WITH marked AS (
     UPDATE idem_record SET state = 'UNKNOWN', recovering = false, went_unknown = true, updated_at = now()
      WHERE tenant_id = :tenant AND scope = :scope AND generation = :generation AND state = 'EXECUTING'
        AND (effect_possible OR went_unknown) AND lease_expires_at <= now()
      RETURNING ${RECORD_COLUMNS}
   ), ${logChanges("marked", "'UNKNOWN'")}
   SELECT ${RECORD_COLUMNS}, now() AS db_now FROM marked`,
  RECORD_ROW,
);

/**
 * A change of a record this transaction has locked, fenced once more by the
 * generation it was read at, with its event: `set` is the SET list (named
 * parameters of its own), `kind` the event's kind. `finishes`: the change
 * finishes an unfinished record (only such a record matches), which leaves
 * its principal's quota count. `guard`: more conditions the record must
 * meet (named parameters of its own).
 */
function fencedUpdate<Values extends object>(name: string, kind: string, set: string, finishes = false, guard?: string) {
  return statement<IdRef & ChangedBy & { generation: number } & Values, RecordRow>(
    name,
    `WITH updated AS (
       UPDATE idem_record SET ${set}, updated_at = now()
        WHERE tenant_id = :tenant AND operation_id = :operationId AND generation = :generation${finishes ? ` AND ${UNFINISHED}` : ""}${guard ? ` AND ${guard}` : ""}
        RETURNING ${RECORD_COLUMNS}
     ), ${logChanges("updated", `'${kind}'`, ":eventDetail::jsonb")}${finishes ? `, ${countClosed("updated")}` : ""}
     SELECT ${RECORD_COLUMNS}, now() AS db_now FROM updated`,
    RECORD_ROW,
  );
}

/** Claim OWNER: the holder of a reservation starts executing, with a lease. */
export const claimOwnership = fencedUpdate<{ leaseMs: number }>("claimOwnership", "CLAIMED", `state = 'EXECUTING', lease_expires_at = ${nowPlusMs(":leaseMs")}`);

/** A new lease for the generation that holds the record (RenewLease, or Claim OWNER again); the state stays. */
export const renewLease = fencedUpdate<{ leaseMs: number }>("renewLease", "LEASE_RENEWED", `lease_expires_at = ${nowPlusMs(":leaseMs")}`);

/** Claim TAKEOVER: the next generation executes a record whose lease ended without any possible effect. */
export const claimTakeover = fencedUpdate<{ leaseMs: number; acquisitionId: string; writerEpoch: number }>(
  "claimTakeover",
  "TAKEOVER",
  `generation = generation + 1, state = 'EXECUTING', recovering = false, lease_expires_at = ${nowPlusMs(":leaseMs")},
   acquisition_id = :acquisitionId, writer_epoch = :writerEpoch`,
);

/** Claim RECOVER: the next generation owns an UNKNOWN record for recovery only. */
export const claimRecovery = fencedUpdate<{ leaseMs: number; acquisitionId: string; writerEpoch: number }>(
  "claimRecovery",
  "RECOVERY_CLAIMED",
  `generation = generation + 1, state = 'EXECUTING', recovering = true, went_unknown = true, lease_expires_at = ${nowPlusMs(":leaseMs")},
   acquisition_id = :acquisitionId, writer_epoch = :writerEpoch`,
);

/** An attempt was registered: an effect is possible from now on. */
export const markEffectPossible = fencedUpdate("markEffectPossible", "EFFECT_RECORDED", "effect_possible = true");

/** An attempt was resolved: whether an effect is possible, as all the attempts now say. */
export const setEffectPossible = fencedUpdate<{ effectPossible: boolean }>("setEffectPossible", "EFFECT_RESOLVED", "effect_possible = :effectPossible");

/** The stored response of a finished operation, as its columns hold it (the body sealed or not). */
export interface SnapshotColumns {
  outcome: string;
  keepMs: number;
  snapshotStatus: number;
  snapshotMediaType: string;
  snapshotLocation: string;
  snapshotBusinessVersion: string;
  snapshotHeaders: string;
  snapshotBody: Buffer;
  snapshotDigest: Buffer;
  snapshotKeyId: string | null;
}

/**
 * What finishing a record sets, from one SQL expression per SnapshotColumns
 * value: named parameters for one record, or the columns of a batch's rows
 * (statements/batches.ts).
 */
export function finishAssignments(value: { [K in keyof SnapshotColumns]: string }): string {
  return `state = ${value.outcome}, recovering = false, lease_expires_at = NULL, completed_at = now(),
   retain_until = ${nowPlusMs(value.keepMs)}, snapshot_status = ${value.snapshotStatus}, snapshot_media_type = ${value.snapshotMediaType},
   snapshot_location = ${value.snapshotLocation}, snapshot_business_version = ${value.snapshotBusinessVersion},
   snapshot_headers = ${value.snapshotHeaders}::jsonb, snapshot_body = ${value.snapshotBody}, snapshot_digest = ${value.snapshotDigest},
   snapshot_key_id = ${value.snapshotKeyId}`;
}

const FINISH = finishAssignments({
  outcome: ":outcome",
  keepMs: ":keepMs",
  snapshotStatus: ":snapshotStatus",
  snapshotMediaType: ":snapshotMediaType",
  snapshotLocation: ":snapshotLocation",
  snapshotBusinessVersion: ":snapshotBusinessVersion",
  snapshotHeaders: ":snapshotHeaders",
  snapshotBody: ":snapshotBody",
  snapshotDigest: ":snapshotDigest",
  snapshotKeyId: ":snapshotKeyId",
});

/** Complete: the terminal state and the response to replay. */
export const finish = fencedUpdate<SnapshotColumns>("finish", "COMPLETED", FINISH, true);

/**
 * Complete sent before its record is read (commands/complete.ts): `finish`,
 * matching only a record that the rules would let this Complete finish as
 * it stands, so that the decision is made by this WHERE clause instead of
 * after the read. It is narrower than the rules (planComplete): the record
 * of the policy revision the snapshot columns were computed for, EXECUTING
 * (or RESERVED for REJECTED), no effect possible for REJECTED, and no
 * attempt PENDING or INDETERMINATE at all, where the rules look at each
 * effect's latest. What it does not match is decided by the rules on the
 * locking read sent before it. That read holds the lock every writer of the
 * record and of its attempts takes, so that this statement, which runs after
 * it in the same transaction, sees the same record and attempts.
 */
export const finishReady = fencedUpdate<SnapshotColumns & { operation: string; apiRevision: number; schemaRevision: number }>(
  "finishReady",
  "COMPLETED",
  FINISH,
  true,
  `operation = :operation AND api_revision = :apiRevision AND schema_revision = :schemaRevision
   AND (state = 'EXECUTING' OR (state = 'RESERVED' AND :outcome = 'REJECTED'))
   AND (:outcome <> 'REJECTED' OR NOT effect_possible)
   AND NOT EXISTS (SELECT FROM idem_effect_attempt a
                    WHERE a.tenant_id = :tenant AND a.operation_id = :operationId AND a.status IN ('PENDING', 'INDETERMINATE'))`,
);

/**
 * Reconcile: an operator's terminal state for an UNKNOWN record, at the next
 * generation so that a late owner is fenced out, taken by this call's
 * acquisition id (so that a re-run after a lost COMMIT recognizes it).
 */
export const reconcile = fencedUpdate<SnapshotColumns & { acquisitionId: string }>(
  "reconcile",
  "RECONCILED",
  `${FINISH}, generation = generation + 1, acquisition_id = :acquisitionId`,
  true,
);

/**
 * Reconcile with `reopen`: an operator's evidence shows nothing happened
 * downstream, so the record goes back to RESERVED without a lease, as if
 * released, at the next generation (a late owner is fenced out) and no
 * longer under recovery's rules: the next identical retry executes it afresh.
 * Its attempts were resolved NO_EFFECT by the same transaction
 * (attempts.ts resolveOpenAttempts).
 */
export const reopen = fencedUpdate<{ acquisitionId: string }>(
  "reopen",
  "REOPENED",
  `state = 'RESERVED', recovering = false, went_unknown = false, effect_possible = false, lease_expires_at = NULL,
   generation = generation + 1, acquisition_id = :acquisitionId`,
);

/** Release (or Abandon with nothing possible): back to RESERVED without a lease; the next identical retry takes it over. */
export const release = fencedUpdate("release", "RELEASED", "state = 'RESERVED', recovering = false, lease_expires_at = NULL");

/** Abandon with a possible effect: UNKNOWN now, its lease ended, so that recovery lists it at once. */
export const handToRecovery = fencedUpdate("handToRecovery", "UNKNOWN", "state = 'UNKNOWN', recovering = false, went_unknown = true, lease_expires_at = now()");
