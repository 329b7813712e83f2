import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { EventEmitter, on } from "node:events";
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

  get serving(): boolean {
    return this.statuses.get("") === Status.SERVING;
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
        let last = statusOf(req.service);
        yield last;
        for await (const [service] of on(changes, "change", { signal: ctx.signal })) {
          if (service !== req.service) continue;
          const next = statusOf(req.service);
          if (next.status !== last.status) yield (last = next);
        }
      },
    };
  }
}
