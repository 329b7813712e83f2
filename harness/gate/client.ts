import http from "node:http";

/** At most `limit` holders at once; waiters are served first come, first served. */
export class Semaphore {
  private held = 0;
  private readonly waiters: Array<() => void> = [];
  constructor(private readonly limit: number) {}
  get inUse(): number {
    return this.held;
  }
  get waiting(): number {
    return this.waiters.length;
  }
  acquire(): Promise<void> {
    if (this.held < this.limit) {
      this.held++;
      return Promise.resolve();
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }
  release(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.held--;
  }
}

export interface HttpAnswer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/**
 * POSTs over keep-alive connections (node:http: cheaper per request than
 * fetch, which matters when the load generator shares two cores with
 * everything it measures). A timeout destroys the request: the caller sees an
 * error and retries, as a real client would.
 */
export class HttpClient {
  private readonly agent: http.Agent;
  private readonly host: string;
  private readonly port: number;

  constructor(
    baseUrl: string,
    maxSockets: number,
    private readonly timeoutMs: number,
  ) {
    const url = new URL(baseUrl);
    this.host = url.hostname;
    this.port = Number(url.port);
    this.agent = new http.Agent({ keepAlive: true, maxSockets, maxFreeSockets: maxSockets });
  }

  post(path: string, headers: Record<string, string>, body: Buffer): Promise<HttpAnswer> {
    return new Promise((resolve, reject) => {
      const req = http.request(
        { host: this.host, port: this.port, path, method: "POST", agent: this.agent, headers: { ...headers, "content-length": String(body.length) } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (chunk: Buffer) => chunks.push(chunk));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
          res.on("error", reject);
          res.on("aborted", () => reject(new Error("response aborted")));
        },
      );
      req.setTimeout(this.timeoutMs, () => req.destroy(Object.assign(new Error(`no answer within ${this.timeoutMs} ms`), { code: "CLIENT_TIMEOUT" })));
      req.on("error", reject);
      req.end(body);
    });
  }

  close(): void {
    this.agent.destroy();
  }
}
