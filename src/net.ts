import { createServer } from "node:net";

/**
 * A loopback TCP port that nothing listens on at this moment: bound, then
 * released. For the embedded PostgreSQL, child processes and throwaway
 * servers; another process may still take it before its user binds it.
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
