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
  /** Resolves true once every connection has closed, false if some are still open after `ms`. */
  closed(ms: number): Promise<boolean>;
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
  // A response can end before its request was fully received (a refused
  // oversize message): tell the client to stop sending (RST_STREAM NO_ERROR,
  // RFC 9113 8.1) instead of leaving the stream open, and the session with it.
  h2.on("session", (session) => {
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
  });
  let closing = false;
  // HTTP/1.1 connections with no request in flight, which closing may end at once.
  // (http.Server tracks idle connections only for sockets it accepted itself.)
  const h1Active = new Map<net.Socket, number>();
  const endIfIdle = (socket: net.Socket) => {
    if (closing && (h1Active.get(socket) ?? 0) === 0) socket.end();
  };
  h1.on("request", (req: http.IncomingMessage, res: http.ServerResponse) => {
    const socket = req.socket;
    h1Active.set(socket, (h1Active.get(socket) ?? 0) + 1);
    // Responses written while closing tell the client to reconnect elsewhere.
    if (closing) res.setHeader("connection", "close");
    res.once("close", () => {
      h1Active.set(socket, (h1Active.get(socket) ?? 1) - 1);
      endIfIdle(socket);
    });
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
      if (!isHttp2) {
        h1Active.set(socket, 0);
        socket.once("close", () => h1Active.delete(socket));
      }
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
          for (const socket of h1Active.keys()) endIfIdle(socket);
        },
        destroy() {
          for (const socket of sockets) socket.destroy();
        },
        closed: async (ms) => {
          const deadline = Date.now() + ms;
          while (sockets.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
          return sockets.size === 0;
        },
      });
    });
  });
}
