import { hostname } from "node:os";
import { randomBytes } from "node:crypto";
import type { Logger } from "pino";
import { every, systemClock, type Clock, type Timer } from "../clock.js";
import type { Db } from "../registry/db.js";
import type { Registry } from "../registry/registry.js";

/**
 * A new name for a coordinator on job leases (host, process, and a random
 * part, so that two coordinators in one process are two holders): which
 * replica runs a job is visible in idem_job_lease.
 */
export function jobHolder(): string {
  return `${hostname()}:${process.pid}:${randomBytes(3).toString("hex")}`;
}

/**
 * A background job that one replica at a time runs every `intervalMs`: each
 * tick renews (or takes) the job's lease row, and only its holder runs. When
 * the holder dies, its lease ends after three intervals and another replica
 * takes over. Nothing here touches the request path.
 */
export class BackgroundJob {
  private timer: Timer | undefined;
  private running: Promise<void> = Promise.resolve();
  private stopped = false;

  constructor(
    private readonly options: {
      name: string;
      /** This coordinator's name on the lease (jobHolder). */
      holder: string;
      intervalMs: number;
      registry: Registry;
      db: Db;
      logger: Logger;
      run: () => Promise<void>;
      /** When each tick is due. Default: the system clock. */
      clock?: Clock;
    },
  ) {}

  start(): void {
    this.timer = every(this.options.clock ?? systemClock, this.options.intervalMs, () => {
      // One tick at a time: a slow pass delays the next instead of overlapping it.
      this.running = this.running.then(() => this.tick());
    });
  }

  /** Stops ticking, waits for the pass under way, and hands the lease over at once. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.timer?.cancel();
    await this.running;
    await this.options.registry.releaseJobLease(this.options.db, { job: this.options.name, holder: this.options.holder }).catch(() => undefined);
  }

  private async tick(): Promise<void> {
    if (this.stopped) return;
    const { name, holder, intervalMs, registry, db, logger, run } = this.options;
    try {
      if (await registry.holdJobLease(db, { job: name, holder, ttlMs: intervalMs * 3 })) await run();
    } catch (error) {
      logger.warn({ job: name, error: (error as Error).message }, "background job pass failed; it runs again next interval");
    }
  }
}
