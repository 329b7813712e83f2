import { randomUUID } from "node:crypto";
import { refuse } from "../../contract/errors.js";
import { validateText } from "../../contract/scope.js";
import { storedSnapshot } from "../../contract/snapshot.js";
import { policyOf, snapshotColumns, type RegistryContext } from "../context.js";
import type { Db } from "../db.js";
import { toAttempt } from "../rows.js";
import { changeLocked, lockWithAttempts, validateRef } from "../shared.js";
import * as attemptStatements from "../statements/attempts.js";
import * as recordStatements from "../statements/records.js";
import type { Actor, ReconcileInput, StoredRecord } from "../types.js";

/**
 * Reconcile: an operator settles an UNKNOWN record with evidence from
 * outside, or reopens it.
 */

/**
 * An operator settles an UNKNOWN record with evidence from outside (the
 * provider's dashboard, a bank statement): it becomes SUCCEEDED or
 * FAILED_FINAL with the snapshot to replay, at the next generation so that a
 * late owner is fenced out. Or, when the evidence shows that nothing
 * happened downstream (`reopen`), it goes back to RESERVED, its open
 * attempts resolved NO_EFFECT, so that the next identical retry runs it
 * afresh: the only way a record that has been UNKNOWN runs again. Refused
 * from any other state, never REJECTED (an effect may have happened), and
 * never reopened once an attempt is CONFIRMED.
 */
export async function reconcile(context: RegistryContext, db: Db, input: ReconcileInput, actor: Actor): Promise<StoredRecord> {
  validateRef(input.ref);
  validateText(input.evidence, "evidence", 4096);
  validateText(input.operatorName, "operator", 256);
  if (!input.reopen && input.outcome !== "SUCCEEDED" && input.outcome !== "FAILED_FINAL") {
    refuse("INVALID_REQUEST", "outcome must be SUCCEEDED or FAILED_FINAL: an UNKNOWN record may have had an effect, so it is never REJECTED");
  }
  // Minted once, outside the retried work: a re-run after a lost COMMIT recognizes its own reconciliation.
  const acquisitionId = randomUUID();
  return db.transaction(
    input.ref.tenant,
    async (q) => {
      const { record, attempts } = await lockWithAttempts(q, input.ref, actor);
      if (record.acquisitionId === acquisitionId) return record;
      if (record.state !== "UNKNOWN") {
        refuse("INVALID_TRANSITION", `only UNKNOWN records are reconciled; this one is ${record.state}${record.recovering ? " (a recovery worker holds it)" : ""}`, {
          state: record.state,
        });
      }
      const by = { caller: actor.caller, detail: { evidence: input.evidence, operator: input.operatorName } };
      if (input.reopen) {
        const confirmed = attempts.find((a) => a.status === "CONFIRMED");
        if (confirmed) {
          refuse(
            "EFFECT_POSSIBLE",
            `attempt ${confirmed.attemptNumber} (${confirmed.effect}) is CONFIRMED: the effect happened, so the operation cannot run again; reconcile it as SUCCEEDED or FAILED_FINAL`,
          );
        }
        const resolved = await attemptStatements.resolveOpenAttempts.run(q, input.ref);
        const detail = { ...by.detail, reopened: true, resolvedNoEffect: resolved.rows.map((row) => toAttempt(row).attemptNumber) };
        return changeLocked(q, recordStatements.reopen, record, { ...by, detail }, { acquisitionId });
      }
      const policy = await policyOf(context, record);
      const snapshot = storedSnapshot(input.snapshot, policy.snapshot);
      return changeLocked(
        q,
        recordStatements.reconcile,
        record,
        { ...by, detail: { ...by.detail, outcome: input.outcome } },
        { outcome: input.outcome, keepMs: policy.retention.keepMs, ...snapshotColumns(context, record, snapshot), acquisitionId },
      );
    },
    "reconcile",
  );
}
