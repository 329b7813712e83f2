import { randomUUID } from "node:crypto";
import { refuse } from "../../contract/errors.js";
import { policyOf, type RegistryContext } from "../context.js";
import type { Db } from "../db.js";
import { appendEvent, changeLocked, grantLease, lockRecord, lockWithAttempts, validateRef } from "../shared.js";
import * as recordStatements from "../statements/records.js";
import { checkRenew, planClaim } from "../state-machine.js";
import type { Actor, ClaimInput, ClaimResult, RenewLeaseInput, StoredRecord } from "../types.js";

/**
 * Claim and RenewLease: who executes a record, and for how long.
 */

/** Takes ownership for execution (OWNER, TAKEOVER or RECOVER). */
export async function claim(context: RegistryContext, db: Db, input: ClaimInput, actor: Actor): Promise<ClaimResult> {
  validateRef(input.ref);
  const acquisitionId = randomUUID();
  return db.transaction(
    input.ref.tenant,
    async (q) => {
      const { record, attempts } = await lockWithAttempts(q, input.ref, actor);
      // A re-run after a lost COMMIT: the claim already happened.
      if (record.acquisitionId === acquisitionId) return { record, attempts };
      const policy = await policyOf(context, record);
      if (input.mode !== "OWNER" && input.writerEpoch < policy.writerEpoch) {
        refuse("STALE_WRITER_EPOCH", `writer epoch ${input.writerEpoch} is older than the operation's epoch ${policy.writerEpoch}`, {
          writer_epoch: String(policy.writerEpoch),
        });
      }
      const leaseMs = grantLease(policy, input.leaseMs);
      const plan = planClaim(record, input.mode, input.generation);
      const by = { caller: actor.caller };
      const next = { leaseMs, acquisitionId, writerEpoch: input.writerEpoch };
      let updated: StoredRecord;
      switch (plan) {
        case "own":
          updated = await changeLocked(q, recordStatements.claimOwnership, record, by, { leaseMs });
          break;
        case "renew":
          updated = await changeLocked(q, recordStatements.renewLease, record, by, { leaseMs });
          break;
        case "takeover":
          updated = await changeLocked(q, recordStatements.claimTakeover, record, by, next);
          break;
        case "recover":
          if (record.state !== "UNKNOWN") {
            // Recorded as its own step so that the event log shows the record went UNKNOWN.
            await appendEvent(q, record, { ...by, kind: "UNKNOWN", state: "UNKNOWN" });
          }
          updated = await changeLocked(q, recordStatements.claimRecovery, record, by, next);
          break;
      }
      return { record: updated, attempts };
    },
    "claim",
  );
}

/** Extends the lease of the generation the caller holds. */
export async function renewLease(context: RegistryContext, db: Db, { ref, generation, leaseMs }: RenewLeaseInput, actor: Actor): Promise<StoredRecord> {
  validateRef(ref);
  return db.transaction(
    ref.tenant,
    async (q) => {
      const record = await lockRecord(q, ref, actor);
      checkRenew(record, generation);
      const policy = await policyOf(context, record);
      return changeLocked(q, recordStatements.renewLease, record, { caller: actor.caller }, { leaseMs: grantLease(policy, leaseMs) });
    },
    "renew_lease",
  );
}
