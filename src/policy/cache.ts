import type { Logger } from "pino";
import { every, systemClock, type Clock, type Timer } from "../clock.js";
import type { PolicyDocument } from "./document.js";
import { DEFAULT_CONTROL, operationKey, RevisionIndex, toOperationPolicy, type OperationControl, type OperationPolicy, type PolicySource } from "./operations.js";

/** A published revision as stored. */
export interface StoredPolicy {
  document: PolicyDocument;
  digest: Uint8Array;
  publishedAt: Date;
  publishedBy: string;
}

/** Everything the cache holds: every revision, and every operation's switches. */
export interface PolicySnapshot {
  policies: StoredPolicy[];
  /** Keyed by `operationKey`. */
  controls: Map<string, OperationControl>;
}

export interface PolicyCacheOptions {
  /** Reads every revision and switch from the registry. */
  load: () => Promise<PolicySnapshot>;
  /** How often the cache re-reads: the bound on how long a new revision, mode or epoch takes to apply. */
  refreshMs: number;
  logger: Logger;
  /** When to re-read, and how recent the last read is. Default: the system clock. */
  clock?: Clock;
}

/**
 * The registry's policies, held in memory by every coordinator and re-read
 * every `refreshMs`, so that a revision published (or a mode changed) through
 * any replica applies on all of them within that bound, without a restart.
 * An operation not (yet) known triggers an immediate re-read, at most once
 * per `refreshMs / 4`, so that a just-published operation is served at once;
 * a revision of a stored record not known yet always does, so that the record
 * is judged under it.
 */
export class PolicyCache implements PolicySource {
  private index = new RevisionIndex([]);
  private loadedAt = 0;
  private loading: Promise<void> | undefined;
  private timer: Timer | undefined;
  private readonly clock: Clock;

  constructor(private readonly options: PolicyCacheOptions) {
    this.clock = options.clock ?? systemClock;
  }

  /** Loads once, then keeps refreshing in the background until `stop`. */
  async start(): Promise<void> {
    await this.refresh();
    this.timer = every(this.clock, this.options.refreshMs, () => {
      this.refresh().catch((error: unknown) => this.options.logger.warn({ error: (error as Error).message }, "policy refresh failed; serving the policies loaded before"));
    });
  }

  stop(): void {
    this.timer?.cancel();
  }

  /** Re-reads the registry now (concurrent callers share one read). */
  refresh(): Promise<void> {
    this.loading ??= this.options
      .load()
      .then((snapshot) => {
        this.index = new RevisionIndex(
          snapshot.policies.map(({ document }) => toOperationPolicy(document, snapshot.controls.get(operationKey(document.operation, document.apiRevision)) ?? DEFAULT_CONTROL)),
        );
        this.loadedAt = this.clock.now();
      })
      .finally(() => (this.loading = undefined));
    return this.loading;
  }

  async current(operation: string, apiRevision: number): Promise<OperationPolicy | undefined> {
    await this.refreshIfUnknown(operation, apiRevision);
    return this.index.current(operation, apiRevision);
  }

  async revision(operation: string, apiRevision: number, schemaRevision: number): Promise<OperationPolicy | undefined> {
    // A stored record names a published revision: when it is missing here, this
    // cache read before another replica published it, so read again at once.
    const known = this.index.revision(operation, apiRevision, schemaRevision);
    if (known) return known;
    await this.refresh();
    return this.index.revision(operation, apiRevision, schemaRevision);
  }

  /** Re-reads for an unknown operation, unless the last read is very recent (a flood of unknown names costs one read per quarter interval). */
  private async refreshIfUnknown(operation: string, apiRevision: number): Promise<void> {
    if (!this.index.has(operation, apiRevision) && this.clock.now() - this.loadedAt > this.options.refreshMs / 4) await this.refresh();
  }
}
