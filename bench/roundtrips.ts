/**
 * Round trips to PostgreSQL per RPC, counted two ways:
 *  - on the wire, by a TCP proxy between the coordinator and PostgreSQL that
 *    reads the frontend protocol: every simple Query message ('Q') and every
 *    Sync ('S', which ends an extended-protocol exchange) is one round trip:
 *    the client waits for the answer before it sends anything else;
 *  - as statements, by pg_stat_statements (top-level, BEGIN and COMMIT
 *    included), which also says which statements they are and how long
 *    PostgreSQL spent executing them.
 * The two differ when one message carries several statements.
 */
import { createServer, connect, type Server, type Socket } from "node:net";

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;

export interface WireCounts {
  /**
   * Times a client waited for the server: a Query ('Q') or Sync ('S') sent
   * while none of its earlier ones was still unanswered (no ReadyForQuery
   * pending). Pipelined messages share their round trip.
   */
  roundTrips: number;
  simpleQueries: number;
  syncs: number;
  /** Connections opened through the proxy. */
  connections: number;
  /** Connections that switched to TLS: their messages cannot be counted. */
  encrypted: number;
}

/** A TCP proxy in front of PostgreSQL that counts the round trips its clients make. */
export class CountingProxy {
  private counts: WireCounts = { roundTrips: 0, simpleQueries: 0, syncs: 0, connections: 0, encrypted: 0 };
  private readonly sockets = new Set<Socket>();

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(target: { host: string; port: number }): Promise<CountingProxy> {
    let proxy: CountingProxy | undefined;
    const server = createServer((client) => proxy!.relay(client, target));
    const port = await new Promise<number>((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => {
        const address = server.address();
        if (typeof address === "object" && address) resolve(address.port);
        else reject(new Error("the counting proxy has no port"));
      });
    });
    proxy = new CountingProxy(server, port);
    return proxy;
  }

  /** The counts since the last reset. */
  read(): WireCounts {
    return { ...this.counts };
  }

  reset(): void {
    this.counts = { roundTrips: 0, simpleQueries: 0, syncs: 0, connections: 0, encrypted: 0 };
  }

  /** `url` with its host and port replaced by the proxy's. */
  url(url: string): string {
    const u = new URL(url);
    u.hostname = "127.0.0.1";
    u.port = String(this.port);
    return u.toString();
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private relay(client: Socket, target: { host: string; port: number }): void {
    const upstream = connect(target.port, target.host);
    this.sockets.add(client);
    this.sockets.add(upstream);
    this.counts.connections++;
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    let buffer: Buffer = Buffer.alloc(0);
    let typed = false; // after the startup message, every message starts with its type byte
    let awaitingSslAnswer = false;
    let encrypted = false;
    // Query and Sync messages sent whose ReadyForQuery ('Z') has not come back yet.
    let unanswered = 0;
    client.on("data", (chunk: Buffer) => {
      upstream.write(chunk);
      if (encrypted) return;
      buffer = buffer.length ? Buffer.concat([buffer, chunk]) : chunk;
      for (;;) {
        if (!typed) {
          if (buffer.length < 8) break;
          const length = buffer.readInt32BE(0);
          if (buffer.length < length) break;
          const code = buffer.readInt32BE(4);
          buffer = buffer.subarray(length);
          if (code === SSL_REQUEST || code === GSSENC_REQUEST) awaitingSslAnswer = true;
          else typed = true;
          continue;
        }
        if (buffer.length < 5) break;
        const length = buffer.readInt32BE(1);
        if (buffer.length < 1 + length) break;
        const type = String.fromCharCode(buffer[0]!);
        buffer = buffer.subarray(1 + length);
        if (type === "Q" || type === "S") {
          if (type === "Q") this.counts.simpleQueries++;
          else this.counts.syncs++;
          if (unanswered === 0) this.counts.roundTrips++;
          unanswered++;
        }
      }
    });
    let answers: Buffer = Buffer.alloc(0);
    upstream.on("data", (chunk: Buffer) => {
      client.write(chunk);
      if (awaitingSslAnswer) {
        awaitingSslAnswer = false;
        // 'S': the server accepted TLS (or GSS): what follows is encrypted.
        if (chunk[0] === 0x53 || chunk[0] === 0x47) {
          encrypted = true;
          this.counts.encrypted++;
        }
        // 'N': refused, plain messages follow that one byte.
        chunk = chunk.subarray(1);
      }
      if (encrypted) return;
      answers = answers.length ? Buffer.concat([answers, chunk]) : chunk;
      while (answers.length >= 5) {
        const length = answers.readInt32BE(1);
        if (answers.length < 1 + length) break;
        if (answers[0] === 0x5a) unanswered = Math.max(0, unanswered - 1);
        answers = answers.subarray(1 + length);
      }
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
      this.sockets.delete(client);
      this.sockets.delete(upstream);
    };
    client.on("close", end);
    upstream.on("close", end);
    client.on("error", end);
    upstream.on("error", end);
  }
}
