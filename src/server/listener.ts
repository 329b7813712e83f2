import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import type { Duplex } from "node:stream";

/** A request handler usable by both http and http2 servers (connect-node's adapter is one). */
export type DualHandler = (req: http.IncomingMessage | http2.Http2ServerRequest, res: http.ServerResponse | http2.Http2ServerResponse) => void;

/** One port that answers HTTP/2 cleartext (gRPC, gRPC-Web, Connect) and HTTP/1.1 (Connect JSON, gRPC-Web, plain curl). */
export interface RpcListener {
  port: number;
  /** Stops accepting connections and asks open ones to finish (HTTP/2 GOAWAY, HTTP/1.1 close after the response). */
  closeGracefully(): void;
  /** Ends every connection at once. */
  destroy(): void;
  /** Resolves once every connection has closed. */
  closed(): Promise<void>;
}

const HTTP2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");

/**
 * Cleartext HTTP/2 cannot be negotiated with ALPN, and Node's HTTP/2 server
 * does not answer HTTP/1.1. So a plain TCP server reads the first bytes of
 * each connection: the HTTP/2 client preface goes to the HTTP/2 server,
 * anything else to the HTTP/1.1 server, with those bytes put back unread.
 */
export function listenRpc(handler: DualHandler, host: string, port: number): Promise<RpcListener> {
  const h1 = http.createServer(handler as http.RequestListener);
  const h2 = http2.createServer({}, handler as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void);
  const sockets = new Set<net.Socket>();
  const sessions = new Set<http2.Http2Session>();
  h2.on("session", (session) => {
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
  });
  let closing = false;
  // HTTP/1.1 responses written while closing tell the client to reconnect elsewhere.
  h1.on("request", (_req, res: http.ServerResponse) => {
    if (closing) res.setHeader("connection", "close");
  });

  const tcp = net.createServer((socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.once("error", () => socket.destroy());
    let received = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      received = Buffer.concat([received, chunk]);
      const compared = Math.min(received.length, HTTP2_PREFACE.length);
      const isHttp2 = received.subarray(0, compared).equals(HTTP2_PREFACE.subarray(0, compared));
      // Wait for more bytes only while they could still be the HTTP/2 preface.
      if (isHttp2 && received.length < HTTP2_PREFACE.length) return;
      socket.removeListener("data", onData);
      socket.pause();
      socket.unshift(received);
      (isHttp2 ? h2 : h1).emit("connection", socket as Duplex);
      process.nextTick(() => socket.resume());
    };
    socket.on("data", onData);
  });

  return new Promise((resolve, reject) => {
    tcp.once("error", reject);
    tcp.listen(port, host, () => {
      tcp.removeListener("error", reject);
      const address = tcp.address() as net.AddressInfo;
      resolve({
        port: address.port,
        closeGracefully() {
          closing = true;
          tcp.close();
          for (const session of sessions) session.close();
          h1.closeIdleConnections();
        },
        destroy() {
          for (const socket of sockets) socket.destroy();
        },
        closed: () =>
          new Promise<void>((done) => {
            const check = () => (sockets.size === 0 ? done() : setTimeout(check, 20));
            check();
          }),
      });
    });
  });
}
