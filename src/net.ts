import { createServer } from "node:net";
import { OperatorError } from "./operator-error.js";

/**
 * A loopback TCP port that nothing listens on at this moment: bound, then
 * released, so another process may still take it before its user binds it.
 * Only for programs that must be told their port before they listen: the
 * embedded PostgreSQL and PgBouncer start again on another when it was taken,
 * and the HA harness's engines (etcd, Patroni, HAProxy). A server of this
 * project listens on port 0 and reads its port back instead (IDEM_PORTS_FILE
 * for a coordinator process).
 */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

/**
 * The one-line report of a failure to listen on `host`:`port`, which
 * `variable` configures, or undefined when `error` is not one of those.
 */
export function listenFailure(error: unknown, host: string, port: number, variable: string): OperatorError | undefined {
  const { code, syscall } = (error ?? {}) as { code?: unknown; syscall?: unknown };
  // Only a failure of listen itself (EACCES also means an unreadable file, for instance).
  if (syscall !== "listen") return undefined;
  if (code === "EADDRINUSE") {
    return new OperatorError(`port ${port} is already in use on ${host} (${variable}): another coordinator may be running there; stop it or set ${variable} to a free port`);
  }
  if (code === "EACCES") return new OperatorError(`port ${port} on ${host} needs privileges this process lacks (${variable}): set ${variable} to a port above 1023`);
  if (code === "EADDRNOTAVAIL") return new OperatorError(`${host} is not an address of this machine (IDEM_HOST): set IDEM_HOST to one of its addresses, or 0.0.0.0`);
  return undefined;
}

/**
 * Fails with that report when `host`:`port` cannot be listened on right now;
 * port 0 (any free port) always can. Checked before anything else starts, so
 * that a second start on the same ports stops there; the real listen can
 * still lose a race and reports the same way.
 */
export function requireListenable(host: string, port: number, variable: string): Promise<void> {
  if (port === 0) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", (error) => reject(listenFailure(error, host, port, variable) ?? error));
    server.listen(port, host, () => server.close(() => resolve()));
  });
}
