import type { Db } from "../db.js";
import { changeLocked, lockRecord, validateRef } from "../shared.js";
import * as recordStatements from "../statements/records.js";
import { planAbandon, planRelease } from "../state-machine.js";
import type { Actor, HolderInput, StoredRecord } from "../types.js";

/**
 * Release and Abandon: the holder hands the record back, or stops and
 * leaves it to recovery.
 */

/** Hands the reservation back without effect: RESERVED, no lease, fingerprint kept. */
export async function release(db: Db, { ref, generation }: HolderInput, actor: Actor): Promise<StoredRecord> {
  validateRef(ref);
  return db.transaction(
    ref.tenant,
    async (q) => {
      const record = await lockRecord(q, ref, actor);
      if (planRelease(record, generation) === "repeat") return record;
      return changeLocked(q, recordStatements.release, record, { caller: actor.caller }, {});
    },
    "release",
  );
}

/**
 * The owner stops now: released when nothing can have happened, otherwise
 * UNKNOWN at once with its lease ended, so that recovery starts without
 * waiting for the lease. Fenced by the generation like every write.
 */
export async function abandon(db: Db, { ref, generation }: HolderInput, actor: Actor): Promise<StoredRecord> {
  validateRef(ref);
  return db.transaction(
    ref.tenant,
    async (q) => {
      const record = await lockRecord(q, ref, actor);
      const by = { caller: actor.caller, detail: { abandoned: true } };
      switch (planAbandon(record, generation)) {
        case "repeat":
          return record;
        case "release":
          return changeLocked(q, recordStatements.release, record, by, {});
        case "unknown":
          return changeLocked(q, recordStatements.handToRecovery, record, by, {});
      }
    },
    "abandon",
  );
}
