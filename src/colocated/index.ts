/**
 * Co-located mode of the idempotency coordinator
 * (`idempotency-coordinator/colocated`): for a service whose tables live in
 * the registry's database, the registry's own state machine in-process, so
 * that Complete commits inside the service's business transaction. Give the
 * `ColocatedRegistry` to the gateway (`colocated` option of
 * `IdempotencyGateway` and `RecoveryWorker`). This entry loads the database
 * driver and the registry; the gateway entries load neither. See
 * docs/adopting.md, section 5.
 */
export { CommitUnknownError } from "../registry/db.js";
export type { SnapshotKeyring } from "../crypto/sealing.js";
export { ColocatedRegistry, snapshotKeysFromEnv, type ColocatedRegistryOptions } from "./registry.js";
