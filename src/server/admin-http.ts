import http from "node:http";
import type net from "node:net";

/** What the admin port reports on. */
export interface AdminProbes {
  /** The process is serving RPCs (false once shutdown began). */
  serving(): boolean;
  /** The registry database answers. */
  databaseReachable(): Promise<boolean>;
}

export interface AdminServer {
  port: number;
  close(): Promise<void>;
}

/**
 * The admin port, kept apart from the RPC port so that probes and scrapes
 * never compete with callers:
 * - `/healthz`: the process is alive (liveness);
 * - `/readyz`: it serves and its database answers (readiness); 503 otherwise,
 *   including from the moment shutdown begins.
 */
export function listenAdmin(probes: AdminProbes, host: string, port: number): Promise<AdminServer> {
  const server = http.createServer((req, res) => {
    const reply = (status: number, body: Record<string, unknown>) => {
      res.writeHead(status, { "content-type": "application/json", "cache-control": "no-store" });
      res.end(`${JSON.stringify(body)}\n`);
    };
    const path = new URL(req.url ?? "/", "http://admin").pathname;
    if (req.method !== "GET" && req.method !== "HEAD") return reply(405, { error: "use GET" });
    if (path === "/healthz") return reply(200, { status: "alive" });
    if (path === "/readyz") {
      void (async () => {
        const serving = probes.serving();
        const database = serving && (await probes.databaseReachable());
        reply(serving && database ? 200 : 503, { status: serving && database ? "ready" : "not ready", serving, database });
      })();
      return;
    }
    reply(404, { error: "not found", paths: ["/healthz", "/readyz"] });
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.removeListener("error", reject);
      resolve({
        port: (server.address() as net.AddressInfo).port,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            server.closeAllConnections();
          }),
      });
    });
  });
}
