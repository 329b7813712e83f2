import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";

export interface Listening {
  url: string;
  /** Stops listening and ends open keep-alive connections, so that close never waits on a client. */
  close(): Promise<void>;
}

/**
 * Serves `handle` on `host:port` (127.0.0.1 and a free port by default). When
 * `handle` throws, `onFailure` gets the error, and the response while nothing
 * of it has been sent (undefined after).
 */
export async function listen(
  handle: (req: IncomingMessage, res: ServerResponse) => Promise<unknown>,
  onFailure: (error: unknown, res: ServerResponse | undefined) => void,
  options: { port?: number; host?: string },
): Promise<Listening> {
  const sockets = new Set<Socket>();
  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => onFailure(error, res.headersSent ? undefined : res));
  });
  server.on("connection", (socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(options.port ?? 0, options.host ?? "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const socket of sockets) socket.destroy();
      }),
  };
}
