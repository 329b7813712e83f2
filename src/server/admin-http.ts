import http from "node:http";
import type net from "node:net";
import type { Logger } from "pino";

/** What the admin port reports on. */
export interface AdminProbes {
  /** No shutdown has begun (false from the moment it does). */
  serving(): boolean;
  /** The registry database answers (the server's readiness probe: the same answer gRPC health gives). */
  databaseReachable(): Promise<boolean>;
  /** The reader (IDEM_DB_READ_URL) answers; undefined without one. Reported, never a reason to be not ready. */
  readerReachable?(): boolean | undefined;
  /** The Prometheus exposition of every metric. */
  metrics(): Promise<{ contentType: string; body: string }>;
}

/** More routes on the admin port (the operator console): true when it answered the request. */
export type AdminRoute = (req: http.IncomingMessage, res: http.ServerResponse, path: string) => Promise<boolean>;

export interface AdminServer {
  /** The address it is bound to, as the socket reports it. */
  host: string;
  port: number;
  close(): Promise<void>;
}

/**
 * The admin port, kept apart from the RPC port so that probes and scrapes
 * never compete with callers:
 * - `/healthz`: the process is alive (liveness);
 * - `/readyz`: it serves and its database answers (readiness, the same one
 *   grpc.health.v1 reports); 503 otherwise, including from the moment
 *   shutdown begins. With a reader, `reader` says whether it answers: its
 *   reads go to the database meanwhile, so it changes nothing of readiness;
 * - `/metrics`: Prometheus metrics;
 * - whatever `routes` answer (the operator console).
 */
export function listenAdmin(probes: AdminProbes, routes: AdminRoute[], host: string, port: number, logger: Logger): Promise<AdminServer> {
  const server = http.createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      logger.error({ err: error, path: req.url }, "admin request failed");
      if (!res.headersSent) reply(res, 500, { error: "internal error; the cause is logged" });
      else res.destroy();
    });
  });
  const handle = async (req: http.IncomingMessage, res: http.ServerResponse) => {
    const path = new URL(req.url ?? "/", "http://admin").pathname;
    if (path === "/healthz") return reply(res, 200, { status: "alive" });
    if (path === "/readyz") {
      const serving = probes.serving();
      const database = serving && (await probes.databaseReachable());
      const reader = probes.readerReachable?.();
      return reply(res, serving && database ? 200 : 503, {
        status: serving && database ? "ready" : "not ready",
        serving,
        database,
        ...(reader !== undefined ? { reader } : {}),
      });
    }
    if (path === "/metrics") {
      const { contentType, body } = await probes.metrics();
      res.writeHead(200, { "content-type": contentType, "cache-control": "no-store" });
      return res.end(body);
    }
    for (const route of routes) if (await route(req, res, path)) return;
    reply(res, 404, { error: "not found", paths: ["/healthz", "/readyz", "/metrics", "/console"] });
  };
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    // Exclusive: each of IDEM_WORKERS' processes answers on an admin port of its own, port 0 included (a
    // listen under node:cluster otherwise shares the primary's socket, one port for every worker).
    server.listen({ port, host, exclusive: true }, () => {
      server.removeListener("error", reject);
      const address = server.address() as net.AddressInfo;
      resolve({
        host: address.address,
        port: address.port,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            server.closeAllConnections();
          }),
      });
    });
  });
}

/** A JSON answer. */
export function reply(res: http.ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json", "cache-control": "no-store" });
  res.end(`${JSON.stringify(body)}\n`);
}
