import http from "node:http";
import http2 from "node:http2";
import { readFileSync, statSync } from "node:fs";
import net from "node:net";
import tls from "node:tls";
import type { Logger } from "pino";
import type { TlsConfig } from "../config.js";
import type { Duplex } from "node:stream";
import type { PeerCertificate } from "./callers.js";
import type { GrpcLane } from "./grpc-lane.js";

/** A request handler usable by both http and http2 servers (connect-node's adapter is one). */
export type DualHandler = (req: http.IncomingMessage | http2.Http2ServerRequest, res: http.ServerResponse | http2.Http2ServerResponse) => void;

/** One port that answers HTTP/2 cleartext (gRPC, gRPC-Web, Connect) and HTTP/1.1 (Connect JSON, gRPC-Web, plain curl). */
export interface RpcListener {
  /** The address it is bound to, as the socket reports it (e.g. 127.0.0.1, 0.0.0.0, ::). */
  host: string;
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
export function listenRpc(
  handler: DualHandler,
  host: string,
  port: number,
  options: { tls?: { config: TlsConfig; logger: Logger }; grpcLane?: GrpcLane } = {},
): Promise<RpcListener> {
  const tlsOptions = options.tls;
  const h1 = http.createServer(handler as http.RequestListener);
  const h2 = http2.createServer({}, handler as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void);
  if (options.grpcLane) laneFirst(h2, options.grpcLane);
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

  const track = (socket: net.Socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.once("error", () => socket.destroy());
  };
  const toH1 = (socket: net.Socket) => {
    h1Active.set(socket, 0);
    socket.once("close", () => h1Active.delete(socket));
    h1.emit("connection", socket as Duplex);
  };
  // With TLS, ALPN says which protocol the client speaks.
  const tlsServer = tlsOptions ? tls.createServer(tlsServerOptions(tlsOptions.config)) : undefined;
  tlsServer?.on("secureConnection", (socket) => {
    track(socket);
    if (socket.alpnProtocol === "h2") h2.emit("connection", socket);
    else toH1(socket);
  });
  tlsServer?.on("tlsClientError", (error, socket) => {
    tlsOptions!.logger.debug({ error: error.message }, "TLS handshake refused");
    socket.destroy();
  });
  const stopReloading = tlsServer ? reloadOnChange(tlsServer, tlsOptions!.config, tlsOptions!.logger) : () => undefined;

  const tcp =
    tlsServer ??
    net.createServer((socket) => {
      track(socket);
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
        if (isHttp2) h2.emit("connection", socket as Duplex);
        else toH1(socket);
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
        host: address.address,
        port: address.port,
        closeGracefully() {
          closing = true;
          stopReloading();
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

/**
 * Offers each HTTP/2 stream to the gRPC lane before the compatibility layer
 * (the request and response objects `handler` takes). node:http2 serves that
 * layer from one "stream" listener of its own: it is taken out and called for
 * the streams the lane declines.
 */
export function laneFirst(server: http2.Http2Server, lane: GrpcLane): void {
  const [compatibility, ...others] = server.listeners("stream") as Array<(...args: unknown[]) => void>;
  if (!compatibility || others.length > 0 || compatibility.name !== "bound onServerStream") {
    throw new Error("node:http2 no longer serves its compatibility layer from one 'stream' listener (onServerStream): the gRPC lane cannot be put before it");
  }
  server.removeListener("stream", compatibility);
  server.on("stream", (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, ...rest: unknown[]) => {
    if (!lane(stream, headers)) compatibility.call(server, stream, headers, ...rest);
  });
}

function tlsServerOptions(config: TlsConfig): tls.TlsOptions {
  return {
    ...secureContextOptions(config),
    ALPNProtocols: ["h2", "http/1.1"],
    minVersion: "TLSv1.2",
    requestCert: config.clientCaFile !== undefined,
    rejectUnauthorized: config.clientCaFile !== undefined && config.requireClientCertificate,
  };
}

function secureContextOptions(config: TlsConfig): tls.SecureContextOptions {
  return {
    cert: readFileSync(config.certFile),
    key: readFileSync(config.keyFile),
    ...(config.clientCaFile ? { ca: readFileSync(config.clientCaFile) } : {}),
  };
}

/**
 * Polls the certificate, key and CA files; when one changed, the next
 * handshakes use the new ones (open connections keep theirs). A file caught
 * half-written or a mismatched pair leaves the working context in place.
 */
function reloadOnChange(server: tls.Server, config: TlsConfig, logger: Logger): () => void {
  const files = [config.certFile, config.keyFile, ...(config.clientCaFile ? [config.clientCaFile] : [])];
  const stamp = () => files.map((file) => statSync(file, { throwIfNoEntry: false })?.mtimeMs ?? 0).join();
  let last = stamp();
  const timer = setInterval(() => {
    const now = stamp();
    if (now === last) return;
    try {
      const options = secureContextOptions(config);
      tls.createSecureContext(options); // fails on a mismatched or half-written pair
      server.setSecureContext(options);
      last = now;
      logger.info({ files }, "TLS certificate, key and CA reloaded");
    } catch (error) {
      logger.warn({ error: (error as Error).message }, "TLS files changed but do not load; keeping the previous ones");
    }
  }, config.reloadMs);
  timer.unref();
  return () => clearInterval(timer);
}

/** The verified identities of a request's client certificate, when it came over mutual TLS. */
export function peerCertificateOf(socket: unknown): PeerCertificate | undefined {
  const tlsSocket = socket as Partial<tls.TLSSocket> | undefined;
  if (typeof tlsSocket?.getPeerCertificate !== "function") return undefined;
  const certificate = tlsSocket.getPeerCertificate();
  if (!certificate || Object.keys(certificate).length === 0) return undefined;
  const identities = (certificate.subjectaltname ?? "").split(", ").filter((name) => name.startsWith("URI:") || name.startsWith("DNS:"));
  const cn = certificate.subject?.CN;
  if (typeof cn === "string" && cn.length > 0) identities.push(`CN:${cn}`);
  return { authorized: tlsSocket.authorized === true, identities };
}
