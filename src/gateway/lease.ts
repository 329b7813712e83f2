import { systemClock, type Clock, type Timer } from "../clock.js";
import type { CoordinatorClient } from "./client.js";
import { isLeaseLost, toCoordinatorError } from "./errors.js";
import type { GatewayLogger, OperationRef } from "./types.js";

/** The shortest pause between renewals, so that a tiny lease does not turn into a busy loop. */
const MIN_INTERVAL_MS = 100;

export interface LeaseKeeperOptions {
  client: Pick<CoordinatorClient, "renewLease">;
  ref: OperationRef;
  generation: number;
  /** The lease asked for on each renewal (undefined: the policy's default). */
  leaseMs: number | undefined;
  /** When the current lease ends, as granted. */
  expiresAt: Date | undefined;
  /** Called once when a renewal shows the lease is lost (with the refusal's reason). */
  onLost: (reason: string) => void;
  logger: GatewayLogger;
  /** The time it reads and waits on (tests give one they move by hand); default: the system clock. */
  clock?: Clock;
}

/**
 * Keeps an owner's lease alive while its handler runs long: renews at about
 * half the lease (the granted expiry minus now, halved, so that one failed
 * renewal still leaves time for another), and stops on `stop()` or when a
 * renewal shows the lease lost (isLeaseLost: someone took over, or the record
 * became UNKNOWN). A renewal that fails in transit is tried again sooner; the
 * lease only says who may act now, so missing one costs at most a takeover or
 * an UNKNOWN record, never a second effect.
 */
export class LeaseKeeper {
  private timer: Timer | undefined;
  private stopped = false;
  private expiresAt: Date | undefined;
  private readonly clock: Clock;
  /** Renewals that succeeded (observability and tests). */
  renewals = 0;

  constructor(private readonly options: LeaseKeeperOptions) {
    this.expiresAt = options.expiresAt;
    this.clock = options.clock ?? systemClock;
  }

  start(): void {
    this.schedule(this.halfLease());
  }

  stop(): void {
    this.stopped = true;
    this.timer?.cancel();
  }

  /** When the lease ends, as last granted. */
  get leaseExpiresAt(): Date | undefined {
    return this.expiresAt;
  }

  /**
   * Half of what is left of the lease: the granted expiry (database time)
   * minus now, bounded by the lease asked for, since the policy may grant
   * less than asked. Clocks of the gateway and the database should agree to
   * well within half a lease; NTP does much better.
   */
  private halfLease(): number {
    const granted = this.expiresAt ? this.expiresAt.getTime() - this.clock.now() : undefined;
    const asked = this.options.leaseMs;
    const remaining = granted !== undefined && asked !== undefined ? Math.min(granted, asked) : (granted ?? asked ?? 0);
    return Math.max(MIN_INTERVAL_MS, Math.floor(remaining / 2));
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    this.timer = this.clock.setTimer(() => void this.renew(), delayMs);
  }

  private async renew(): Promise<void> {
    if (this.stopped) return;
    const { client, ref, generation, leaseMs, logger } = this.options;
    try {
      const expiresAt = await client.renewLease({ ref, generation, ...(leaseMs !== undefined ? { leaseMs } : {}) });
      if (this.stopped) return;
      this.expiresAt = expiresAt ?? this.expiresAt;
      this.renewals++;
      this.schedule(this.halfLease());
    } catch (error) {
      if (this.stopped) return;
      const failure = toCoordinatorError(error);
      if (isLeaseLost(failure)) {
        logger.warn({ operationId: ref.operationId, generation, reason: failure.reason }, "lease lost: no new effect will start");
        this.stop();
        this.options.onLost(failure.reason);
        return;
      }
      logger.warn({ operationId: ref.operationId, generation, reason: failure.reason, error: failure.message }, "lease renewal failed; trying again");
      this.schedule(Math.max(MIN_INTERVAL_MS, Math.floor(this.halfLease() / 2)));
    }
  }
}
