import { refuse } from "../contract/errors.js";
import { policyDigest, storedPolicyDocument, type PolicyDocument } from "../policy/document.js";
import type { PolicySnapshot, StoredPolicy } from "../policy/cache.js";
import { operationKey, type OperationControl } from "../policy/operations.js";
import { ALL_TENANTS, type Db } from "./db.js";
import * as policyStatements from "./statements/policies.js";

/** An operation's switches with who changed them last. */
export interface ControlRow extends OperationControl {
  operation: string;
  apiRevision: number;
  updatedAt: Date;
  updatedBy: string;
}

/** A change of an operation's switches by an operator (or the configuration). */
export interface ControlChange {
  operation: string;
  apiRevision: number;
  change: Partial<OperationControl>;
  updatedBy: string;
  /** Added to each event the change logs. */
  detail?: Record<string, unknown>;
}

/**
 * The operations' policies and switches in the registry (idem_policy,
 * idem_operation). Unlike the Registry's work, this never runs inside a
 * business service's transaction, so it holds its Db: the coordinator's
 * cross-tenant pool (the tables are shared by every tenant).
 */
export class PolicyStore {
  constructor(private readonly db: Db) {}

  /**
   * Publishes a validated revision. The operation's switch row is locked
   * first, so that concurrent publications of one operation are judged one
   * after the other: the revision must be higher than every published one,
   * or equal to one with the same digest (a repeated publication, which
   * changes nothing).
   */
  async publish(document: PolicyDocument, publishedBy: string): Promise<{ stored: StoredPolicy; created: boolean }> {
    const digest = Buffer.from(policyDigest(document));
    return this.db.transaction(ALL_TENANTS, async (q) => {
      const key = { operation: document.operation, apiRevision: document.apiRevision };
      await policyStatements.ensureOperation.run(q, { ...key, updatedBy: publishedBy });
      await policyStatements.lockOperation.run(q, key);
      const { rows } = await policyStatements.revisionsOf.run(q, key);
      const published = rows.map(toStored);
      const same = published.find((p) => p.document.schemaRevision === document.schemaRevision);
      if (same) {
        if (Buffer.from(same.digest).equals(digest)) return { stored: same, created: false };
        refuse(
          "POLICY_REVISION_EXISTS",
          `${document.operation} API revision ${document.apiRevision} schema revision ${document.schemaRevision} is already published with other rules; publish them as a higher revision`,
        );
      }
      const newest = published.at(-1)?.document.schemaRevision ?? 0;
      if (document.schemaRevision < newest) {
        refuse("POLICY_REVISION_NOT_NEWER", `schema revision ${document.schemaRevision} is lower than the newest published one (${newest}); revisions only grow`, {
          schema_revision: String(newest),
        });
      }
      const inserted = await policyStatements.insertPolicy.run(q, {
        ...key,
        schemaRevision: document.schemaRevision,
        document: JSON.stringify(document),
        digest,
        publishedBy,
      });
      return { stored: toStored(inserted.rows[0]!), created: true };
    });
  }

  /** Every published revision (of one operation, or of all), by operation, API revision, schema revision. */
  async list(operation?: string): Promise<StoredPolicy[]> {
    const { rows } = await this.db.transaction(ALL_TENANTS, (q) => policyStatements.listPolicies.run(q, { operation: operation ?? null }));
    return rows.map(toStored);
  }

  /** Every revision and every operation's switches: the tables are small, and read whole (the policy cache's load). */
  async load(): Promise<PolicySnapshot> {
    const [policies, controls] = await Promise.all([this.list(), this.listControls()]);
    return {
      policies,
      controls: new Map(controls.map((c) => [operationKey(c.operation, c.apiRevision), { mode: c.mode, writerEpoch: c.writerEpoch }])),
    };
  }

  /**
   * Sets an operation's mode and raises its writer epoch, and logs each
   * change as an event (MODE_SET, WRITER_EPOCH_RAISED) of the same
   * transaction: a change is never left without its event, and no event
   * tells of a change that did not happen. The epoch only grows: a lower one
   * is refused (WRITER_EPOCH_NOT_NEWER) and the one it already has changes
   * and logs nothing. A mode is logged each time it is set, even to the one
   * it had: an operator said so, and names itself in `updated_by`.
   */
  async setControl({ operation, apiRevision, change, updatedBy, detail = {} }: ControlChange): Promise<ControlRow & { changed: boolean }> {
    return this.db.transaction(ALL_TENANTS, async (q) => {
      // The row is locked before it is judged, so that concurrent changes are judged one after the other.
      await policyStatements.ensureOperation.run(q, { operation, apiRevision, updatedBy });
      const { rows } = await policyStatements.lockOperation.run(q, { operation, apiRevision });
      const current = rows[0]!;
      const epoch = Number(current.writer_epoch);
      if (change.writerEpoch !== undefined && change.writerEpoch < epoch) {
        refuse(
          "WRITER_EPOCH_NOT_NEWER",
          `the writer epoch of ${operation} API revision ${apiRevision} is ${epoch}; epochs only grow: raise it above ${epoch} to refuse writers deployed before`,
          { writer_epoch: String(epoch) },
        );
      }
      const events: Array<{ kind: string; detail: Record<string, unknown> }> = [];
      if (change.mode !== undefined) events.push({ kind: "MODE_SET", detail: { mode: change.mode, ...detail } });
      const raised = change.writerEpoch !== undefined && change.writerEpoch > epoch ? change.writerEpoch : undefined;
      if (raised !== undefined) events.push({ kind: "WRITER_EPOCH_RAISED", detail: { writerEpoch: raised, ...detail } });
      if (events.length === 0) {
        return { operation, apiRevision, mode: current.mode, writerEpoch: epoch, updatedAt: current.updated_at, updatedBy: current.updated_by, changed: false };
      }
      const changed = await policyStatements.changeControl.run(q, {
        operation,
        apiRevision,
        mode: change.mode ?? null,
        writerEpoch: raised ?? null,
        updatedBy,
        events: JSON.stringify(events),
      });
      const row = changed.rows[0]!;
      return { operation, apiRevision, mode: row.mode, writerEpoch: Number(row.writer_epoch), updatedAt: row.updated_at, updatedBy, changed: true };
    });
  }

  /** Every operation's switches, by operation and API revision. */
  async listControls(): Promise<ControlRow[]> {
    const { rows } = await this.db.transaction(ALL_TENANTS, (q) => policyStatements.listControls.run(q, {}));
    return rows.map((r) => ({
      operation: r.operation,
      apiRevision: r.api_revision,
      mode: r.mode,
      writerEpoch: Number(r.writer_epoch),
      updatedAt: r.updated_at,
      updatedBy: r.updated_by,
    }));
  }
}

/**
 * A stored revision as today's rules read it (see `storedPolicyDocument`).
 * When reading changed it, its digest is the digest of what is applied, so
 * that publishing the same revision again compares equal, and that
 * GetPolicy's digest matches the rules it shows.
 */
function toStored(row: policyStatements.PolicyRow): StoredPolicy {
  const document = storedPolicyDocument(row.document);
  return {
    document,
    digest: document === row.document ? row.digest : policyDigest(document),
    publishedAt: row.published_at,
    publishedBy: row.published_by,
  };
}
