import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { EventEmitter, on } from "node:events";
import type { Logger } from "pino";
import { systemClock, type Clock, type Timer } from "../clock.js";
import { Health, HealthCheckResponseSchema, HealthCheckResponse_ServingStatus as Status } from "../gen/grpc/health/v1/health_pb.js";

/**
 * Serving status per service name ("" is the server as a whole), as
 * grpc.health.v1 reports it. Shutdown flips everything to NOT_SERVING first,
 * so that load balancers stop sending new work while in-flight RPCs finish.
 */
export class HealthStatus {
  private readonly statuses = new Map<string, Status>();
  private readonly changes = new EventEmitter();

  constructor(services: readonly string[]) {
    this.changes.setMaxListeners(0);
    for (const service of ["", ...services]) this.statuses.set(service, Status.NOT_SERVING);
  }

  setAll(status: Status): void {
    for (const service of this.statuses.keys()) this.set(service, status);
  }

  set(service: string, status: Status): void {
    if (!this.statuses.has(service) || this.statuses.get(service) === status) return;
    this.statuses.set(service, status);
    this.changes.emit("change", service);
  }

  get(service: string): Status | undefined {
    return this.statuses.get(service);
  }

  service(): ServiceImpl<typeof Health> {
    const statusOf = (service: string) => create(HealthCheckResponseSchema, { status: this.get(service) ?? Status.SERVICE_UNKNOWN });
    const changes = this.changes;
    return {
      check: (req) => {
        if (this.get(req.service) === undefined) throw new ConnectError(`unknown service ${req.service}`, Code.NotFound);
        return statusOf(req.service);
      },
      async *watch(req, ctx) {
        // Listening starts before the first answer, so that a change made while it is on its way is not lost.
        const changed = on(changes, "change", { signal: ctx.signal });
        let last = statusOf(req.service);
        yield last;
        for await (const [service] of changed) {
          if (service !== req.service) continue;
          const next = statusOf(req.service);
          if (next.status !== last.status) yield (last = next);
        }
      },
    };
  }
}

/** How often the registry database is probed for readiness. */
export const READINESS_PROBE_INTERVAL_MS = 1000;

/** Upper bound of one probe: a database that stops answering counts as down after this long. */
export const READINESS_PROBE_TIMEOUT_MS = 1000;

/**
 * The one readiness of the server, behind both gRPC health (Check and Watch)
 * and /readyz: ready while no shutdown began and the registry database
 * answered the latest probe.
 *
 * The database is probed in the background, one probe at a time, every
 * READINESS_PROBE_INTERVAL_MS, and health checks read the last result: kubelets,
 * load balancers and Watch streams may ask as often as they like and the
 * database still sees one `SELECT 1` per interval per replica. Each probe is
 * bounded (see `probe`), so a database that hangs rather than refuses also
 * turns the server NOT_SERVING; a change shows within about one interval
 * plus that bound. The probe takes a pooled connection like any request: a
 * replica whose pool has none free within its connect timeout could not
 * serve a request either, and says so.
 *
 * A reader (IDEM_DB_READ_URL), when configured, is probed alongside and
 * reported, but never makes the server NOT_SERVING: while it does not
 * answer, its reads go to the registry database (readerDb).
 */
export class Readiness {
  private database = false;
  /** The reader answered the latest probe; undefined before the first, or without a reader. */
  private reader: boolean | undefined;
  private stopping = false;
  private timer: Timer | undefined;

  /**
   * `probe` resolves when the database answers and rejects otherwise; it must
   * bound itself (a query timeout) so that a hanging database rejects too.
   * `clock` says when the next probe is due. `probeReader`, bounded the same
   * way, probes the reader when there is one.
   */
  constructor(
    private readonly health: HealthStatus,
    private readonly probe: () => Promise<unknown>,
    private readonly logger: Logger,
    private readonly intervalMs = READINESS_PROBE_INTERVAL_MS,
    private readonly clock: Clock = systemClock,
    private readonly probeReader?: () => Promise<unknown>,
  ) {}

  /** Probes once, so that the server starts with a real answer, then keeps probing. */
  async start(): Promise<void> {
    await this.check();
  }

  /** Shutdown began: NOT_SERVING from now on, whatever the database says. */
  stop(): void {
    this.stopping = true;
    this.timer?.cancel();
    this.health.setAll(Status.NOT_SERVING);
  }

  /** No shutdown has begun. */
  get serving(): boolean {
    return !this.stopping;
  }

  /** The registry database answered the latest probe. */
  get databaseReachable(): boolean {
    return this.database;
  }

  /** The reader answered the latest probe; undefined without a reader. */
  get readerReachable(): boolean | undefined {
    return this.probeReader ? this.reader === true : undefined;
  }

  private async check(): Promise<void> {
    const [reachable] = await Promise.all([
      this.probe().then(
        () => true,
        (error: unknown) => {
          if (this.database) this.logger.warn({ error: (error as Error).message }, "the registry database does not answer: NOT_SERVING until it does");
          return false;
        },
      ),
      this.checkReader(),
    ]);
    if (this.stopping) return;
    if (reachable && !this.database) this.logger.info("the registry database answers: SERVING");
    this.database = reachable;
    this.health.setAll(reachable ? Status.SERVING : Status.NOT_SERVING);
    // The next probe never keeps a process alive on its own: the clock's timers are unref'd.
    this.timer = this.clock.setTimer(() => void this.check(), this.intervalMs);
  }

  /** Probes the reader, if any, and says when its answer changes (at start too: a reader down from the start is worth a line). */
  private async checkReader(): Promise<void> {
    if (!this.probeReader) return;
    const reachable = await this.probeReader().then(
      () => true,
      (error: unknown) => {
        if (this.reader !== false)
          this.logger.warn({ error: (error as Error).message }, "the registry's reader (IDEM_DB_READ_URL) cannot serve: its reads go to DATABASE_URL until it can");
        return false;
      },
    );
    if (reachable && this.reader !== true) this.logger.info("the registry's reader (IDEM_DB_READ_URL) answers: the reads that decide nothing go to it");
    this.reader = reachable;
  }
}
